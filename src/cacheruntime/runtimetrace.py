"""Runtime <-> spec correspondence: recorded executions of a real runtime, checked by TLC.

A runtime's state cannot be seen, only what control sends it and what comes back. So a
trace of a runtime (unlike one of the reference model, `cacheruntime.tlatrace`) pins no
state: it is the list of boundary calls a `Recorder` logged, each with its arguments and
its observable outcome (the handles, refs and tickets returned, the items' token counts,
the completions reported, or that it raised). `trace_module` turns many such traces into
one module `RuntimeTraceCheck` in which each recorded call must be the spec's action for
that operation, with the outcome the runtime gave:

- a call that returned is the action taken; what it returned must be what the spec issues
  in that step (the request handle of the slot it opens, the next batch id, extent
  generation and transfer ids, the page names of an extent, each ticket's kind and page
  count, each item's token count, the completions not yet reported, in order);
- a call that raised a typed error is the action not enabled (nothing changes);
- between two recorded calls TLC may take hidden `CompleteTransfer` steps, the only steps
  a runtime does not show (a copy landing): a trace is accepted when some interleaving of
  them lets the spec follow every call.

The runtime numbers its handles, extents, pages and transfers as it likes (spec/protocol.md
2.1): a ghost variable `ren` binds each runtime value, the first time the runtime issues
it, to the spec's value issued in the same place, and from then on it must stand for that
value and no other (as the conformance suite's renaming does). Arguments go through the
same map; a value never issued maps to a handle that is valid nowhere.

The driver (`drive`) makes random calls of the shape the model trace check uses, within
the spec's abstraction (page size 1, one input token per item, tier intents only, the
`Bounds` kept by control-side counting of what the runtime issued), on any runtime made by
a factory (`--runtime MODULE:FACTORY`, default `LocalGPURuntime` on simulated streams with a
seeded schedule). Traces are written and read as gzip'd JSON lines (`save`, `load`), so
they can be recorded on a GPU machine without Java and validated elsewhere.

Run it: `cacheruntime tlc --runtime-traces 200` (see tla/README.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheruntime import specfiles
from cacheruntime.cliargs import factory, input_dir, output_dir, positive_int
from cacheruntime.conformance.target import Target
from cacheruntime.protocol import (
    Backup,
    BatchCompletion,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    Capability,
    ComputeFailed,
    Demote,
    Drop,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    Restore,
    RuntimeInfo,
    TierIntent,
    TransferCompletion,
    TransferTicket,
)
from cacheruntime.recording import Call, Recorder, format_call
from cacheruntime.tlatrace import INTENTS, Bounds, run_tlc, sequences, tla

TLA_DIR = specfiles.tla_dir()

#: The constants of the runtime-trace check. The request, page and row sizes are the
#: runtime's geometry (it is built with them); the per-epoch id bounds are kept by the driver
#: (it makes no call that could take the spec past one); generation, epoch and refcount bounds
#: are far above what a trace of at most MAX_STEPS calls reaches. No failures: hidden steps
#: are only CompleteTransfer (the runtime's failures are not injected).
RUNTIME_BOUNDS = Bounds(
    MaxRequests=3,
    L1Pages=6,
    L2Pages=4,
    MaxRequestTokens=4,
    MaxNames=16,
    MaxExtents=10,
    MaxBatches=12,
    MaxTransfers=10,
    MaxGeneration=64,
    MaxEpoch=64,
    MaxRefcount=64,
    Faults=False,
)
MAX_STEPS = 60

#: The default runtime: LocalGPURuntime as `cacheruntime.runtime.factories:traced` builds it.
DEFAULT_RUNTIME = "cacheruntime.runtime.factories:traced"

#: Trace files: gzip'd JSON lines, one trace a line, at most this many traces a file.
TRACES_PER_FILE = 500
FILE_GLOB = "runtime-traces-*.jsonl.gz"


class TraceInputError(ValueError):
    """A trace file or runtime that the check cannot use (said in one line)."""


def geometry(bounds: Bounds = RUNTIME_BOUNDS) -> dict[str, int]:
    """The constructor options every runtime of the check is built with (page size 1: tokens are pages)."""
    return {
        "page_size": 1,
        "max_requests": bounds.MaxRequests,
        "max_request_tokens": bounds.MaxRequestTokens,
        "l1_pages": bounds.L1Pages,
        "l2_pages": bounds.L2Pages,
    }


# -- protocol values as JSON ----------------------------------------------------------------


def encode(value: Any) -> Any:
    """A boundary value as JSON: handles as [epoch, id, ...] under their kind's key."""
    if isinstance(value, RequestRuntimeHandle):
        return {"req": [value.epoch, value.slot_id, value.generation]}
    if isinstance(value, CacheExtentRef):
        names = [run.first_page + i for run in value.page_runs for i in range(run.page_count)]
        return {"ext": [value.epoch, value.generation], "pages": names}
    if isinstance(value, PreparedBatchHandle):
        return {"batch": [value.epoch, value.batch_id]}
    if isinstance(value, TransferTicket):
        return {"ticket": [value.epoch, value.transfer_id], "kind": value.kind.value, "extent": value.extent_generation, "pages": value.page_count}
    if isinstance(value, TransferCompletion):
        return {"done": encode(value.ticket), "failure": None if value.failure is None else value.failure.value}
    if isinstance(value, (Backup, Restore, Demote, Drop)):
        return {"intent": type(value).__name__, "extent": encode(value.extent)}
    if isinstance(value, BatchPlan):
        items = [
            {"request": encode(i.request), "input_ids": list(i.input_ids), "attach": encode(i.attach), "append": i.append_previous_output} for i in value.items
        ]
        return {
            "plan": {
                "items": items,
                "intents": [encode(i) if isinstance(i, (Backup, Restore, Demote, Drop)) else {"intent": type(i).__name__} for i in value.intents],
            }
        }
    if isinstance(value, BatchCompletion):
        items = [{"request": encode(i.request), "num_tokens": i.num_tokens} for i in value.items]
        return {"completion": {"batch": encode(value.batch), "items": items, "published": encode(value.published), "tickets": encode(value.tickets)}}
    if isinstance(value, RuntimeInfo):
        return {"info": {"epoch": value.epoch, "page_size": value.page_size}}
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (int, str, bool)):
        return value
    raise TraceInputError(f"no JSON form for {type(value).__name__} {value!r}")


def event(call: Call) -> dict[str, Any]:
    """One recorded call as a JSON record: operation, arguments, and the value or the error."""
    error = call.error
    return {
        "op": call.operation,
        "args": encode(call.args),
        "value": None if error is not None else encode(call.value),
        "error": None if error is None else type(error).__name__,
        "typed": error is None or isinstance(error, CacheRuntimeError),
        "text": format_call(call)[:300],
    }


@dataclass
class RuntimeTrace:
    """One recorded execution: how it was made and its calls as JSON events."""

    seed: int
    runtime: str
    events: list[dict[str, Any]]
    geometry: dict[str, int] = field(default_factory=geometry)

    def to_json(self) -> str:
        return json.dumps({"seed": self.seed, "runtime": self.runtime, "geometry": self.geometry, "events": self.events}, separators=(",", ":"))


def save(traces: list[RuntimeTrace], folder: Path) -> list[Path]:
    """Write `traces` into `folder` as gzip'd JSON lines, TRACES_PER_FILE a file; returns the files."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for start in range(0, len(traces), TRACES_PER_FILE):
        path = folder / f"runtime-traces-{start // TRACES_PER_FILE:03d}.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8") as out:
            for trace in traces[start : start + TRACES_PER_FILE]:
                out.write(trace.to_json() + "\n")
        written.append(path)
    return written


def load(folder: Path) -> list[RuntimeTrace]:
    """The traces `save` wrote into `folder`, in file and line order."""
    files = sorted(folder.glob(FILE_GLOB))
    if not files:
        raise TraceInputError(f"no {FILE_GLOB} files in {str(folder)!r}")
    traces = []
    for path in files:
        number = 0
        try:
            with gzip.open(path, "rt", encoding="utf-8") as lines:
                for line in lines:
                    number += 1
                    record = json.loads(line)
                    traces.append(RuntimeTrace(int(record["seed"]), str(record["runtime"]), list(record["events"]), dict(record["geometry"])))
        except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
            raise TraceInputError(f"{path.name} line {number} is not a runtime trace ({type(error).__name__}: {error})") from None
    return traces


# -- driving a runtime -----------------------------------------------------------------


@dataclass
class _Control:
    """What control knows from the calls' results: issued handles and the counts the spec bounds."""

    bounds: Bounds
    handles: list[RequestRuntimeHandle] = field(default_factory=list)
    live: dict[RequestRuntimeHandle, int] = field(default_factory=dict)  # open request -> tokens computed
    extents: list[CacheExtentRef] = field(default_factory=list)
    refs: dict[CacheExtentRef, int] = field(default_factory=dict)  # live extent -> references held
    batches: list[PreparedBatchHandle] = field(default_factory=list)
    prepared: dict[PreparedBatchHandle, int] = field(default_factory=dict)  # prepared batch -> Backups it will start
    names: int = 0  # page names, extent generations, batches, transfers issued this epoch
    generations: int = 0
    batch_count: int = 0
    transfers: int = 0
    epoch_restarts: int = 0

    def transfers_room(self, more: int) -> bool:
        return self.transfers + sum(self.prepared.values()) + more <= self.bounds.MaxTransfers

    def restarted(self) -> None:
        self.live.clear()
        self.refs.clear()
        self.prepared.clear()
        self.names = self.generations = self.batch_count = self.transfers = 0
        self.epoch_restarts += 1


RuntimeFactory = Callable[..., Any]


def _intent(kind: str, extent: CacheExtentRef) -> TierIntent:
    return INTENTS[kind](extent)


def drive(runtime: Any, seed: int, steps: int, bounds: Bounds = RUNTIME_BOUNDS, vocab: int = 100) -> list[Call]:
    """Make up to `steps` random boundary calls on `runtime`, recorded; returns the calls.

    The calls have the shape of the model trace check's (`tlatrace.random_trace`): mostly
    sensible, some with stale handles or invalid arguments, within the spec's abstraction.
    Control picks its arguments from what earlier calls returned, never from the runtime's
    state; it makes no call that could take the spec past a per-epoch id bound. Input token
    ids are below `vocab` (the runtime's `vocab_size`: the spec does not model a bad one).
    """
    if steps > MAX_STEPS:
        raise ValueError(f"at most {MAX_STEPS} steps a trace (the spec's generation and epoch bounds assume it)")
    rng = random.Random(seed)
    rec = Recorder(runtime)
    ctl = _Control(bounds)

    def call(method: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        try:
            return True, method(*args)
        except ComputeFailed as failed:
            return True, failed
        except Exception as error:  # the recorder logged it; an untyped one is rejected by the check
            return False, error

    def pick(xs: list[Any], fresh: list[Any], stale_rate: float = 0.15) -> Any:
        if xs and (not fresh or rng.random() < stale_rate):
            return rng.choice(xs)
        return rng.choice(fresh) if fresh else None

    ops = ["open"] * 10 + ["close"] * 5 + ["prepare"] * 22 + ["execute"] * 20 + ["cancel"] * 4 + ["publish"] * 12
    ops += ["split"] * 6 + ["retain"] * 3 + ["release"] * 6 + ["submit"] * 24 + ["poll"] * 8 + ["wait"] * 4 + ["restart"] * 1
    guard = 0
    while len(rec.calls) < steps and guard < steps * 20:
        guard += 1
        op = rng.choice(ops)
        live, xs = list(ctl.live), list(ctl.refs)
        if op == "open":
            ok, h = call(rec.open_request)
            if ok:
                ctl.handles.append(h)
                ctl.live[h] = 0
        elif op == "close":
            h = pick(ctl.handles, live)
            if h and call(rec.close_request, h)[0]:
                ctl.live.pop(h, None)
        elif op == "prepare" and live:
            chosen = rng.sample(live, rng.randint(1, len(live)))
            if rng.random() < 0.08:
                chosen[0] = rng.choice(ctl.handles)
            items = [(h, rng.choice(xs) if xs and rng.random() < 0.35 else None) for h in chosen]
            intents: list[TierIntent] = []
            if xs and rng.random() < 0.35:
                restore = next((x for _, x in items if x is not None), None) if rng.random() < 0.6 else None
                intents.append(Restore(restore or rng.choice(xs)))
            while ctl.extents and rng.random() < 0.3 and len(intents) < 3:  # applied at execute, after compute
                intents.append(_intent(rng.choice(["Backup", "Demote", "Drop"]), pick(ctl.extents, xs)))
            backups = sum(isinstance(i, Backup) for i in intents)
            restores = len(intents) - backups - sum(isinstance(i, (Demote, Drop)) for i in intents)
            fits = ctl.names + len(items) <= bounds.MaxNames and ctl.batch_count < bounds.MaxBatches and ctl.transfers_room(restores + backups)
            if not fits:
                continue
            plan = BatchPlan(tuple(BatchItem(h, (rng.randint(1, min(99, vocab - 1)),), attach=() if x is None else (x,)) for h, x in items), tuple(intents))
            ok, bh = call(rec.prepare_batch, plan)
            if ok:
                ctl.batches.append(bh)
                ctl.prepared[bh] = backups
                ctl.names += len(items)
                ctl.batch_count += 1
                ctl.transfers += restores
        elif op == "execute" and ctl.batches:
            prepared = list(ctl.prepared)  # oldest first: a later batch of a request waits for it
            bh = pick(ctl.batches, prepared[:1] if prepared and rng.random() < 0.7 else prepared, 0.1)
            ok, done = call(rec.execute_batch, bh)
            if ok:
                ctl.prepared.pop(bh, None)
            if isinstance(done, BatchCompletion):
                ctl.transfers += len(done.tickets)
                for item in done.items:
                    if item.request in ctl.live:
                        ctl.live[item.request] = item.num_tokens
        elif op == "cancel" and ctl.batches:
            bh = rng.choice(ctl.batches)
            if call(rec.cancel_batch, bh)[0]:
                ctl.prepared.pop(bh, None)
        elif op == "publish" and ctl.generations + 1 <= bounds.MaxExtents:
            computed = [h for h in live if ctl.live[h]]
            h = pick(ctl.handles, computed or live)
            if h:
                ntok = ctl.live.get(h, 0)
                first = rng.randint(0, max(0, ntok - 1))
                if rng.random() < 0.5:  # the longest run from the row's start: extents of several pages split
                    first = 0
                count = rng.randint(1, max(1, ntok - first)) if rng.random() < 0.9 else ntok + 1
                ok, x = call(rec.publish, h, first, count)
                if ok:
                    ctl.generations += 1
                    ctl.extents.append(x)
                    ctl.refs[x] = 1
                    if rng.random() < 0.25 and len(rec.calls) < steps and call(rec.close_request, h)[0]:  # the row lets go: its extent may be demoted
                        ctl.live.pop(h, None)
        elif op == "split" and ctl.generations + 2 <= bounds.MaxExtents:
            x = pick(ctl.extents, xs)
            if x:
                ok, halves = call(rec.split, x, rng.randint(1, max(1, x.page_count - 1)))
                if ok:
                    ctl.generations += 2
                    ctl.refs.pop(x, None)
                    ctl.extents.extend(halves)
                    ctl.refs.update({half: 1 for half in halves})
        elif op == "retain":
            x = pick(ctl.extents, xs)
            if x and ctl.refs.get(x, 0) < bounds.MaxRefcount and call(rec.retain, x)[0]:
                ctl.refs[x] += 1
        elif op == "release":
            x = pick(ctl.extents, xs)
            if x and call(rec.release, x)[0] and x in ctl.refs:
                ctl.refs[x] -= 1
                if not ctl.refs[x]:
                    del ctl.refs[x]
        elif op == "submit":
            chosen_intents: list[TierIntent] = []
            for _ in range(2 if rng.random() < 0.3 else 1):
                x = pick(ctl.extents, xs)
                if x:
                    chosen_intents.append(_intent(rng.choice(["Backup", "Backup", "Restore", "Demote", "Drop"]), x))
            moving = sum(isinstance(i, (Backup, Restore)) for i in chosen_intents)
            if chosen_intents and ctl.transfers_room(moving):
                ok, tickets = call(rec.submit, tuple(chosen_intents))
                if ok:
                    ctl.transfers += len(tickets)
        elif op == "poll":
            call(rec.poll_completions)
        elif op == "wait":
            call(rec.wait_completions)
        elif op == "restart" and ctl.epoch_restarts < 2:
            if call(rec.restart)[0]:
                ctl.restarted()
    return list(rec.calls)


def record(
    factory: RuntimeFactory, runtime: str, seed: int, steps: int, bounds: Bounds = RUNTIME_BOUNDS, options: dict[str, Any] | None = None
) -> RuntimeTrace:
    """One trace: a fresh runtime from `factory` (the check's geometry plus `options`), driven and recorded.

    A runtime with a seeded schedule (SCHEDULE_SEED) runs under `seed`, so the trace is the
    same on every machine and load.
    """
    try:
        target = factory(**{**geometry(bounds), **(options or {})})
    except TypeError as error:  # a factory that does not take the check's geometry
        raise TraceInputError(f"runtime {runtime} cannot be built with the check's geometry {geometry(bounds)} and options {options or {}}: {error}") from None
    try:
        info = target.info()
        want = geometry(bounds)
        got = {key: getattr(info, key) for key in want}
        if got != want:
            raise TraceInputError(f"runtime {runtime} reports {got}, the check needs {want}: its factory must take these options")
        if Capability.SCHEDULE_SEED in info.capabilities:
            target.set_schedule_seed(seed)
        calls = drive(target, seed, steps, bounds, vocab=info.vocab_size)
    finally:
        close = getattr(target, "close", None)
        if callable(close):
            close()
    return RuntimeTrace(seed, runtime, [event(c) for c in calls], geometry(bounds))


def record_many(factory: RuntimeFactory, runtime: str, count: int, steps: int, seed: int, options: dict[str, Any] | None = None) -> list[RuntimeTrace]:
    """`count` traces, seeds `seed`, `seed + 1`, ..."""
    return [record(factory, runtime, seed + i, steps, options=options) for i in range(count)]


# -- JSON events as TLA+ steps ----------------------------------------------------------------


class _Names:
    """Trace-local symbols for the runtime's values: one integer per (kind, epoch, runtime id)."""

    def __init__(self) -> None:
        self.symbols: dict[tuple[Any, ...], int] = {}

    def __call__(self, kind: str, *key: Any) -> int:
        return self.symbols.setdefault((kind, *key), len(self.symbols) + 1)


class OutsideAbstraction(TraceInputError):
    """A recorded call the spec's abstraction does not cover (the driver never makes one)."""


def _sym(names: _Names, value: dict[str, Any]) -> int:
    for kind in ("req", "ext", "batch", "ticket"):
        if kind in value:
            return names(kind, *value[kind])
    raise OutsideAbstraction(f"not a handle: {value!r}")


def _plan(names: _Names, plan: dict[str, Any]) -> dict[str, Any]:
    items = []
    for item in plan["items"]:
        if len(item["input_ids"]) != 1 or item["append"]:
            raise OutsideAbstraction("a plan item computes one token from one input id (page size 1)")
        items.append({"request": _sym(names, item["request"]), "attach": tuple(_sym(names, x) for x in item["attach"])})
    intents = []
    for intent in plan["intents"]:
        if intent["intent"] not in ("Backup", "Restore", "Demote", "Drop"):
            raise OutsideAbstraction(f"a plan's intents are tier intents, not {intent['intent']}")
        intents.append({"kind": intent["intent"], "extent": _sym(names, intent["extent"])})
    return {"items": tuple(items), "intents": tuple(intents)}


def _exts(names: _Names, refs: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple({"sym": _sym(names, x), "pages": tuple(names("page", x["ext"][0], n) for n in x["pages"])} for x in refs)


def _tickets(names: _Names, tickets: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple({"sym": _sym(names, t), "kind": t["kind"], "pages": t["pages"]} for t in tickets)


EMPTY_OUT: dict[str, Any] = {"req": 0, "batch": 0, "exts": (), "tickets": (), "items": (), "done": ()}


@dataclass
class RStep:
    """One recorded call as the check replays it: action, symbolic arguments, whether it returned, what it returned."""

    op: str
    args: tuple[Any, ...]
    ok: bool
    out: dict[str, Any]
    text: str  # the call as the recorder printed it

    def tla(self) -> str:
        return f"[op |-> {tla(self.op)}, args |-> {tla(self.args)}, ok |-> {tla(self.ok)}, out |-> {tla(self.out)}]"


def steps_of(trace: RuntimeTrace) -> list[RStep]:
    """The trace's calls as check steps; `info` calls show nothing the spec has and are left out.

    Raises OutsideAbstraction for a call the spec does not model, and TraceInputError for a
    call that raised an untyped exception (a runtime fails the check with that, not TLC).
    """
    names = _Names()
    steps = []
    step: tuple[str, tuple[Any, ...]]
    for number, ev in enumerate(trace.events, start=1):
        op, args, value, ok = ev["op"], ev["args"], ev["value"], ev["error"] is None or ev["error"] == "ComputeFailed"
        if not ev["typed"]:
            raise TraceInputError(f"seed {trace.seed} call {number}: {ev['text']} (an untyped exception crossed the boundary)")
        out = dict(EMPTY_OUT)
        if op == "info":
            continue
        if op == "open_request":
            step = ("OpenRequest", ())
            if ok:
                out["req"] = _sym(names, value)
        elif op in ("close_request", "cancel_batch", "retain", "release"):
            action = {"close_request": "CloseRequest", "cancel_batch": "CancelBatch", "retain": "Retain", "release": "Release"}[op]
            step = (action, (_sym(names, args[0]),))
        elif op == "prepare_batch":
            step = ("PrepareBatch", (_plan(names, args[0]["plan"]),))
            if ok:
                out["batch"] = _sym(names, value)
        elif op == "execute_batch":
            failed = ev["error"] == "ComputeFailed"
            step = ("ExecuteFailed" if failed else "ExecuteBatch", (_sym(names, args[0]),))
            if ok and not failed:
                done = value["completion"]
                if done["published"]:
                    raise OutsideAbstraction("a plan's intents are tier intents: no Publish results")
                out["items"] = tuple({"req": _sym(names, i["request"]), "n": i["num_tokens"]} for i in done["items"])
                out["tickets"] = _tickets(names, done["tickets"])
        elif op == "publish":
            step = ("Publish", (_sym(names, args[0]), args[1], args[2]))
            if ok:
                out["exts"] = _exts(names, [value])
        elif op == "split":
            step = ("Split", (_sym(names, args[0]), args[1]))
            if ok:
                out["exts"] = _exts(names, value)
        elif op == "submit":
            intents = args[0]
            kinds = [i["intent"] for i in intents]
            if not 1 <= len(kinds) <= 2 or not set(kinds) <= {"Backup", "Restore", "Demote", "Drop"}:
                raise OutsideAbstraction("a submit carries one or two tier intents")
            if len(intents) == 1:
                step = ("Submit" + kinds[0], (_sym(names, intents[0]["extent"]),))
            else:
                step = ("Submit", (tuple({"kind": i["intent"], "extent": _sym(names, i["extent"])} for i in intents),))
            if ok:
                out["tickets"] = _tickets(names, value)
        elif op in ("poll_completions", "wait_completions"):
            step = ("PollCompletions" if op == "poll_completions" else "WaitCompletions", ())
            if ok:
                out["done"] = tuple({"sym": _sym(names, c["done"]), "failure": c["failure"] or "none"} for c in value)
        elif op == "restart":
            step = ("Restart", ())
        else:
            raise OutsideAbstraction(f"seed {trace.seed} call {number}: {op} is not a boundary operation the spec models")
        steps.append(RStep(step[0], step[1], ok, out, ev["text"]))
    return steps


# -- the check module ----------------------------------------------------------------------------

RUNTIME_TRACE_MODULE = r"""------------------------- MODULE RuntimeTraceCheck -------------------------
(* Generated by cacheruntime.runtimetrace: recorded calls of a runtime      *)
(* replayed against CacheRuntime, hidden completions supplied by TLC.       *)
(* Do not edit.                                                             *)
EXTENDS CacheRuntime, TLC

VARIABLES
    ti,     \* which trace
    si,     \* how many of its calls have been replayed
    ren     \* runtime value (a trace-local symbol) -> the spec's value it stands for

Traces == <<
%(traces)s
>>

(* The spec's values, one record shape for every kind, so that the map is one function. *)
Val(kd, ep, x, y) == [kind |-> kd, epoch |-> ep, a |-> x, b |-> y]
NoVal == Val("none", -1, 0, 0)                       \* never issued: valid nowhere (epoch -1)
Res(s) == IF s \in DOMAIN ren THEN ren[s] ELSE NoVal
R(s) == [epoch |-> Res(s).epoch, slotId |-> Res(s).a, generation |-> Res(s).b]
X(s) == [epoch |-> Res(s).epoch, generation |-> Res(s).a]
B(s) == [epoch |-> Res(s).epoch, batchId |-> Res(s).a]
Plan(p) == [items |-> [i \in DOMAIN p.items |->
                [request |-> R(p.items[i].request),
                 attach |-> [j \in DOMAIN p.items[i].attach |-> X(p.items[i].attach[j])]]],
            intents |-> [i \in DOMAIN p.intents |-> [kind |-> p.intents[i].kind, extent |-> X(p.intents[i].extent)]]]

Do(e) ==
    CASE e.op = "OpenRequest" -> OpenRequest
      [] e.op = "CloseRequest" -> CloseRequest(R(e.args[1]))
      [] e.op = "PrepareBatch" -> PrepareBatch(Plan(e.args[1]))
      [] e.op \in {"ExecuteBatch", "ExecuteFailed"} -> ExecuteBatch(B(e.args[1])) \/ FailCompute(B(e.args[1]))
      [] e.op = "CancelBatch" -> CancelBatch(B(e.args[1]))
      [] e.op = "Publish" -> Publish(R(e.args[1]), e.args[2], e.args[3])
      [] e.op = "Split" -> Split(X(e.args[1]), e.args[2])
      [] e.op = "Retain" -> Retain(X(e.args[1]))
      [] e.op = "Release" -> Release(X(e.args[1]))
      [] e.op = "SubmitBackup" -> SubmitBackup(X(e.args[1]))
      [] e.op = "SubmitRestore" -> SubmitRestore(X(e.args[1]))
      [] e.op = "SubmitDemote" -> SubmitDemote(X(e.args[1]))
      [] e.op = "SubmitDrop" -> SubmitDrop(X(e.args[1]))
      [] e.op = "Submit" -> Submit([i \in DOMAIN e.args[1] |-> [kind |-> e.args[1][i].kind, extent |-> X(e.args[1][i].extent)]])
      [] e.op = "PollCompletions" -> PollCompletions
      [] e.op = "WaitCompletions" -> WaitCompletions
      [] e.op = "Restart" -> Restart

(* What the step returned, as the spec has it after the action. *)
Opened == CHOOSE s \in Slots : live'[s] /\ ~live[s]
TicketOps == {"ExecuteBatch", "SubmitBackup", "SubmitRestore", "SubmitDemote", "SubmitDrop", "Submit"}
BatchOf(e) == B(e.args[1]).batchId
TicketsOk(e) ==
    /\ Len(e.out.tickets) = nextTransfer' - nextTransfer               \* a ticket per transfer started
    /\ \A i \in DOMAIN e.out.tickets :
          LET t == nextTransfer + i - 1 IN
          IF e.out.tickets[i].pages = 0 THEN t \notin inflight'          \* nothing to move: done at once
          ELSE /\ transfers'[t].kind = e.out.tickets[i].kind
               /\ Len(transfers'[t].pages) = e.out.tickets[i].pages
ItemsOk(e) ==
    LET slots == batches[BatchOf(e)].slots IN
    /\ Len(e.out.items) = Len(slots)
    /\ \A i \in DOMAIN e.out.items : /\ R(e.out.items[i].req) = ReqH(slots[i])
                                     /\ numTokens'[slots[i]] = e.out.items[i].n
ExtsOk(e) == \A j \in DOMAIN e.out.exts : Len(e.out.exts[j].pages) = Len(extents'[nextExtent + j - 1].pages)
(* A report is ordered by transfer id (spec/protocol.md 4.12): the spec's completions not   *)
(* reported yet, by id, in the order both number transfers (the order they start).        *)
ReportIds == SortedSeq({unreported[i].transferId : i \in DOMAIN unreported})
FailureOf(t) == unreported[CHOOSE i \in DOMAIN unreported : unreported[i].transferId = t].failure
DoneOk(e) == /\ Len(e.out.done) = Len(unreported)
             /\ \A i \in DOMAIN e.out.done : e.out.done[i].failure = FailureOf(ReportIds[i])
Returned(e) ==
    CASE e.op = "ExecuteBatch" -> batches'[BatchOf(e)].state = "executed" /\ ItemsOk(e) /\ TicketsOk(e)
      [] e.op = "ExecuteFailed" -> batches'[BatchOf(e)].state = "failed"
      [] e.op \in TicketOps -> TicketsOk(e)
      [] e.op \in {"Publish", "Split"} -> ExtsOk(e)
      [] e.op \in {"PollCompletions", "WaitCompletions"} -> DoneOk(e)
      [] OTHER -> TRUE

(* The runtime values it issued, each with the spec's value in the same place. *)
ExtPairs(e) ==
    Concat([j \in DOMAIN e.out.exts |->
              <<[sym |-> e.out.exts[j].sym, val |-> Val("ext", epoch, nextExtent + j - 1, 0)]>>
              \o [i \in DOMAIN e.out.exts[j].pages |->
                    [sym |-> e.out.exts[j].pages[i], val |-> Val("page", epoch, extents'[nextExtent + j - 1].pages[i], 0)]]])
Pairs(e) ==
    CASE e.op = "OpenRequest" -> <<[sym |-> e.out.req, val |-> Val("req", epoch, Opened, generation[Opened])]>>
      [] e.op = "PrepareBatch" -> <<[sym |-> e.out.batch, val |-> Val("batch", epoch, nextBatch, 0)]>>
      [] e.op \in {"Publish", "Split"} -> ExtPairs(e)
      [] e.op \in TicketOps -> [i \in DOMAIN e.out.tickets |->
                                  [sym |-> e.out.tickets[i].sym, val |-> Val("xfer", epoch, nextTransfer + i - 1, 0)]]
      [] e.op \in {"PollCompletions", "WaitCompletions"} ->
            [i \in DOMAIN e.out.done |-> [sym |-> e.out.done[i].sym, val |-> Val("xfer", epoch, ReportIds[i], 0)]]
      [] OTHER -> <<>>

(* Bind each new symbol, check each known one: one runtime value, one spec value, both ways. *)
RECURSIVE Bind(_, _)
Bind(m, ps) ==
    IF ps = <<>> THEN [ok |-> TRUE, map |-> m]
    ELSE LET p == Head(ps) IN
         IF p.sym \in DOMAIN m
           THEN IF m[p.sym] = p.val THEN Bind(m, Tail(ps)) ELSE [ok |-> FALSE, map |-> m]
           ELSE IF p.val \in Range(m) THEN [ok |-> FALSE, map |-> m]
                ELSE Bind((p.sym :> p.val) @@ m, Tail(ps))

Step(e) ==
    IF e.ok THEN /\ Do(e)
                 /\ Returned(e)
                 /\ LET r == Bind(ren, Pairs(e)) IN r.ok /\ ren' = r.map
            ELSE /\ ~ENABLED Do(e)
                 /\ UNCHANGED <<vars, ren>>

TraceInit == ti \in 1 .. Len(Traces) /\ si = 0 /\ ren = <<>> /\ Init
TraceNext ==
    \/ /\ si < Len(Traces[ti])
       /\ Step(Traces[ti][si + 1])
       /\ si' = si + 1 /\ ti' = ti
       /\ PrintT(<<"replayed", ti, si + 1>>)
    \/ /\ si < Len(Traces[ti])                 \* hidden: a transfer lands
       /\ \E t \in inflight : CompleteTransfer(t)
       /\ UNCHANGED <<ti, si, ren>>
=============================================================================
"""

RUNTIME_TRACE_CFG = """INIT TraceInit
NEXT TraceNext
CONSTANTS
%(constants)s
"""


def trace_module(traces: list[list[RStep]], bounds: Bounds = RUNTIME_BOUNDS) -> tuple[str, str]:
    """The RuntimeTraceCheck module and its config for `traces` (each a non-empty list of steps)."""
    return RUNTIME_TRACE_MODULE % {"traces": sequences(traces)}, RUNTIME_TRACE_CFG % {"constants": bounds.cfg_constants()}


@dataclass
class CheckResult:
    """What the check of many runtime traces found."""

    traces: int
    steps: int
    seconds: float
    distinct: int = 0
    rejected: list[str] = field(default_factory=list)  # one line per trace the spec cannot follow
    error: str = ""  # TLC did not run to the end
    output: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return not self.rejected and not self.error


def validate(
    traces: list[RuntimeTrace], bounds: Bounds = RUNTIME_BOUNDS, *, spec: Path | None = None, workers: int = 1, java: str = "java", jar: str | None = None
) -> CheckResult:
    """Replay `traces` against the spec with TLC; each trace it cannot follow is named with its first call that diverges."""
    for trace in traces:
        if trace.geometry != geometry(bounds):
            raise TraceInputError(f"trace of seed {trace.seed} was recorded with {trace.geometry}, the check's geometry is {geometry(bounds)}")
    stepped = [(trace, steps_of(trace)) for trace in traces]
    stepped = [(t, s) for t, s in stepped if s]
    nsteps = sum(len(s) for _, s in stepped)
    if not stepped:
        return CheckResult(len(traces), 0, 0.0)
    module, cfg = trace_module([s for _, s in stepped], bounds)
    run = run_tlc("RuntimeTraceCheck", module, cfg, spec=spec, workers=workers, java=java, jar=jar, options=("-deadlock",))
    result = CheckResult(len(traces), nsteps, run.seconds, run.distinct, output=run.out)
    if run.returncode != 0 or "Model checking completed" not in run.out:
        error = next((line for line in run.out.splitlines() if line.startswith("Error")), f"TLC exited {run.returncode}")
        result.error = f"{error}\n{run.out[-3000:]}"
        return result
    reached: dict[int, int] = {}
    for t, s in re.findall(r'<<"replayed", (\d+), (\d+)>>', run.out):
        reached[int(t)] = max(reached.get(int(t), 0), int(s))
    for index, (trace, steps) in enumerate(stepped, start=1):
        done = reached.get(index, 0)
        if done < len(steps):
            result.rejected.append(describe(trace, steps, done))
    return result


def describe(trace: RuntimeTrace, steps: list[RStep], done: int) -> str:
    """The first call of a rejected trace that the spec cannot follow, after any completions."""
    step = steps[done]
    what = (
        "returned what no interleaving of completions lets the spec return"
        if step.ok
        else "raised, but the spec's action is enabled after every interleaving of completions"
    )
    return f"runtime {trace.runtime} seed {trace.seed}: call {done + 1} of {len(steps)}, {step.op}: {step.text} ({what})"


def summary(result: CheckResult) -> str:
    """One line: the verdict and the numbers."""
    verdict = "ok" if result.ok else ("ERROR" if result.error else f"REJECTED {len(result.rejected)}")
    return f"runtime traces: {verdict}: {result.traces} traces, {result.steps} calls, {result.distinct} distinct states, {result.seconds:.1f}s"


def ops_covered(traces: Iterable[RuntimeTrace]) -> dict[str, int]:
    """How many calls of each (action, returned or raised) the traces hold."""
    counts: dict[str, int] = {}
    for trace in traces:
        for step in steps_of(trace):
            key = f"{step.op}:{'ok' if step.ok else 'raised'}"
            counts[key] = counts.get(key, 0) + 1
    return counts


# -- the command line: `cacheruntime tlc --runtime-traces N` ------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The runtime-trace options of `cacheruntime tlc`."""
    group = parser.add_argument_group("runtime traces (tla/README.md)")
    group.add_argument("--runtime-traces", type=positive_int, metavar="N", help="record N executions of a runtime and check them against the spec")
    group.add_argument("--runtime", type=factory, metavar="MODULE:FACTORY", help=f"the runtime to record (default {DEFAULT_RUNTIME}: LocalGPURuntime)")
    group.add_argument("--option", action="append", metavar="KEY=VALUE", help="passed to the runtime factory (repeatable; e.g. device=cuda)")
    group.add_argument("--steps", type=positive_int, metavar="S", help=f"calls a trace (at most {MAX_STEPS}; default the manifest's)")
    group.add_argument("--seed", type=int, metavar="SEED", help="the first trace's seed; trace i has seed + i (default the manifest's)")
    group.add_argument("--record-to", type=output_dir, metavar="DIR", help="also write the traces into DIR (gzip'd JSON lines)")
    group.add_argument("--record-only", action="store_true", help="record and write (--record-to), do not check: needs no Java")
    group.add_argument("--traces-from", type=input_dir, metavar="DIR", help="check the traces --record-to wrote into DIR instead of recording")


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the runtime-trace options together, or None."""
    recording = ("--runtime", args.runtime), ("--option", args.option), ("--steps", args.steps), ("--seed", args.seed), ("--record-to", args.record_to)
    given = [name for name, value in recording if value is not None] + (["--record-only"] if args.record_only else [])
    if args.traces_from is not None and args.runtime_traces is not None:
        return "--traces-from checks recorded traces; --runtime-traces records new ones: give one"
    if given and args.runtime_traces is None:
        return f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --runtime-traces N"
    if args.record_only and args.record_to is None:
        return "--record-only needs --record-to DIR"
    if args.steps is not None and args.steps > MAX_STEPS:
        return f"argument --steps: at most {MAX_STEPS} calls a trace, got {args.steps}"
    return None


def manifest_model(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's runtime-trace model: the numbers CI pins."""
    return next(m for m in manifest["models"] if m.get("kind") == "runtime-trace")


def run_cli(args: argparse.Namespace, manifest: dict[str, Any], tla_dir: Path, *, java: Callable[[], str], jar: Callable[[], Path]) -> int:
    """`cacheruntime tlc --runtime-traces N` / `--traces-from DIR`: record, write, check; 0 when every trace is accepted."""
    pinned = manifest_model(manifest)
    try:
        if args.traces_from is not None:
            traces = load(args.traces_from)
            print(f"runtime traces: {len(traces)} read from {args.traces_from}", flush=True)
        else:
            runtime = args.runtime or DEFAULT_RUNTIME
            steps = args.steps if args.steps is not None else pinned["steps"]
            seed = args.seed if args.seed is not None else pinned["seed"]
            target = Target.parse(runtime, args.option or ())
            print(
                f"runtime traces: recording {args.runtime_traces} of {target}, {steps} calls each, seeds {seed}..{seed + args.runtime_traces - 1}", flush=True
            )
            started = time.monotonic()
            traces = record_many(target.factory(), str(target), args.runtime_traces, steps, seed, dict(target.options))
            print(f"runtime traces: recorded in {time.monotonic() - started:.1f}s", flush=True)
            if args.record_to is not None:
                files = save(traces, args.record_to)
                size = sum(f.stat().st_size for f in files)
                print(f"runtime traces: wrote {len(files)} file(s), {size} bytes, into {args.record_to}", flush=True)
            if args.record_only:
                return 0
        result = validate(traces, spec=tla_dir / "CacheRuntime.tla", workers=args.workers, java=java(), jar=str(jar()))
    except (TraceInputError, ValueError) as error:
        print(f"cacheruntime tlc: error: {error}", file=sys.stderr)
        return 2
    print(summary(result))
    print("calls checked: " + ", ".join(f"{k} {v}" for k, v in sorted(ops_covered(traces).items())))
    for line in result.rejected:
        print(line)
    if result.error:
        print(result.error, file=sys.stderr)
    return 0 if result.ok else 1


def run_manifest_model(model: dict[str, Any], *, workers: int, java: str, jar: Path, tla_dir: Path) -> tuple[CheckResult, str]:
    """The manifest's runtime-trace model: its traces of the default runtime, recorded and checked; (result, what went wrong)."""
    from cacheruntime.runtime import factories  # torch: only when this model runs

    traces = record_many(factories.traced, DEFAULT_RUNTIME, model["traces"], model["steps"], model["seed"])
    result = validate(traces, spec=tla_dir / "CacheRuntime.tla", workers=workers, java=java, jar=str(jar))
    return result, result.error.splitlines()[0] if result.error else "; ".join(result.rejected[:3])
