"""Model <-> spec correspondence: traces of the Python reference model, checked by TLC.

A `TraceRecorder` wraps a `ReferenceModel` (configured as the spec abstracts it: page
size 1, one token per batch item, at most one attach per item, tier intents only in a
plan, one or two intents per `submit`) and records every call as a trace step: the TLA+
action name, its arguments as TLA+ values (handles, plans and intents as records with
the spec's field names), whether the call succeeded and, if it did, the whole model state
after it, projected onto the variable groups of `tla/CacheRuntime.tla`.
Transfers that a call completes implicitly (the restores `execute_batch` waits for,
everything `wait_completions` drains) are recorded first as explicit `CompleteTransfer`
steps, in the order the model completes them: in the spec those calls are enabled only
once nothing they wait for is in flight.

The environment's failures are steps too, when the model offers them: `fail_transfer`
(FailTransfer), `fail_compute` (FailCompute) and `lose` (RuntimeLost). A call that
raises `ComputeFailed` changed the state (the batches failed) and is recorded as a step
taken, not as a failed call; while the model is lost every call but `restart` raises
`RuntimeFault` and is a failed call (the spec's action is not enabled).

`trace_module` turns many traces into one module `TraceCheck` whose initial state picks
a trace and whose next-state relation replays it: a successful step must be the named
action with the recorded arguments and lead to exactly the recorded state; a failed
step must find the action not enabled (H1 and atomicity: nothing changes). A trace that
the spec cannot follow deadlocks TLC at the step before the first divergence, which
`validate` reports.

Run it: `python -m cacheruntime.tlatrace --traces 60 --steps 40`.
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

from cacheruntime import specfiles
from cacheruntime.model import Batch, ReferenceModel
from cacheruntime.protocol import (
    Backup,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    ComputeFailed,
    Demote,
    Drop,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    Restore,
    Tier,
    TierIntent,
)
from cacheruntime.tlatools import find_jar, tlc_java

TLA_DIR = specfiles.tla_dir()


@dataclass(frozen=True)
class Bounds:
    """The constants of the trace model (and of the Python model the traces run on)."""

    MaxRequests: int = 3
    L1Pages: int = 6
    L2Pages: int = 4
    MaxRequestTokens: int = 4
    MaxNames: int = 14
    MaxExtents: int = 8
    MaxBatches: int = 10
    MaxTransfers: int = 8
    MaxGeneration: int = 6
    MaxEpoch: int = 2
    MaxRefcount: int = 3
    # bounds of `Next` only: the trace check replays the recorded actions, whatever they carry
    PlanIntentKinds: frozenset[str] = frozenset({"Restore", "Backup", "Demote", "Drop"})
    MaxSubmitIntents: int = 2
    Faults: bool = True

    def cfg_constants(self) -> str:
        return "\n".join(f"    {k} = {tla(v)}" for k, v in self.__dict__.items())


# -- TLA+ values ---------------------------------------------------------------------


def tla(value) -> str:
    """A Python value as a TLA+ expression: tuples are sequences, sets sets, bools booleans."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, (tuple, list)):
        return "<<" + ", ".join(tla(v) for v in value) + ">>"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(tla(v) for v in sorted(value)) + "}"
    if isinstance(value, dict):
        return "[" + ", ".join(f"{k} |-> {tla(v)}" for k, v in value.items()) + "]"
    if isinstance(value, Raw):
        return value.text
    raise TypeError(f"no TLA+ form for {value!r}")


class HasTla(Protocol):
    """A trace step that writes itself as a TLA+ record."""

    def tla(self) -> str: ...


@dataclass(frozen=True)
class Raw:
    """A TLA+ expression written out already."""

    text: str


def f0(values) -> Raw:
    """A function with domain 0 .. len-1 (the spec's slot, name and page domains)."""
    return Raw("F0(" + tla(tuple(values)) + ")")


def req(h: RequestRuntimeHandle) -> dict:
    """A request handle as the spec's record (RequestHandles)."""
    return {"epoch": h.epoch, "slotId": h.slot_id, "generation": h.generation}


def xref(x: CacheExtentRef) -> dict:
    """An extent ref as the spec's record (ExtentRefs)."""
    return {"epoch": x.epoch, "generation": x.generation}


def bref(b: PreparedBatchHandle) -> dict:
    """A batch handle as the spec's record (BatchHandles)."""
    return {"epoch": b.epoch, "batchId": b.batch_id}


#: The tier intents the spec models, by kind: the same names in both.
INTENTS: dict[str, type[TierIntent]] = {"Backup": Backup, "Restore": Restore, "Demote": Demote, "Drop": Drop}


def intent(i: TierIntent) -> dict:
    """A tier intent as the spec's record: [kind, extent]."""
    return {"kind": type(i).__name__, "extent": xref(i.extent)}


# -- recording -----------------------------------------------------------------------


@dataclass
class Step:
    op: str
    args: tuple
    ok: bool
    post: str | None  # the TLA+ value of `vars` after the step (None if it failed)
    note: str = ""

    def tla(self) -> str:
        post = self.post if self.ok else "<<>>"
        return f'[op |-> "{self.op}", args |-> {tla(self.args)}, ok |-> {tla(self.ok)}, post |-> {post}]'


#: The variable groups of `tla/CacheRuntime.tla`, in the order of its `vars` tuple, each
#: with its variables in the order of the group's tuple. Named as the model's record
#: fields (spec/glossary.md); `project` gives one value per variable.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("runtimeVars", ("epoch", "lost")),
    ("requestVars", ("generation", "live", "pages", "numTokens")),
    ("pageVars", ("holders", "versions", "nextPage")),
    ("copyVars", ("state1", "phys1", "state2", "phys2")),
    ("poolVars", ("free1", "free2", "deferred1", "deferred2")),
    ("memoryVars", ("tags1", "tags2", "nextVersion")),
    ("extentVars", ("extents", "nextExtent", "held")),
    ("batchVars", ("batches", "nextBatch")),
    ("transferVars", ("transfers", "inflight", "nextTransfer", "unreported", "reported")),
)
VARIABLES = tuple(v for _, group in GROUPS for v in group)


def project(model: ReferenceModel, b: Bounds, prepared: dict[int, Batch], held: dict[int, int], reported: set[int]) -> str:
    """The model's state as the TLA+ value of `vars` of CacheRuntime.tla: a tuple of groups.

    `prepared` holds every batch of the epoch as it was prepared: the spec keeps a finished
    batch's items and lengths, the model only its outcome (`State.finished`).
    """
    st = model.state
    pages = st.pages

    def copy_state(n: int, tier: Tier) -> str:
        page = pages.get(n)
        return page.copies[tier].state.value if page and tier in page.copies else "absent"

    def phys(n: int, tier: Tier) -> int:
        page = pages.get(n)
        return page.copies[tier].phys if page and tier in page.copies else -1

    for slot in st.slots:
        assert slot.reserved_tokens == len(slot.pages), "page_size 1: reserved tokens are pages"
    names = range(b.MaxNames)
    pools = {tier: st.pools[tier] for tier in Tier}
    batches = []
    for bid in range(b.MaxBatches):
        rec = prepared[bid] if bid in st.batches or bid in st.finished else None
        if rec is None:
            batches.append({"state": "none", "slots": (), "startTokens": (), "ends": (), "intents": ()})
        else:
            batches.append(
                {
                    "state": st.finished[bid][0] if bid in st.finished else rec.state,
                    "slots": rec.slots,
                    "startTokens": rec.start_tokens,
                    "ends": rec.ends,
                    "intents": tuple(intent(i) for i in rec.plan.intents if not isinstance(i, Restore)),
                }
            )
    transfers = []
    for tid in range(b.MaxTransfers):
        t = st.transfers.get(tid)
        if t is None:
            transfers.append({"kind": "none", "pages": (), "waitsFor": set()})
        else:
            moves = tuple({"name": name, "src": src, "dst": dst} for name, src, dst in t.pages)
            transfers.append({"kind": t.kind.value, "pages": moves, "waitsFor": set(t.waits_for)})
    values = {
        "epoch": st.epoch,
        "lost": bool(getattr(st, "lost", False)),
        "generation": f0(s.generation for s in st.slots),
        "live": f0(s.live for s in st.slots),
        "pages": f0(tuple(s.pages) for s in st.slots),
        "numTokens": f0(s.num_tokens for s in st.slots),
        "holders": f0(pages[n].holders if n in pages else 0 for n in names),
        "versions": f0(pages[n].versions[0] if n in pages else 0 for n in names),
        "nextPage": st.next_page,
        "state1": f0(copy_state(n, Tier.L1) for n in names),
        "phys1": f0(phys(n, Tier.L1) for n in names),
        "state2": f0(copy_state(n, Tier.L2) for n in names),
        "phys2": f0(phys(n, Tier.L2) for n in names),
        "free1": tuple(pools[Tier.L1].free),
        "free2": tuple(pools[Tier.L2].free),
        "deferred1": f0(set(pools[Tier.L1].deferred.get(p, ())) for p in range(pools[Tier.L1].total)),
        "deferred2": f0(set(pools[Tier.L2].deferred.get(p, ())) for p in range(pools[Tier.L2].total)),
        "tags1": f0(c[0] for c in pools[Tier.L1].tags),
        "tags2": f0(c[0] for c in pools[Tier.L2].tags),
        "nextVersion": st.next_version,
        "extents": tuple(
            {"refcount": st.extents[g].refcount, "pages": tuple(st.extents[g].pages)} if g in st.extents else {"refcount": 0, "pages": ()}
            for g in range(1, b.MaxExtents + 1)
        ),
        "nextExtent": st.next_extent,
        "held": tuple(held.get(g, 0) for g in range(1, b.MaxExtents + 1)),  # the spec's ghost: control's own count
        "batches": f0(batches),
        "nextBatch": st.next_batch,
        "transfers": f0(transfers),
        "inflight": set(st.transfers),
        "nextTransfer": st.next_transfer,
        "unreported": tuple({"transferId": c.ticket.transfer_id, "failure": failure(c)} for c in st.unreported),
        "reported": set(reported),  # the spec's ghost: what the polls handed control
    }
    assert set(values) == set(VARIABLES), "one value per variable of the spec"
    grouped = [tuple(values[v] for v in members) for _, members in GROUPS]
    return tla(tuple(grouped))


def failure(completion) -> str:
    """A completion's failure as the spec's word: "none" (landed) or the `TransferFailure` value."""
    cause = getattr(completion, "failure", None)
    return "none" if cause is None else cause.value


def is_lost(model: ReferenceModel) -> bool:
    """Whether the model's machinery is gone (RuntimeLost): every call but restart raises."""
    return bool(getattr(model.state, "lost", False))


def in_bounds(model: ReferenceModel, b: Bounds) -> bool:
    """Whether the model's counters stay inside the spec's finite id sets."""
    st = model.state
    return (
        st.next_page <= b.MaxNames
        and st.next_extent <= b.MaxExtents + 1
        and st.next_batch <= b.MaxBatches
        and st.next_transfer <= b.MaxTransfers
        and st.epoch <= b.MaxEpoch
        and all(s.generation <= b.MaxGeneration for s in st.slots)
        and all(e.refcount <= b.MaxRefcount for e in st.extents.values())
    )


class TraceRecorder:
    """A ReferenceModel whose calls are recorded as TLA+ trace steps."""

    def __init__(self, bounds: Bounds = Bounds(), model: ReferenceModel | None = None):
        self.bounds = bounds
        self.model = model or ReferenceModel(
            runtime_id="model",
            page_size=1,
            max_requests=bounds.MaxRequests,
            max_request_tokens=bounds.MaxRequestTokens,
            l1_pages=bounds.L1Pages,
            l2_pages=bounds.L2Pages,
        )
        self.steps: list[Step] = []
        self.prepared: dict[int, Batch] = {}  # batch id -> its record as prepared, this epoch
        #: References control holds by its own account of the calls that succeeded (extent
        #: generation -> count): the spec's ghost `held`, kept apart from the model's refcounts.
        self.held: dict[int, int] = {}
        #: Transfers of this epoch whose completion a poll (or wait) handed control: the spec's
        #: ghost `reported`, from the calls' results.
        self.reported: set[int] = set()

    def _do(self, op: str, args: tuple, call, strict: bool = True, account=None):
        """Run `call(model)`; keep the step if the model stays in bounds. Returns (ok, result).

        `account(result)` updates control's count of references once the call succeeded."""
        saved = copy.deepcopy(self.model.state)
        try:
            result = call(self.model)
            ok = True
        except ComputeFailed as failed:  # committed: the batches failed
            result, ok = failed, True
        except (CacheRuntimeError, ValueError) as error:
            result, ok = error, False
        if ok and not in_bounds(self.model, self.bounds):
            self.model.state = saved
            return False, None
        if ok:
            self.model.check_invariants()
            self.prepared.update(self.model.state.batches)
            if account is not None:
                account(result)
        post = project(self.model, self.bounds, self.prepared, self.held, self.reported) if ok else None
        self.steps.append(Step(op, args, ok, post, note=repr(result)[:120]))
        return ok, result

    def _complete_first(self, transfer_ids) -> None:
        for t in transfer_ids:
            self._do("CompleteTransfer", (t,), lambda m, t=t: m.complete_transfer(t))

    # -- the operations -----------------------------------------------------------------

    def open_request(self):
        return self._do("OpenRequest", (), lambda m: m.open_request())

    def close_request(self, h):
        return self._do("CloseRequest", (req(h),), lambda m: m.close_request(h))

    def prepare_batch(self, items: list[tuple[RequestRuntimeHandle, CacheExtentRef | None]], intents: tuple[TierIntent, ...] = (), token: int = 7):
        plan = BatchPlan(tuple(BatchItem(h, (token,), attach=() if x is None else (x,)) for h, x in items), intents)
        arg = {
            "items": tuple({"request": req(h), "attach": () if x is None else (xref(x),)} for h, x in items),
            "intents": tuple(intent(i) for i in intents),
        }
        return self._do("PrepareBatch", (arg,), lambda m: m.prepare_batch(plan))

    def _await_first(self, call) -> None:
        """Record as CompleteTransfer steps the restores `call` (an execute) completes first (O1)."""
        probe = copy.deepcopy(self.model)
        before = len(probe.state.unreported)
        try:
            call(probe)
        except ComputeFailed:  # committed: the restores it waited for completed
            pass
        except CacheRuntimeError:
            return
        self._complete_first([c.ticket.transfer_id for c in probe.state.unreported[before:]])

    def execute_batch(self, bh):
        self._await_first(lambda m: m.execute_batch(bh))
        return self._do("ExecuteBatch", (bref(bh),), lambda m: m.execute_batch(bh))

    def fail_compute(self, bh):
        self._await_first(lambda m: m.fail_compute(bh))
        return self._do("FailCompute", (bref(bh),), lambda m: m.fail_compute(bh))

    def cancel_batch(self, bh):
        return self._do("CancelBatch", (bref(bh),), lambda m: m.cancel_batch(bh))

    def _count(self, generation: int, by: int) -> None:
        self.held[generation] = self.held.get(generation, 0) + by

    def publish(self, h, first, count):
        return self._do("Publish", (req(h), first, count), lambda m: m.publish(h, first, count), account=lambda x: self._count(x.generation, 1))

    def split(self, x, at):
        def account(halves) -> None:
            self._count(x.generation, -1)
            for half in halves:
                self._count(half.generation, 1)

        return self._do("Split", (xref(x), at), lambda m: m.split(x, at), account=account)

    def retain(self, x):
        return self._do("Retain", (xref(x),), lambda m: m.retain(x), account=lambda _: self._count(x.generation, 1))

    def release(self, x):
        return self._do("Release", (xref(x),), lambda m: m.release(x), account=lambda _: self._count(x.generation, -1))

    def submit(self, intents: tuple[TierIntent, ...]):
        """One intent is its own action (SubmitBackup, ...); two are `Submit(<<i, j>>)`."""
        if len(intents) == 1:
            return self._do("Submit" + type(intents[0]).__name__, (xref(intents[0].extent),), lambda m: m.submit(intents))
        return self._do("Submit", (tuple(intent(i) for i in intents),), lambda m: m.submit(intents))

    def _reported(self, done) -> None:
        self.reported.update(c.ticket.transfer_id for c in done)

    def poll_completions(self):
        return self._do("PollCompletions", (), lambda m: m.poll_completions(), account=self._reported)

    def wait_completions(self):
        while self.model.state.transfers and not is_lost(self.model):
            before = len(self.steps)
            self._complete_first([self.model.completable()[0]])
            if len(self.steps) == before:
                return False, None
        return self._do("WaitCompletions", (), lambda m: m.wait_completions(), account=self._reported)

    def restart(self):
        """The model drains in-flight transfers on restart: recorded as CompleteTransfer steps first
        (a lost model abandons them instead)."""
        while self.model.state.transfers and not is_lost(self.model):
            before = len(self.steps)
            self._complete_first([self.model.completable()[0]])
            if len(self.steps) == before:
                return False, None

        def account(_) -> None:
            self.held.clear()
            self.reported.clear()

        return self._do("Restart", (), lambda m: m.restart(), account=account)

    def complete_transfer(self, t):
        return self._do("CompleteTransfer", (t,), lambda m: m.complete_transfer(t))

    def fail_transfer(self, t):
        return self._do("FailTransfer", (t,), lambda m: m.fail_transfer(t))

    def lose(self):
        return self._do("RuntimeLost", (), lambda m: m.lose())


# -- random traces -------------------------------------------------------------------


def random_trace(seed: int, steps: int = 40, bounds: Bounds = Bounds()) -> list[Step]:
    """A random walk on the model: mostly sensible calls, some stale or invalid ones."""
    rng = random.Random(seed)
    rec = TraceRecorder(bounds)
    handles: list[RequestRuntimeHandle] = []
    extents: list[CacheExtentRef] = []
    batches: list[PreparedBatchHandle] = []

    def live_handles():
        st = rec.model.state
        return [h for h in handles if h.epoch == st.epoch and st.slots[h.slot_id].live and st.slots[h.slot_id].generation == h.generation]

    def live_extents():
        st = rec.model.state
        return [x for x in extents if x.epoch == st.epoch and x.generation in st.extents]

    def pick(xs, fresh, stale_rate=0.15):
        if xs and (not fresh or rng.random() < stale_rate):
            return rng.choice(xs)
        return rng.choice(fresh) if fresh else None

    ops = ["open"] * 10 + ["close"] * 5 + ["prepare"] * 22 + ["execute"] * 20 + ["cancel"] * 4 + ["publish"] * 12
    ops += ["split"] * 6 + ["retain"] * 3 + ["release"] * 6 + ["submit"] * 24 + ["poll"] * 4 + ["wait"] * 3
    ops += ["restart"] * 1 + ["complete"] * 18
    # the environment's failures, where the model offers them
    ops += ["fail_compute"] * 2 + ["fail_transfer"] * (5 if hasattr(rec.model, "fail_transfer") else 0)
    ops += ["lose"] * (1 if hasattr(rec.model, "lose") else 0)
    guard = 0
    while len(rec.steps) < steps and guard < steps * 20:
        guard += 1
        op = "restart" if is_lost(rec.model) and rng.random() < 0.5 else rng.choice(ops)
        if op == "open":
            ok, h = rec.open_request()
            if ok:
                handles.append(h)
        elif op == "close":
            h = pick(handles, live_handles())
            if h:
                rec.close_request(h)
        elif op == "prepare":
            fresh = live_handles()
            if not fresh:
                continue
            chosen = rng.sample(fresh, rng.randint(1, len(fresh)))
            if rng.random() < 0.08 and handles:
                chosen[0] = rng.choice(handles)
            xs = live_extents()
            items = [(h, rng.choice(xs) if xs and rng.random() < 0.35 else None) for h in chosen]
            intents: list[TierIntent] = []
            if xs and rng.random() < 0.35:
                restore = next((x for _, x in items if x is not None), None) if rng.random() < 0.6 else None
                intents.append(Restore(restore or rng.choice(xs)))
            while extents and rng.random() < 0.3 and len(intents) < 3:  # applied at execute, after compute
                intents.append(INTENTS[rng.choice(["Backup", "Demote", "Drop"])](pick(extents, xs)))
            ok, bh = rec.prepare_batch(items, tuple(intents), token=rng.randint(1, 99))
            if ok:
                batches.append(bh)
        elif op == "execute" and batches:
            st = rec.model.state
            prepared = [b for b in batches if b.epoch == st.epoch and b.batch_id in st.batches]
            rec.execute_batch(pick(batches, prepared, 0.1))
        elif op == "cancel" and batches:
            rec.cancel_batch(rng.choice(batches))
        elif op == "publish":
            computed = [h for h in live_handles() if rec.model.state.slots[h.slot_id].num_tokens]
            h = pick(handles, computed or live_handles())
            if h:
                ntok = rec.model.state.slots[h.slot_id].num_tokens
                first = rng.randint(0, max(0, ntok - 1))
                count = rng.randint(1, max(1, ntok - first)) if rng.random() < 0.9 else ntok + 1
                ok, x = rec.publish(h, first, count)
                if ok:
                    extents.append(x)
                    if rng.random() < 0.25:  # the row lets go: its extent may be demoted
                        rec.close_request(h)
        elif op == "split":
            x = pick(extents, live_extents())
            if x:
                ok, halves = rec.split(x, rng.randint(1, max(1, x.page_count - 1)))
                if ok:
                    extents.extend(halves)
        elif op == "retain":
            x = pick(extents, live_extents())
            if x:
                rec.retain(x)
        elif op == "release":
            x = pick(extents, live_extents())
            if x:
                rec.release(x)
        elif op == "submit":
            kinds = ["Backup", "Backup", "Restore", "Demote", "Drop"]
            chosen_intents = []
            for _ in range(2 if rng.random() < 0.3 else 1):
                x = pick(extents, live_extents())
                if x:
                    chosen_intents.append(INTENTS[rng.choice(kinds)](x))
            if chosen_intents:
                rec.submit(tuple(chosen_intents))
        elif op == "poll":
            rec.poll_completions()
        elif op == "wait":
            rec.wait_completions()
        elif op == "restart":
            rec.restart()
        elif op == "complete":
            ready = rec.model.completable()
            if ready:
                rec.complete_transfer(rng.choice(ready))
        elif op == "fail_transfer":
            ready = rec.model.completable()
            if ready:
                rec.fail_transfer(rng.choice(ready))
        elif op == "fail_compute" and batches:
            st = rec.model.state
            prepared = [b for b in batches if b.epoch == st.epoch and b.batch_id in st.batches]
            rec.fail_compute(pick(batches, prepared, 0.1))
        elif op == "lose" and not is_lost(rec.model):  # the spec's RuntimeLost needs a runtime not lost
            rec.lose()
    return rec.steps


# -- the trace module ----------------------------------------------------------------

TRACE_MODULE = r"""---------------------------- MODULE TraceCheck ----------------------------
(* Generated by cacheruntime.tlatrace: traces of the Python reference model *)
(* replayed against CacheRuntime.  Do not edit.                             *)
EXTENDS CacheRuntime

VARIABLES
    ti,     \* which trace
    si      \* how many of its steps have been replayed

F0(s) == [x \in 0 .. Len(s) - 1 |-> s[x + 1]]

Traces == <<
%(traces)s
>>

Do(e) ==
    CASE e.op = "OpenRequest" -> OpenRequest
      [] e.op = "CloseRequest" -> CloseRequest(e.args[1])
      [] e.op = "PrepareBatch" -> PrepareBatch(e.args[1])
      [] e.op = "ExecuteBatch" -> ExecuteBatch(e.args[1])
      [] e.op = "CancelBatch" -> CancelBatch(e.args[1])
      [] e.op = "Publish" -> Publish(e.args[1], e.args[2], e.args[3])
      [] e.op = "Split" -> Split(e.args[1], e.args[2])
      [] e.op = "Retain" -> Retain(e.args[1])
      [] e.op = "Release" -> Release(e.args[1])
      [] e.op = "SubmitBackup" -> SubmitBackup(e.args[1])
      [] e.op = "SubmitRestore" -> SubmitRestore(e.args[1])
      [] e.op = "SubmitDemote" -> SubmitDemote(e.args[1])
      [] e.op = "SubmitDrop" -> SubmitDrop(e.args[1])
      [] e.op = "Submit" -> Submit(e.args[1])
      [] e.op = "PollCompletions" -> PollCompletions
      [] e.op = "WaitCompletions" -> WaitCompletions
      [] e.op = "Restart" -> Restart
      [] e.op = "CompleteTransfer" -> CompleteTransfer(e.args[1])
      [] e.op = "FailTransfer" -> FailTransfer(e.args[1])
      [] e.op = "FailCompute" -> FailCompute(e.args[1])
      [] e.op = "RuntimeLost" -> RuntimeLost

Step(e) == IF e.ok THEN Do(e) /\ vars' = e.post
           ELSE ~(ENABLED Do(e)) /\ UNCHANGED vars

TraceInit == ti \in 1 .. Len(Traces) /\ si = 0 /\ Init
TraceNext ==
    \/ /\ si < Len(Traces[ti])
       /\ Step(Traces[ti][si + 1])
       /\ si' = si + 1 /\ ti' = ti
    \/ /\ si = Len(Traces[ti])            \* replayed to the end: stay
       /\ UNCHANGED <<vars, ti, si>>
TraceSpec == TraceInit /\ [][TraceNext]_<<vars, ti, si>>
=============================================================================
"""

TRACE_CFG = """SPECIFICATION TraceSpec
CONSTANTS
%(constants)s
INVARIANT R1
INVARIANT R2
INVARIANT R3
INVARIANT R4
INVARIANT O1
INVARIANT O2
INVARIANT O3
INVARIANT D1
INVARIANT F1
PROPERTY F2
"""


def sequences(traces: Sequence[Sequence[HasTla]]) -> str:
    """Traces as the body of a TLA+ sequence of sequences: one step (its `tla()`) a line."""
    return ",\n".join("  <<\n" + ",\n".join("    " + s.tla() for s in trace) + "\n  >>" for trace in traces)


def trace_module(traces: list[list[Step]], bounds: Bounds = Bounds()) -> tuple[str, str]:
    """The TraceCheck module and its config for `traces`."""
    return TRACE_MODULE % {"traces": sequences(traces)}, TRACE_CFG % {"constants": bounds.cfg_constants()}


class TLCRun(NamedTuple):
    """What one TLC run of a generated module gave."""

    returncode: int
    out: str  # stdout and stderr
    seconds: float
    distinct: int  # distinct states found (0 if TLC said none)


def run_tlc(name: str, module: str, cfg: str, *, spec: Path | None, workers: int, java: str, jar: str | None, options: Sequence[str] = ()) -> TLCRun:
    """TLC on the module `name` (its text and config) beside a copy of the spec (default tla/'s), in a temporary folder."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"cacheruntime-{name}-") as tmp:
        work = Path(tmp)
        shutil.copy(spec or TLA_DIR / "CacheRuntime.tla", work / "CacheRuntime.tla")
        (work / f"{name}.tla").write_text(module)
        (work / f"{name}.cfg").write_text(cfg)
        command = [*tlc_java(java, jar or find_jar(), work), *options, "-workers", str(workers)]
        command += ["-metadir", str(work / "states"), "-config", f"{name}.cfg", f"{name}.tla"]
        proc = subprocess.run(command, cwd=work, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    found = re.findall(r"([\d,]+) distinct states found", out)
    return TLCRun(proc.returncode, out, time.monotonic() - started, int(found[-1].replace(",", "")) if found else 0)


@dataclass
class TraceResult:
    ok: bool
    traces: int
    steps: int
    seconds: float
    distinct: int = 0
    divergence: str = ""
    output: str = field(default="", repr=False)


def validate(
    traces: list[list[Step]], bounds: Bounds = Bounds(), *, spec: Path | None = None, workers: int = 1, java: str = "java", jar: str | None = None
) -> TraceResult:
    """Replay `traces` against the spec with TLC; report the first step that differs."""
    module, cfg = trace_module(traces, bounds)
    run = run_tlc("TraceCheck", module, cfg, spec=spec, workers=workers, java=java, jar=jar)
    out, seconds, distinct = run.out, run.seconds, run.distinct
    nsteps = sum(len(t) for t in traces)
    if run.returncode == 0 and "No error has been found" in out:
        expected = nsteps + len(traces)
        if distinct != expected:
            return TraceResult(False, len(traces), nsteps, seconds, distinct, f"expected {expected} distinct states, TLC found {distinct}", out)
        return TraceResult(True, len(traces), nsteps, seconds, distinct, "", out)
    return TraceResult(False, len(traces), nsteps, seconds, distinct, describe_divergence(out, traces), out)


def describe_divergence(out: str, traces: list[list[Step]]) -> str:
    """The first step the spec could not follow, from TLC's error trace."""
    tis = re.findall(r"/\\ ti = (\d+)", out)
    sis = re.findall(r"/\\ si = (\d+)", out)
    error = next((line for line in out.splitlines() if line.startswith("Error:")), "TLC failed")
    if "Deadlock" in out and tis and sis:
        t, s = int(tis[-1]), int(sis[-1])
        step = traces[t - 1][s]
        side = "model succeeded, the spec's action is not enabled or reaches another state" if step.ok else "model raised, the spec's action is enabled"
        return f"trace {t} step {s + 1}: {step.op}{tla(step.args)} ({side}; model: {step.note})"
    if tis and sis:
        return f"{error} at trace {tis[-1]} after step {sis[-1]}"
    return error + "\n" + out[-3000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check random traces of the reference model against the TLA+ spec")
    parser.add_argument("--traces", type=int, default=60)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--dump", help="write TraceCheck.tla and .cfg into this folder too")
    args = parser.parse_args(argv)
    traces = [random_trace(args.seed + i, args.steps) for i in range(args.traces)]
    if args.dump:
        module, cfg = trace_module(traces)
        Path(args.dump).mkdir(parents=True, exist_ok=True)
        (Path(args.dump) / "TraceCheck.tla").write_text(module)
        (Path(args.dump) / "TraceCheck.cfg").write_text(cfg)
    result = validate(traces, workers=args.workers)
    status = "ok" if result.ok else "DIVERGENCE"
    print(f"{status}: {result.traces} traces, {result.steps} steps, {result.distinct} distinct states, {result.seconds:.1f}s")
    if not result.ok:
        print(result.divergence)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
