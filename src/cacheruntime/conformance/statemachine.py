"""The conformance state machine: the runtime under test and the reference model, call by call.

Hypothesis drives both with the same calls (valid and deliberately invalid) and the
machine compares every outcome: the returned value, or the error type (and `OutOfPages`
numbers). Values the contract leaves to the runtime (page names, extent generations,
batch and transfer ids: spec/protocol.md §2.1) are compared up to renaming
(`cacheruntime.conformance.renaming`): the machine learns which runtime value stands for
which model value as they are issued, holds the runtime to that bijection, and sends the
model the images of the runtime's values. Transfer timing belongs to the runtime: what
it reports as completed (by `poll_completions`, `wait_completions`, or, with
INTROSPECTION, by no longer listing a transfer in `probe()`) is fed into the model with
`complete_transfer`, and a completion the model cannot have yet is a failure; which
completed transfers a poll reports is the runtime's too (a wait reports all).

With INTROSPECTION the invariant predicates of `cacheruntime.invariants` judge the
runtime's own `probe()` after every step, a failed call must leave `probe()` unchanged
(H1), and the runtime's abstract state must match the model's where the contract fixes
it (`cacheruntime.conformance.projection`: rows, holders, copy states, written tags,
extents, batches, transfers, free counts, deferred frees, boundary calls), renamed;
physical page numbers are the runtime's own. B2 judges every value returned. With
TAGGED_COMPUTE `next_token` and the copies' tags at written positions must equal the
model's (D1).

The runtime and the model are each wrapped in a `cacheruntime.recording.Recorder` on one
clock, so a failure carries the boundary calls the runtime was actually sent and, where
a call's outcome differed from the model's, a field-level diff of the two (in the
runtime's names); a probe that differs carries the differing fields instead.

`machine_for` builds the machine for one runtime factory and one check; a failure's
notes are the shrunk call sequence, which `reproduction` turns into a runnable script.
"""

from __future__ import annotations

import itertools
from typing import NoReturn

import attrs
from hypothesis import event, reject
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, multiple, precondition, rule

from cacheruntime import invariants, pageruns
from cacheruntime.conformance import coverage, projection
from cacheruntime.conformance.failure import (
    ConformanceFailure,
    field_diff,
    format_diff,
    ids_for_error_mismatch,
    in_runtime_names,
    outcome_diff,
    readable,
)
from cacheruntime.conformance.renaming import Kind, Problem, Renaming
from cacheruntime.conformance.storage import SuiteStore
from cacheruntime.conformance.target import Target, model_for
from cacheruntime.model.records import State
from cacheruntime.protocol import (
    AbstractState,
    Backup,
    BatchCompletion,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    Capability,
    Close,
    ComputeFailed,
    Demote,
    Drop,
    FaultKind,
    Fetch,
    ForeignRuntime,
    HostMode,
    OutOfPages,
    PageRun,
    Persist,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
    RuntimeFault,
    RuntimeInfo,
    StaleHandle,
    Tier,
    TransferCompletion,
    TransferKind,
    UnknownHandle,
)
from cacheruntime.recording import Recorder, format_calls
from cacheruntime.storage import Op

#: Boundary calls a failure prints at most (the latest; the reproduction replays them all).
CALLS_SHOWN = 60

#: Seconds per transfer asked of a runtime with DELAY_KNOB in the ordering check: long
#: enough that a missing wait reads unfinished bytes, short enough for CI.
ORDERING_DELAY = 0.02


@attrs.frozen
class Check:
    """One named run of the machine: which rule families it enables and what it needs claimed.

    Each check draws its own sequences: the ci profile is derandomized, with a fixed seed of
    its own per check (`runner.check_seed`), so checks that enabled the same rules do not
    replay the same cases (the ordering check was once the tiers check, only slower). `leaves_out` names rules a
    check does without because another check covers them, which also gives its draws
    their own meaning.
    """

    name: str
    needs: frozenset[Capability]
    tiers: bool  # Backup/Restore/Demote/Drop as intents and through submit
    restart: bool
    delay: float  # set_transfer_delay at the start of every case, where DELAY_KNOB is claimed (0: leave the runtime's timing)
    about: str
    leaves_out: frozenset[str] = frozenset()


#: The rules that send forged handles and wrong calls: the core and tiers checks cover them
#: at full speed, so the ordering check spends its slow steps on transfers instead.
#: `retain_reissued_ref` needs restarts: only the restart check draws it.
MISUSE_RULES = frozenset(
    {
        "close_forged_request",
        "release_forged_extent",
        "misuse",
        "use_forged_batch",
        "use_reordered_runs",
        "submit_two_faults",
        "forge_live_handle",
        "move_part_of_overlap",
        "retain_reissued_ref",
    }
)

#: The rules that drive the pools to their limits. Under the delay knob whether a call meets
#: OutOfPages depends on which transfers have completed (deferred frees), that is on the
#: clock, and what a rule returns decides later draws: Hypothesis must see the same draws
#: when it replays a case. The checks with a delay leave these to the tiers check.
PRESSURE_RULES = frozenset({"fill_host", "hit_under_pressure", "evict_all", "insert_long_prefix"})

#: The rules that draw from bundles (handles returned earlier): left out where transfers make
#: what a call returns depend on the clock, as a bundle's size then would (`machine_for`).
TIMED_LEAVES_OUT = frozenset(
    {
        "close_request",
        "prepare_batch",
        "run_batch",
        "prepare_batch_with_extents",
        "execute_batch",
        "cancel_batch",
        "publish",
        "split",
        "retain",
        "release",
        "close_forged_request",
        "release_forged_extent",
        "use_forged_batch",
        "submit_release",
        "submit",
    }
)

CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        Check("core", frozenset(), False, False, 0.0, "requests, batches, extents, completions and misuse"),
        Check("tiers", frozenset({Capability.L2}), True, False, 0.0, "backup, restore, demote and drop, in plans and submit"),
        Check(
            "restart",
            frozenset({Capability.RESTART}),
            True,
            True,
            ORDERING_DELAY,
            "restart with work in flight (slowed by the delay knob where claimed); every old handle stale",
            (MISUSE_RULES - {"misuse", "retain_reissued_ref"}) | PRESSURE_RULES,
        ),
        Check(
            "ordering",
            frozenset({Capability.L2, Capability.DELAY_KNOB}),
            True,
            False,
            ORDERING_DELAY,
            "O1-O3 with slow transfers (delay knob): compute and reuse wait for transfers",
            MISUSE_RULES | PRESSURE_RULES,
        ),
        Check(
            "faults",
            frozenset({Capability.L2, Capability.FAULT_INJECTION, Capability.RESTART}),
            True,
            True,
            0.0,
            "injected copy, compute and worker faults: failed completions, failed batches, RuntimeFault until restart",
            MISUSE_RULES | PRESSURE_RULES,
        ),
        Check(
            "storage",
            frozenset({Capability.L3}),
            True,
            True,
            0.0,
            "L3: persist and fetch through staging, l3_exists, objects removed, store reads failed, store writes failed or held (S1-S3)",
            MISUSE_RULES | PRESSURE_RULES,
        ),
    )
}


def _outcome(call):
    """Run `call`; return (value, None) or (None, typed error). Untyped exceptions propagate."""
    try:
        return call(), None
    except CacheRuntimeError as error:
        return None, error


def _same_error(a: CacheRuntimeError, b: CacheRuntimeError) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, OutOfPages):
        return (a.tier, a.needed, a.free) == (b.tier, b.needed, b.free)
    return True


def _describe_error(error: CacheRuntimeError) -> str:
    if isinstance(error, OutOfPages):
        return f"OutOfPages({error.tier.value}, needed={error.needed}, free={error.free})"
    return type(error).__name__


def _without_tokens(value):
    """A BatchCompletion with every next_token blanked, for runtimes without TAGGED_COMPUTE."""
    if isinstance(value, BatchCompletion):
        return attrs.evolve(value, items=tuple(attrs.evolve(i, next_token=None) for i in value.items))
    return value


class RuntimeConformance(RuleBasedStateMachine):
    """Base of the machines `machine_for` builds; holds the comparison harness, not the rules' sizes.

    `set_aside` holds the signatures of violations already reported (`runner.run_check`
    keeps going past each): such a violation is not raised again, and the machine goes on
    where the runtime and the model can stay in step. A call the model refuses and the
    runtime is known to accept is not sent to the runtime; one the runtime is known to
    refuse although the model accepts is undone in the model; both refusing differently
    changes neither. Any other set-aside violation (a value or the state differs) leaves
    the two apart, so the case ends there (`reject`) and the search goes on with others.
    """

    target: Target
    check: Check
    info: RuntimeInfo
    set_aside: frozenset[str] = frozenset()

    def __init__(self):
        super().__init__()
        self.runtime = None
        self.model = None
        #: A LOST fault was injected and the runtime has not yet said RuntimeFault: when it
        #: does, the model loses its machinery too (RuntimeLost is the environment's step).
        self.lost_armed = False
        #: the storage check's store (`cacheruntime.conformance.storage`), given to the runtime and
        #: played as the environment; the keys whose store write it fails, those whose reads it fails
        #: now (`SuiteStore.fail_gets`); the key tuples persisted
        self.store: SuiteStore | None = None
        self.failing_keys: set[str] = set()
        self.unreadable: set[str] = set()
        self.persisted: list[tuple[str, ...]] = []
        self.holding = False  # store writes are held (`_hold_store_writes`): nothing may wait for them

    # -- harness ----------------------------------------------------------------------

    def _claims(self, capability: Capability) -> bool:
        return capability in self.info.capabilities

    def _probe(self) -> AbstractState | None:
        return self.runtime.probe() if self._claims(Capability.INTROSPECTION) else None

    def _sync(self) -> None:
        """Complete in the model every transfer the runtime's probe no longer lists as in flight."""
        if not self._claims(Capability.INTROSPECTION):
            return
        live = projection.in_flight(self.renaming, self.runtime.probe(), self.model.probe())
        self._complete_in_model([t for t in self.model.state.transfers if t not in live], "probe()")

    def _complete_in_model(self, done: list[int], source: str) -> None:
        """Complete the model's transfers `done` (model ids), each after those it waits for (O3 if impossible)."""
        done = [t for t in done if t in self.model.state.transfers]
        while done:
            ready = [t for t in done if t in self.model.completable()]
            if not ready:
                waits = {t: sorted(self.model.state.transfers[t].waits_for) for t in done}
                self._fail(
                    ("O3",), f"{source} completed transfers {done} before the transfers they wait for ({waits})", source, "completes a transfer too early"
                )
            self.model.complete_transfer(ready[0])
            done.remove(ready[0])

    def _fail(self, ids: tuple[str, ...], message: str, operation: str, kind: str, diff: str | None = None) -> NoReturn:
        """Raise the violation; if its signature is set aside, end the case instead (the two are apart)."""
        self._fail_in_step(ids, message, operation, kind, diff)
        reject()

    def _fail_in_step(self, ids: tuple[str, ...], message: str, operation: str, kind: str, diff: str | None = None) -> None:
        """Raise the violation unless its signature is set aside (the two are still in step: go on).

        It carries the calls sent so far and `diff`; without one, the diff of the last
        call's outcome against the model's, when the failure is about that call.
        """
        failure = ConformanceFailure(ids, message, operation, kind)
        if str(failure.signature) not in self.set_aside:
            failure.calls = self._calls_sent()
            failure.diff = self._outcome_diff(operation) if diff is None else diff
            failure.add_note(readable(failure.calls, failure.diff))  # shown where the failure is raised outside the runner: a replayed reproduction
            raise failure

    def _calls_sent(self) -> str:
        """The boundary calls the runtime was sent in this case, the last marked as where the failure showed."""
        calls = self.runtime.calls if isinstance(self.runtime, Recorder) else ()
        return format_calls(calls, last=CALLS_SHOWN, marker="<-- the failure shows here")

    def _outcome_diff(self, operation: str) -> str:
        """The differing fields of the runtime's and the model's outcome of the same last call of `operation`, if it was one.

        The model's value is put in the runtime's names first, so renamed values do not
        show. A poll is left out: which completions it reports is the runtime's choice, so
        the model's poll is not what the runtime had to return (the message says what was).
        """
        if operation == "poll_completions" or not isinstance(self.runtime, Recorder) or not isinstance(self.model, Recorder):
            return ""
        if not self.runtime.calls or not self.model.calls:
            return ""
        mine, theirs = self.runtime.calls[-1], self.model.calls[-1]
        if mine.operation != operation or theirs.operation != operation or abs(mine.index - theirs.index) != 1:
            return ""  # not one call made on both side by side
        comparable = _without_tokens if not self._claims(Capability.TAGGED_COMPUTE) else (lambda value: value)
        mine = attrs.evolve(mine, value=comparable(mine.value))
        theirs = attrs.evolve(theirs, value=comparable(in_runtime_names(self.renaming, theirs.value)))
        if isinstance(mine.value, RuntimeInfo) and isinstance(theirs.value, RuntimeInfo):
            mine, theirs = attrs.evolve(mine, value=_fixed_info(mine.value)), attrs.evolve(theirs, value=_fixed_info(theirs.value))
        return format_diff(outcome_diff(mine, theirs))

    def _aside(self, operation: str, kind_ending: str) -> bool:
        """Whether a set-aside signature of `operation` has a kind ending in `kind_ending` (whatever its ids)."""
        for signature in self.set_aside:
            sig_operation, _, kind = signature.partition(" ")[2].partition(": ")
            if sig_operation == operation and kind.endswith(kind_ending):
                return True
        return False

    def _live_extent(self, i: int) -> tuple[CacheExtentRef, list[int]]:
        """The i-th (modulo) extent live in the model: the ref the runtime issued for it, and the model's page names."""
        live = sorted(self.model.state.extents.items())
        generation, record = live[i % len(live)]
        ref = CacheExtentRef(self.info.runtime_id, self.model.state.epoch, generation, pageruns.coalesce(record.pages))
        return self.renaming.runtime_ref(ref), list(record.pages)

    def _evicted_extent(self, i: int) -> tuple[CacheExtentRef, list[int]]:
        """The i-th (modulo) live extent with a page off the device (evicted to the host), else the i-th live one."""
        live = sorted(self.model.state.extents)
        evicted = [n for n, g in enumerate(live) if any(Tier.L1 not in self.model.state.pages[p].copies for p in self.model.state.extents[g].pages)]
        return self._live_extent(evicted[i % len(evicted)] if evicted else i)

    def _free_slot(self, i: int) -> RequestRuntimeHandle | None:
        """A new request; when every slot is live, the i-th live request finishes first (its row freed)."""
        if all(slot.live for slot in self.model.state.slots):
            self._call("close_request", self._live_request(i))
        return self._call("open_request")

    def _publish_fresh(self, i: int) -> CacheExtentRef | None:
        """A new request computes two pages of tokens and publishes them: one more live extent (its ref)."""
        request = self._free_slot(i)
        if request is None:
            return None
        handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(2 * self.info.page_size))),)))
        if handle is not None and self._call("execute_batch", handle) is not None:
            return self._call("publish", request, 0, 2)
        return None

    def _publish_interleaved(self, i: int) -> CacheExtentRef | None:
        """Two new requests compute a page each in one batch, then the first a second page, and it
        publishes both: its row's pages are not consecutive where the runtime allocates in turn (two runs)."""
        first = self._free_slot(i)
        if first is None:
            return None
        self._make_room(3, first)
        second = self._call("open_request")
        if second is None:
            return None
        ps = self.info.page_size
        for items in ((BatchItem(first, tuple(range(ps))), BatchItem(second, tuple(range(ps)))), (BatchItem(first, tuple(range(ps))),)):
            handle = self._call("prepare_batch", BatchPlan(items))
            if handle is None or self._call("execute_batch", handle) is None:
                return None
        return self._call("publish", first, 0, 2)

    def _close_rows_over(self, pages: list[int]) -> None:
        """The live requests whose rows map any of `pages` finish (as before an eviction)."""
        for slot_id, slot in enumerate(self.model.state.slots):
            if slot.live and set(pages) & set(slot.pages):
                self._call("close_request", RequestRuntimeHandle(self.info.runtime_id, self.model.state.epoch, slot_id, slot.generation))

    def _idle_request(self, i: int) -> RequestRuntimeHandle | None:
        """The i-th (modulo) live request no prepared batch holds, or a new one (None when no slot is free)."""
        held = {slot for batch in self.model.state.batches.values() for slot in batch.slot_set}
        idle = [n for n, slot in enumerate(self.model.state.slots) if slot.live and n not in held]
        if not idle:
            return self._call("open_request")
        slot = idle[i % len(idle)]
        return RequestRuntimeHandle(self.info.runtime_id, self.model.state.epoch, slot, self.model.state.slots[slot].generation)

    def _make_room(self, pages: int, keep: RequestRuntimeHandle) -> None:
        """Memory pressure: the tree releases its oldest extents, then live requests other than `keep`
        finish, until `pages` device pages are free (or nothing more can go)."""
        free = self.model.state.pools[Tier.L1].free
        while len(free) < pages and self.model.state.extents:
            generation = min(self.model.state.extents)
            ref = self.renaming.runtime_ref(self._model_ref(generation))
            for _ in range(self.model.state.extents[generation].refcount):
                self._call("release", ref)
            free = self.model.state.pools[Tier.L1].free
            if generation in self.model.state.extents:
                return
        for slot_id, slot in enumerate(self.model.state.slots):
            if len(self.model.state.pools[Tier.L1].free) >= pages:
                return
            if slot.live and slot_id != keep.slot_id:
                self._call("close_request", RequestRuntimeHandle(self.info.runtime_id, self.model.state.epoch, slot_id, slot.generation))

    def _evict(self, extent: CacheExtentRef, pages: list[int]) -> None:
        """The tree evicts `extent` to the host: its rows finish, backup and demote, and the backup lands."""
        if not self._live(extent) or all(Tier.L1 not in self.model.state.pages[p].copies for p in pages):
            return
        self._close_rows_over(pages)
        self._call("submit", (Backup(extent), Demote(extent)))
        self._completions("wait_completions")

    def _disjoint_extents(self, i: int) -> tuple[tuple[CacheExtentRef, list[int]], tuple[CacheExtentRef, list[int]]] | None:
        """The i-th live extent and the next live one that shares no page name with it, if any."""
        count = len(self.model.state.extents)
        if count < 2:
            return None
        first = self._live_extent(i)
        for k in range(1, count):
            other = self._live_extent(i + k)
            if not set(first[1]) & set(other[1]):
                return first, other
        return None

    def _backup_in_plan_when_full(self) -> None:
        """A new prompt of one page more than the host has free is inserted, and the next batch of its
        request carries its Backup: refused at execute_batch (OutOfPages(L2)), as submit refuses it."""
        self._completions("wait_completions")  # the backups land: the evicted prompts' device pages come free
        request = self._free_slot(1)
        if request is None:
            return
        ps, slot = self.info.page_size, self.model.state.slots[request.slot_id]
        pages = len(self.model.state.pools[Tier.L2].free) + 1
        tokens = pages * ps - slot.reserved_tokens % ps
        if slot.reserved_tokens + tokens + 1 > self.info.max_request_tokens:
            return
        handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(tokens))),)))
        if handle is None or self._call("execute_batch", handle) is None:
            return
        extent = self._call("publish", request, self.model.state.slots[request.slot_id].num_tokens // ps - pages, pages)
        handle = None if extent is None else self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)),), (Backup(extent),)))
        if handle is not None:
            self._call("execute_batch", handle)

    def _inject(self, kind: FaultKind) -> None:
        """The next transfer of `kind` (moving a page), compute or launch fails, on both sides (LOST: the runtime's)."""
        if kind is FaultKind.LOST:
            if not (self.lost_armed or self.model.state.lost):
                self.runtime.inject_fault(kind, 1)
                self.lost_armed = True
            return
        self.runtime.inject_fault(kind, 1)
        self.model.inject_fault(kind, 1)

    def _fault_where_it_matters(self, site: str, i: int) -> None:
        """A fault where a runtime can lose data or serve wrong bytes: the backup of an extent demoted
        while it runs (write-back must keep the device copy), the restore a batch's compute reads
        (KV_READY on a failed copy, or failed and reported before the batch executes), a batch's
        compute, or the worker of the next copy (RuntimeFault on every call, then a restart recovers)."""
        if not self.model.state.extents:
            self._publish_fresh(i)
        if not self.model.state.extents:
            return
        extent, pages = self._live_extent(i)
        for slot_id, slot in enumerate(self.model.state.slots):  # the rows reading it finish, as before an eviction
            if slot.live and set(pages) & set(slot.pages):
                self._call("close_request", RequestRuntimeHandle(self.info.runtime_id, self.model.state.epoch, slot_id, slot.generation))
        if site == "backup_under_demote":
            self._inject(FaultKind.BACKUP)
            self._call("submit", (Backup(extent), Demote(extent)))
            self._completions("wait_completions")
            return
        if site == "lost_worker":
            self._inject(FaultKind.LOST)
            self._call("submit", (Backup(extent),))
            self._completions("wait_completions")
            if self.model.state.lost:
                self._call("restart")
            return
        self._call("submit", (Backup(extent),))
        self._completions("wait_completions")
        self._call("submit", (Demote(extent),))
        self._inject(FaultKind.COMPUTE if site == "compute" else FaultKind.RESTORE)
        request = self._free_slot(i)
        plan = BatchPlan((BatchItem(request, (1,), (extent,)),), (Restore(extent),)) if request is not None else None
        handle = None if plan is None else self._call("prepare_batch", plan)
        if handle is not None and site == "restore_reported_first":
            self._completions("wait_completions")  # the restore fails and is reported before its batch executes
        if handle is not None:
            self._call("execute_batch", handle)

    def _persistable_extent(self, i: int) -> CacheExtentRef | None:
        """The i-th live extent (one published first if none is), ready to persist: in resident mode its
        pages' backups landed (a persist reads host copies), in buffer_only it is read from the device."""
        if not self.model.state.extents:
            self._publish_fresh(i)
        if not self.model.state.extents:
            return None
        extent, pages = self._live_extent(i)
        if self.model.host_mode is HostMode.RESIDENT:
            if any(self.model.state.pages[p].copies.get(Tier.L2) is None for p in pages):
                self._call("submit", (Backup(extent),))
            self._completions("wait_completions")
        return extent if self._live(extent) else None

    def _persist(self, i: int, where: str, fail: bool) -> None:
        """Persist the i-th live extent under fresh keys, by `submit` or in a batch's plan; with `fail`,
        the store write of its first key fails (STORE: the model's transfer is doomed, nothing lost)."""
        extent = self._persistable_extent(i)
        if extent is None:
            return
        keys = self.store.fresh_keys(extent.page_count)
        if fail:
            self.store.fail_put(keys[0])
            self.failing_keys.add(keys[0])
        if where == "submit":
            started = self._call("submit", (Persist(extent, keys),)) is not None
        else:
            request = self._idle_request(i)
            handle = None if request is None else self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)),), (Persist(extent, keys),)))
            started = handle is not None and self._call("execute_batch", handle) is not None
        if started and not fail:
            self.persisted.append(keys)

    def _fetch(self, i: int, count: int, evict: bool, ask: bool, execute: bool, fail_read: bool = False, cancel: bool = False) -> None:
        """A new request reads the first `count` objects of the i-th persisted extent that the store
        holds into its row (a prefix hit in L3, once their persist is reported) and computes after
        them; with `evict`, the last of them is removed behind the runtime's back first (the fetch
        misses: its batch fails, nothing lost); with `fail_read`, the store fails every read of the
        last of them until the fetch has completed (STORE: its batch fails, nothing lost); with
        `ask`, control asks `l3_exists` first, a key never written among them; with `cancel` (and not
        `execute`), the batch is cancelled and its request closed at once, the fetch likely still in
        flight (its device pages' names end under it), and then it lands."""
        if not self.persisted:
            return
        keys = self.persisted[i % len(self.persisted)]
        keys = keys[: max(1, min(count, len(keys)))]
        self._sync()
        # A write, or (before a removal) a read, of an object in flight may have reached the store or
        # not: control waits for it, unless store writes are held (it would wait for the held one).
        if any(key in t.keys for t in self.model.state.transfers.values() if t.kind is TransferKind.PERSIST for key in keys):
            if self.holding:
                return
            self._completions("wait_completions")
        keys = tuple(itertools.takewhile(lambda key: key in self.model.state.objects, keys))
        if not keys:  # a failed write or an earlier removal: control's lookup finds no prefix to fetch
            return
        # Only the fetch drawn here may meet the removal or the failed read: a fetch in flight that reads
        # the object first completes (its read may or may not have reached the store yet).
        if (evict or fail_read) and any(keys[-1] in t.keys for t in self.model.state.transfers.values()):
            if self.holding:
                return
            self._completions("wait_completions")
        if evict and keys[-1] in self.model.state.objects and self.store.evicted(keys[-1]):
            self.model.remove_object(keys[-1])
        if fail_read:
            self.store.fail_gets(keys[-1])
            self.unreadable.add(keys[-1])
        try:
            if ask:
                self._l3_exists(keys)
            request = self._free_slot(i)
            handle = None if request is None else self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)),), (Fetch(request, keys),)))
            if handle is not None and execute:
                self._call("execute_batch", handle)
                self._completions("poll_completions")  # the scheduler's next step: the fetch its compute waited for is reported
            elif handle is not None and cancel:
                self._call("cancel_batch", handle)
                self._call("close_request", request)
                self._completions("wait_completions")
            elif handle is not None and (evict or fail_read):
                self._completions("wait_completions")  # the failure is reported before the batch runs (or is cancelled)
            if fail_read:  # the read stays failed until the runtime's fetch has completed (its compute waited, or a wait)
                self._sync()
                if any(keys[-1] in t.keys for t in self.model.state.transfers.values()):
                    self._completions("wait_completions")
        finally:
            if fail_read:
                self.store.heal(keys[-1])
                self.unreadable.discard(keys[-1])

    def _end_under_persist(self, i: int) -> None:
        """The i-th live extent's pages end while its persist is in flight: the rows reading them finish,
        it is persisted, and it is released at once (on thread streams with store writes held, so the
        persist is surely in flight; on simulated ones while the schedule has likely not run it yet);
        then it lands. In buffer_only mode the persist reads the device pages, whose frees wait for it."""
        extent = self._persistable_extent(i)
        if extent is None:
            return
        pages = set(self.model.state.extents[self.renaming.model_args(extent).generation].pages)
        for slot_id, slot in enumerate(self.model.state.slots):
            if slot.live and pages & set(slot.pages):
                self._call("close_request", RequestRuntimeHandle(self.info.runtime_id, self.model.state.epoch, slot_id, slot.generation))
        keys = self.store.fresh_keys(extent.page_count)
        held = not self._claims(Capability.SCHEDULE_SEED)  # a simulated stream runs the held write on the caller's thread
        if held:
            self.store.hold(Op.PUT)
            self.holding = True
        try:
            if self._call("submit", (Persist(extent, keys),)) is not None:
                self.persisted.append(keys)
            if self._live(extent):
                self._call("release", extent)
        finally:
            if held:
                self.holding = False
                self.store.release(Op.PUT)
        self._completions("wait_completions")

    def _l3_exists(self, keys: tuple[str, ...]) -> None:
        """l3_exists of `keys` and a key never written, leaving out the keys of persists in flight: the
        store may hold such an object before its persist's completion shows, or not yet (a hint)."""
        self._sync()
        writing = {key for t in self.model.state.transfers.values() if t.kind is TransferKind.PERSIST for key in t.keys}
        self._call("l3_exists", (*(key for key in keys if key not in writing), *self.store.fresh_keys(1)))

    def _hold_store_writes(self, i: int) -> None:
        """Store writes held in flight (thread streams only): a persist's staging stays in use while another
        extent is published and persisted and a fetch is planned, each of which takes staging host pages
        (S2: none may take the held one); then the writes go through and everything lands."""
        extent = self._persistable_extent(i)
        if extent is None:
            return
        keys = self.store.fresh_keys(extent.page_count)
        self.store.hold(Op.PUT)
        self.holding = True
        try:
            if self._call("submit", (Persist(extent, keys),)) is not None:
                self.persisted.append(keys)
            self._publish_fresh(i + 1)
            if len(self.model.state.extents) > 1:
                other, _ = self._live_extent(i + 1)
                if other != extent and self.model.host_mode is HostMode.BUFFER_ONLY:
                    more = self.store.fresh_keys(other.page_count)
                    if self._call("submit", (Persist(other, more),)) is not None:
                        self.persisted.append(more)
            if len(self.persisted) > 1:  # planned only: its compute would wait for a read queued behind the held write
                self._fetch(i, 2, evict=False, ask=False, execute=False)
            self._sync()
            if any(t.kind is TransferKind.PERSIST and set(keys) & set(t.keys) for t in self.model.state.transfers.values()) and hasattr(self, "situations"):
                coverage.observe(self.check.name, self.situations, [coverage.HELD_WRITE])
        finally:
            self.holding = False
            self.store.release(Op.PUT)
        self._completions("wait_completions")

    def _model_ref(self, generation: int) -> CacheExtentRef:
        """The model's ref of its live extent `generation`."""
        record = self.model.state.extents[generation]
        return CacheExtentRef(self.info.runtime_id, self.model.state.epoch, generation, pageruns.coalesce(record.pages))

    def _live(self, extent: CacheExtentRef) -> bool:
        """Whether the runtime's ref `extent` stands for an extent live in the model."""
        return self.renaming.model_args(extent).generation in self.model.state.extents

    def _live_request(self, i: int) -> RequestRuntimeHandle | None:
        """The i-th (modulo) request live in the model, or a new one (None when no slot is free)."""
        live = [n for n, slot in enumerate(self.model.state.slots) if slot.live]
        if not live:
            return self._call("open_request")
        slot = live[i % len(live)]
        return RequestRuntimeHandle(self.info.runtime_id, self.model.state.epoch, slot, self.model.state.slots[slot].generation)

    def _doom_failing_store_calls(self) -> None:
        """The model's persists whose store write the suite made fail (`SuiteStore.fail_put`), and its
        fetches of an object whose reads it fails now (`SuiteStore.fail_gets`), fail where they would
        complete (STORE), as the runtime's do: doomed as soon as they start."""
        if not self.failing_keys and not self.unreadable:
            return
        st = self.model.state
        failing = {TransferKind.PERSIST: self.failing_keys, TransferKind.FETCH: self.unreadable}
        doomed = {t for t, record in st.transfers.items() if failing.get(record.kind, set()) & set(record.keys)}
        st.doomed = st.doomed | doomed

    def _judge(self, operation: str, before: AbstractState | None, value: object = None) -> None:
        """After a successful call: B2 on the value, then (INTROSPECTION) invariants and the model match."""
        bad = invariants.B2_plain_values(value, f"{operation}()")
        if bad:
            self._fail(("B2",), "; ".join(bad), operation, "hands control a device object", diff="")
        self._sync()
        after = self._probe()
        if after is None:
            return
        found: dict[str, list[str]] = {}
        for invariant, predicate in invariants.STATE_INVARIANTS.items():
            found[invariant] = predicate(after)
        for invariant, predicate in invariants.TRANSITION_INVARIANTS.items():
            found[invariant] = predicate(before, after)
        found["H3"] = invariants.H3_one_live_handle(after, self.issued)
        if self.model.host_mode is HostMode.BUFFER_ONLY:
            found["S1"] = invariants.S1_host_pages_only_stage(after)
        if isinstance(value, RequestRuntimeHandle) and before is not None:
            found["H3"] += invariants.H3_open_takes_a_free_slot(before, value)
        violated = {k: v for k, v in found.items() if v}
        if violated:
            message = f"after {operation}: " + "; ".join(f"{k}: {v[0]}" for k, v in violated.items())
            self._fail(tuple(violated), message, operation, f"breaks {', '.join(violated)}", diff="")
        self._match_model(operation, after)

    def _match_model(self, operation: str, state: AbstractState) -> None:
        tagged = self._claims(Capability.TAGGED_COMPUTE)
        expected = self.model.probe()
        if self.unreadable:  # the store fails their reads now, the runtime's probe's too: their bytes cannot be shown
            state, expected = (attrs.evolve(s, objects=tuple(o for o in s.objects if o.key not in self.unreadable)) for s in (state, expected))
        diff = projection.compare(self.renaming, state, expected, tagged)
        if diff:
            self._fail(
                tuple(dict.fromkeys(d.id for d in diff)),
                f"after {operation}, probe() differs from the model in " + "; ".join(f"{d.field}: {d.detail}" for d in diff),
                operation,
                f"probe differs in {', '.join(dict.fromkeys(d.field for d in diff))}",
                diff="\n".join(f"  probe {d.field}: {d.detail}" for d in diff),
            )

    def _call(self, operation: str, *args):
        """Make the same call on the runtime and the model and hold the runtime to the model's outcome."""
        self._sync()
        before = self._probe()
        saved = self.model.state.clone() if self.set_aside and self._aside(operation, "where the model returns") else None
        model_args, model_before = self.renaming.model_args(args), self.model.state
        expected, model_error = _outcome(lambda: getattr(self.model, operation)(*model_args))
        self._doom_failing_store_calls()
        self._reached(operation, model_args, model_before, model_error)
        model_outcome = f"the model raises {type(model_error).__name__}" if model_error is not None else "the model returns"
        if model_error is not None and self.set_aside and self._aside(operation, f"where {model_outcome}"):
            return None  # a known violation of this call: not sent to the runtime
        try:
            actual, error = _outcome(lambda: getattr(self.runtime, operation)(*args))
            if isinstance(error, RuntimeFault) and not isinstance(model_error, RuntimeFault) and self.lost_armed:
                self.model.state = model_before  # the call never ran: the machinery was gone (RuntimeLost first)
                self.model.lose()
                self.lost_armed = False
                expected, model_error = _outcome(lambda: getattr(self.model, operation)(*model_args))
                model_outcome = "the model raises RuntimeFault"
        except Exception as crash:  # a crash where the model refuses is evidence against what it refuses for
            ids = ids_for_error_mismatch(operation, model_error) if model_error is not None else (f"contract:{operation}",)
            self._fail(
                ids,
                f"{operation} raised {type(crash).__name__}: {crash} (not a CacheRuntimeError)",
                operation,
                f"crashes with {type(crash).__name__} where {model_outcome}",
            )
        if currently_in_test_context():  # outcome statistics (--hypothesis-show-statistics); not in a replayed script
            event(f"{operation}: {type(model_error).__name__ if model_error else 'ok'}")
        if model_error is not None and error is None:
            message = f"{operation} returned {actual!r}; the model raised {_describe_error(model_error)}: {model_error}"
            self._fail(ids_for_error_mismatch(operation, model_error), message, operation, f"returns where {model_outcome}")
        if error is not None and model_error is None:
            message = f"{operation} raised {_describe_error(error)}: {error}; the model returned {expected!r}"
            self._fail_in_step((f"contract:{operation}",), message, operation, f"raises {type(error).__name__} where the model returns")
            self.model.state = saved  # a known refusal: the call is undone in the model, as the runtime refused it
            return None
        if error is not None:
            if not _same_error(error, model_error):
                handle_errors = (StaleHandle, ForeignRuntime, UnknownHandle)
                both_handle_errors = isinstance(error, handle_errors) and isinstance(model_error, handle_errors)
                self._fail_in_step(
                    (f"contract:{operation}",) if both_handle_errors else ids_for_error_mismatch(operation, model_error),
                    f"{operation} raised {_describe_error(error)}; the model raised {_describe_error(model_error)}: {model_error}",
                    operation,
                    f"raises {type(error).__name__} where {model_outcome}",
                )
            if isinstance(error, ComputeFailed) and isinstance(model_error, ComputeFailed):
                self._match_failed_batches(operation, error, model_error)
            self._judge_failed(operation, before, error)
            return None
        mine, theirs = actual, expected
        if not self._claims(Capability.TAGGED_COMPUTE):
            mine, theirs = _without_tokens(mine), _without_tokens(theirs)
        if isinstance(mine, RuntimeInfo):
            mine, theirs = _fixed_info(mine), _fixed_info(theirs)
        problems = self.renaming.match(mine, theirs)  # learns the runtime's new names before probe() is compared
        self._judge(operation, before, actual)
        if problems:
            ids = ("D1",) if all(where.endswith(".next_token") for where, _ in problems) else (f"contract:{operation}",)
            tokens = ids == ("D1",)
            message = f"{operation} returned {actual!r}; the model returned {expected!r}: {_describe(problems)}"
            self._fail(ids, message, operation, "serves other tokens" if tokens else "returns another value")
        if isinstance(actual, RequestRuntimeHandle):
            self.issued.append(actual)
        return actual

    def _reached(self, operation: str, model_args: tuple, before: State, error: CacheRuntimeError | None) -> None:
        """Count the named situations this call reaches, judged on the model's side (`coverage`)."""
        if not hasattr(self, "situations"):
            self.situations: set[str] = set()
        coverage.observe(self.check.name, self.situations, coverage.situations(operation, model_args, before, error, self.model.state))

    def _judge_failed(self, operation: str, before: AbstractState | None, error: CacheRuntimeError | None = None) -> None:
        """A call that raised must change nothing (H1): probe() as before, unless a transfer completed meanwhile.

        The one error that comes with a change, `ComputeFailed`, must leave nothing of the
        batch visible instead (F2); what it did change is then held to the model.
        """
        after = self._probe()
        if after is None or before is None:
            return
        if isinstance(error, ComputeFailed):
            shown = invariants.F2_failed_batch_invisible(before, after)
            if shown:
                self._fail(
                    ("F2",), f"{operation} raised ComputeFailed but left the batch visible: " + "; ".join(shown), operation, "shows a failed batch", diff=""
                )
            self._sync()
            self._match_model(operation, after)
            return
        changed = invariants.H1_failed_call_changes_nothing(projection.observable(before), projection.observable(after))
        if after.transfers == before.transfers and changed:
            self._fail(("H1",), f"{operation} raised but changed the state: " + "; ".join(changed), operation, "changes state when it raises", diff="")
        self._sync()
        self._match_model(operation, self.runtime.probe())

    def _match_failed_batches(self, operation: str, error: ComputeFailed, model_error: ComputeFailed) -> None:
        """ComputeFailed names the same failed batches as the model's, up to renaming."""
        epoch = self.model.state.epoch
        named = tuple(self.renaming.to_model(Kind.BATCH, epoch, b) for b in error.batches)
        if named != tuple(model_error.batches):
            message = f"{operation} raised ComputeFailed for batches {list(error.batches)}; the model failed {list(model_error.batches)}"
            self._fail_in_step(("F2",), message, operation, "fails other batches")

    def _completions(self, operation: str) -> tuple:
        """poll/wait: feed what the runtime reports into the model, then compare the reports."""
        self._sync()
        before = self._probe()
        try:
            reported = getattr(self.runtime, operation)()
        except RuntimeFault as fault:
            if not (self.lost_armed or self.model.state.lost):
                self._fail((f"contract:{operation}",), f"{operation} raised RuntimeFault: {fault}; no fault was injected", operation, "loses its machinery")
            if self.lost_armed and not self.model.state.lost:
                self.model.lose()
                self.lost_armed = False
            _, model_error = _outcome(lambda: getattr(self.model, operation)())
            if not isinstance(model_error, RuntimeFault):
                self._fail(
                    (f"contract:{operation}",), f"{operation} raised RuntimeFault; the model returned", operation, "raises RuntimeFault where the model returns"
                )
            return ()
        except Exception as crash:
            self._fail((f"contract:{operation}",), f"{operation} raised {type(crash).__name__}: {crash}", operation, f"crashes with {type(crash).__name__}")
        bad = invariants.B2_plain_values(reported, f"{operation}()")
        if bad or not isinstance(reported, tuple) or not all(isinstance(c, TransferCompletion) for c in reported):
            kind = "hands control a device object" if bad else "returns another value"
            self._fail(("B2",) if bad else (f"contract:{operation}",), f"{operation} returned {reported!r}: " + "; ".join(bad), operation, kind)
        ids = [c.ticket.transfer_id for c in reported]
        if ids != sorted(set(ids)):
            self._fail(
                (f"contract:{operation}",), f"{operation} reported {reported!r}: not once each, ordered by transfer id", operation, "reports out of order"
            )
        counterparts = self._counterparts(operation, reported)
        self._complete_in_model(counterparts, operation)
        everything = getattr(self.model, operation)()
        # Which completed transfers a poll reports is the runtime's choice; the rest stay unreported in the model.
        expected = tuple(sorted((c for c in everything if c.ticket.transfer_id in counterparts), key=lambda c: counterparts.index(c.ticket.transfer_id)))
        held = [c for c in everything if c.ticket.transfer_id not in counterparts]
        if held and operation == "wait_completions":
            message = f"{operation} reported {reported!r}; the model has also {held!r} completed and unreported"
            self._fail((f"contract:{operation}",), message, operation, "leaves completions unreported")
        self.model.state.unreported[:0] = held
        if hasattr(self, "situations"):
            coverage.observe(self.check.name, self.situations, coverage.completions_reached(expected))
        problems = self.renaming.match(tuple(reported), expected)
        if problems:
            message = f"{operation} reported {reported!r}; the model has {expected!r}: {_describe(problems)}"
            self._fail((f"contract:{operation}",), message, operation, "reports other completions")
        self._judge(operation, before, reported)
        return reported

    def _counterparts(self, operation: str, reported: tuple) -> list[int]:
        """The model's transfer id for each reported completion, in report order, binding new runtime ids.

        A runtime id seen before stands for its model id; a new one (a transfer started
        and completed unseen, or a runtime without INTROSPECTION) stands for the model's
        lowest unbound transfer, in flight or completed and unreported, with the same kind,
        extent and page count. A completion no model transfer can account for is a failure.
        """
        st, epoch = self.model.state, self.model.state.epoch
        transfers = self.renaming.bijection(Kind.TRANSFER, epoch)
        open_ = {t: record.ticket for t, record in st.transfers.items()} | {c.ticket.transfer_id: c.ticket for c in st.unreported}
        found = []
        for completion in reported:
            ticket = completion.ticket
            model_id = transfers.forward.get(ticket.transfer_id) if ticket.epoch == epoch else None
            if model_id is None and ticket.epoch == epoch:
                generation = self.renaming.to_model(Kind.EXTENT, epoch, ticket.extent_generation)
                same = [
                    t
                    for t, theirs in sorted(open_.items())
                    if t not in transfers.backward
                    and (theirs.kind, theirs.extent_generation, theirs.page_count) == (ticket.kind, generation, ticket.page_count)
                ]
                if same:
                    model_id = same[0]
                    transfers.bind(ticket.transfer_id, model_id)
            if model_id is None or model_id not in open_ or model_id in found:
                message = f"{operation} reported {ticket!r}, which no transfer the model has in flight or unreported accounts for"
                self._fail((f"contract:{operation}",), message, operation, "reports a transfer the model does not have")
            found.append(model_id)
        return found

    # -- lifecycle ------------------------------------------------------------------------

    def _start(self, schedule_seed: int | None = None) -> None:
        """A fresh runtime and model, each recorded, on one clock (so their calls pair up)."""
        clock = itertools.count()
        if self.check.name == "storage":
            self.store = SuiteStore(str(dict(self.target.options).get("store", "file")))
            self.runtime = Recorder(self.target.new(l3=self.store), clock=clock)
        else:
            self.runtime = Recorder(self.target.new(), clock=clock)
        info = self.runtime.info()
        bad = invariants.B2_plain_values(info, "info()")
        if bad:
            raise ConformanceFailure(("B2",), "; ".join(bad), "info", "hands control a device object", calls=self._calls_sent())
        self.info = info
        self.model = Recorder(model_for(info), clock=clock)
        expected = self.model.info()
        if _fixed_info(info) != _fixed_info(expected):
            message = f"a fresh runtime's info() is {info!r}; expected epoch 0"
            diff = format_diff(field_diff(_fixed_info(info), _fixed_info(expected)))
            raise ConformanceFailure(("contract:info",), message, "info", "returns another value", calls=self._calls_sent(), diff=diff)
        if self.check.delay and self._claims(Capability.DELAY_KNOB):  # backups slower than restores: a missing backup->restore wait shows
            self.runtime.set_transfer_delay(self.check.delay, TransferKind.RESTORE)
            self.runtime.set_transfer_delay(3 * self.check.delay, TransferKind.BACKUP)
        if schedule_seed is not None and self._claims(Capability.SCHEDULE_SEED):
            self.runtime.set_schedule_seed(schedule_seed)
        self.issued: list[RequestRuntimeHandle] = []
        self.renaming = Renaming()

    def teardown(self) -> None:
        """Leave no transfer running into the next case (a fresh runtime is made anyway)."""
        if self.runtime is not None and hasattr(self.runtime, "close"):
            self.runtime.close()
        if self.store is not None:
            self.store.close()


def _fixed_info(info: RuntimeInfo) -> RuntimeInfo:
    """The fields of info() the model can predict: not the claims or page bytes, which are the runtime's."""
    return attrs.evolve(info, capabilities=frozenset(), page_bytes=0)


def _describe(problems: list[Problem]) -> str:
    return "; ".join(f"{where}: {what}" for where, what in problems)


def _not_a_rule(method):
    """`method` as a plain method: callable by a reproduction script or a test, never drawn as a rule."""

    def plain(self, *args, **kwargs):
        return method(self, *args, **kwargs)

    plain.__name__ = method.__name__
    return plain


def machine_for(target: Target | str, options: dict | None = None, check: str = "core") -> type[RuntimeConformance]:
    """The state machine class for one runtime and one check, sized from the runtime's info().

    Called with a spec string and options (as printed at the top of a reproduction) or a
    `Target`. One runtime is made here to read sizes and claims; each test case makes its own.
    """
    if isinstance(target, str):
        target = Target(target, tuple(sorted((options or {}).items())))
    the_check = CHECKS[check]
    info = target.new().info()
    rid, ps = info.runtime_id, info.page_size
    row_pages = info.max_request_tokens // ps
    tiers = the_check.tiers and Capability.L2 in info.capabilities

    requests = Bundle("requests")
    extents = Bundle("extents")
    batches = Bundle("batches")
    # Where transfers run (tier moves), which calls succeed depends on which transfers have
    # completed (deferred frees decide OutOfPages), that is on the runtime's clock, with the
    # delay knob or without (a runtime's copy worker). Hypothesis must meet the same draws
    # when it replays a case, so there no rule's validity may depend on the state: the rules
    # drawing from bundles are left out (`TIMED_LEAVES_OUT`) and preconditions on the
    # model's state hold always (the rules return early instead).
    # A runtime that claims SCHEDULE_SEED replays a case exactly from its drawn seed, so there
    # every rule stays in.
    storage = the_check.name == "storage" and Capability.L3 in info.capabilities
    timed = (tiers or storage or (bool(the_check.delay) and Capability.DELAY_KNOB in info.capabilities)) and Capability.SCHEDULE_SEED not in info.capabilities

    def when(condition):
        return precondition(lambda self: timed or condition(self))

    token_id = st.integers(0, min(99, info.vocab_size - 1))  # ids the runtime's vocabulary holds (InvalidArgument is misuse's)
    tokens = st.lists(token_id, max_size=2 * ps + 1).map(tuple)
    some_tokens = st.lists(token_id, min_size=1, max_size=2 * ps + 1).map(tuple)
    attach = st.one_of(st.just(()), st.lists(extents, min_size=1, max_size=2).map(tuple))
    item = st.builds(BatchItem, request=requests, input_ids=some_tokens, append_previous_output=st.booleans())
    item_with_prefix = st.builds(BatchItem, request=requests, input_ids=tokens, attach=attach, append_previous_output=st.booleans())
    extent_intents = [Release] + ([Backup, Restore, Demote, Drop] if tiers else [])
    request_intent = st.one_of(
        st.builds(Publish, request=requests, first_page=st.integers(0, row_pages), page_count=st.integers(1, 3)),
        st.builds(Close, request=requests),
    )
    intent = st.one_of(request_intent, *(st.builds(kind, extent=extents) for kind in extent_intents))
    by_request = lambda item: item.request  # noqa: E731 - one item per request, else InvalidPlan
    tier_intent = st.one_of(*(st.builds(kind, extent=extents) for kind in (Backup, Restore, Demote, Drop)))
    # One interleaving per case, drawn like any argument: a failure replays with its seed.
    seeded = {"schedule_seed": st.integers(0, 2**16 - 1)} if Capability.SCHEDULE_SEED in info.capabilities else {}

    class Machine(RuntimeConformance):
        """Rules over the protocol's operations, valid and deliberately invalid."""

        @initialize(**seeded)
        def start(self, schedule_seed=None):
            """A fresh runtime; where it claims SCHEDULE_SEED, the case's interleaving is drawn (and printed) here."""
            self._start(schedule_seed)

        # -- requests --

        @when(lambda self: not all(slot.live for slot in self.model.state.slots))
        @rule(target=requests)
        def open_request(self):
            if all(slot.live for slot in self.model.state.slots):
                return multiple()
            handle = self._call("open_request")
            return multiple() if handle is None else handle

        @precondition(lambda self: self.bundle("requests"))
        @rule(request=requests)
        def close_request(self, request):
            self._call("close_request", request)

        # -- batches --

        @precondition(lambda self: self.bundle("requests"))
        @rule(target=batches, items=st.lists(item, min_size=1, max_size=3, unique_by=by_request), intents=st.lists(request_intent, max_size=2))
        def prepare_batch(self, items, intents):
            handle = self._call("prepare_batch", BatchPlan(tuple(items), tuple(intents)))
            return multiple() if handle is None else handle

        @precondition(lambda self: self.bundle("requests"))
        @rule(target=extents, items=st.lists(item, min_size=1, max_size=3, unique_by=by_request), intents=st.lists(request_intent, max_size=2))
        def run_batch(self, items, intents):
            """prepare_batch then execute_batch at once: how a scheduler spends most steps."""
            handle = self._call("prepare_batch", BatchPlan(tuple(items), tuple(intents)))
            done = None if handle is None else self._call("execute_batch", handle)
            return multiple() if done is None else multiple(*done.published)

        @precondition(lambda self: self.bundle("extents") and self.bundle("requests"))
        @rule(
            target=batches,
            items=st.lists(item_with_prefix, min_size=1, max_size=3, unique_by=by_request),
            intents=st.lists(intent, max_size=3),
        )
        def prepare_batch_with_extents(self, items, intents):
            handle = self._call("prepare_batch", BatchPlan(tuple(items), tuple(intents)))
            return multiple() if handle is None else handle

        @rule(target=extents, batch=batches)
        def execute_batch(self, batch):
            done = self._call("execute_batch", batch)
            return multiple() if done is None else multiple(*done.published)

        @rule(batch=batches)
        def cancel_batch(self, batch):
            self._call("cancel_batch", batch)

        # -- guided: what a scheduler does; arguments chosen from the model's state, so deep
        # states (full pages, shared prefixes, host copies) are reached, and steps stay replayable

        @rule(target=extents, picks=st.lists(st.integers(0, 7), max_size=3), n=st.integers(1, 2 * ps + 1), insert=st.booleans())
        def schedule_step(self, picks, n, insert):
            """One scheduler step over the picked live requests (a new one if none is live): decode where
            there is an output to append, else n new tokens; with `insert`, publish each row's full pages."""
            live = [i for i, slot in enumerate(self.model.state.slots) if slot.live]
            if not live:
                self._call("open_request")
                return multiple()
            items, intents = [], []
            for slot_id in dict.fromkeys(live[p % len(live)] for p in picks or [0]):
                slot = self.model.state.slots[slot_id]
                request = RequestRuntimeHandle(rid, self.model.state.epoch, slot_id, slot.generation)
                decode = slot.produced > slot.appended
                items.append(BatchItem(request, () if decode else tuple(range(n)), append_previous_output=decode))
                full = (slot.reserved_tokens + (1 if decode else n)) // ps
                if insert and full:
                    intents.append(Publish(request, 0, full))
            handle = self._call("prepare_batch", BatchPlan(tuple(items), tuple(intents)))
            done = None if handle is None else self._call("execute_batch", handle)
            return multiple() if done is None else multiple(*done.published)

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), n=st.integers(1, ps), race=st.sampled_from(["none", "drop", "drop_then_backup", "demote"]))
        def reuse_prefix(self, i, n, race="none"):
            """A new request hits the i-th live extent: open, attach it (restoring what is not on device), compute.
            With a `race` (tiers), before the batch runs the tree evicts the extent, or, while the restore
            may still run, drops the host copy it reads, and then backs up another extent, which may take
            the host page the restore still reads."""
            if not self.model.state.extents:
                return
            extent, pages = self._evicted_extent(i) if tiers and race != "none" else self._live_extent(i)
            request = self._call("open_request")
            if request is None:
                return
            missing = any(Tier.L1 not in self.model.state.pages[p].copies for p in pages)
            intents = (Restore(extent),) if missing and tiers else ()
            handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(n)), (extent,)),), intents))
            if tiers and race == "demote":  # the attaching batch has not run: its row maps the pages (ExtentInUse)
                self._call("submit", (Backup(extent), Demote(extent)))
            elif tiers and race != "none" and handle is not None:
                self._call("submit", (Drop(extent),))
                others = [ref for ref in map(lambda k: self._live_extent(k)[0], range(len(self.model.state.extents))) if ref != extent]
                if race == "drop_then_backup" and others:
                    self._call("submit", (Backup(others[i % len(others)]),))
            if handle is not None:
                self._call("execute_batch", handle)

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), how=st.sampled_from(["release", "retain", "split"]))
        def tree_operation(self, i, how):
            """The tree releases, retains or splits the i-th live extent; after a split, a late
            release of the pre-split ref must be stale (scenario 10)."""
            if not self.model.state.extents:
                return
            extent, _ = self._live_extent(i)
            if how == "split":
                if self._call("split", extent, max(1, extent.page_count // 2)) is not None:
                    self._call("retain", extent)
                    self._call("release", extent)
            else:
                self._call(how, extent)

        @when(lambda self: any(slot.live for slot in self.model.state.slots))
        @rule(i=st.integers(0, 7))
        def finish_request(self, i):
            """The i-th live request finishes (its pages may still be backing up: scenario 3)."""
            live = [n for n, slot in enumerate(self.model.state.slots) if slot.live]
            if not live:
                return
            slot = live[i % len(live)]
            self._call("close_request", RequestRuntimeHandle(rid, self.model.state.epoch, slot, self.model.state.slots[slot].generation))

        @rule(
            i=st.integers(0, 7),
            n=st.integers(1, 2 * ps + 1),
            how=st.sampled_from(
                [
                    "cancel_then_append",
                    "publish_reserved",
                    "close_older",
                    "cancel_earlier",
                    "execute_then_cancel",
                    "attach_reserved",
                    "close_intent_under_newer",
                ]
            ),
        )
        def pipeline(self, i, n, how):
            """Two-phase scheduling on the i-th live request: batch N is prepared, then, before or after it
            runs, what a scheduler may do next: cancel it and decode anyway (RequestBusy: a cancelled
            batch produced nothing), insert pages only reserved (InvalidPageRun), close a request of an
            older batch while a newer one holds another (RequestBusy), cancel N under a prepared N+1
            (BatchDependency), run N twice and cancel it after it ran (AlreadyExecuted), attach a prefix
            to the row N reserved but has not computed (InvalidPlan), or carry a Close of the request in N
            while a prepared N+1 holds it (RequestBusy at execute: the row N+1 extends must stay)."""
            if how == "close_intent_under_newer":
                request = self._idle_request(i)
            else:
                request = self._free_slot(i) if how in ("cancel_then_append", "attach_reserved") else self._live_request(i)
            if request is None:
                return
            closing = (Close(request),) if how == "close_intent_under_newer" else ()
            if closing:  # both batches get their pages, whatever the device holds (without tiers nothing else frees it)
                self._make_room(-(-n // ps) + 2, request)
            first = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(n))),), closing))
            if first is None:
                return
            slot = self.model.state.slots[request.slot_id]
            if how == "cancel_then_append":  # and the cancelled batch is neither cancelled nor run again (NotPrepared)
                self._call("cancel_batch", first)
                self._call("prepare_batch", BatchPlan((BatchItem(request, (), append_previous_output=True),)))
                self._call("cancel_batch", first)
                self._call("execute_batch", first)
            elif how == "publish_reserved":
                self._call("publish", request, 0, max(1, slot.reserved_tokens // ps))
                self._call("execute_batch", first)
            elif how == "close_older":
                other = self._live_request(i + 1)
                if other == request:
                    other = self._call("open_request")
                newer = None if other is None else self._call("prepare_batch", BatchPlan((BatchItem(other, (1,)),)))
                self._call("close_request", attrs.evolve(request, runtime_id=rid + "-other"))  # handle checks first: ForeignRuntime
                self._call("close_request", request)
                self._call("execute_batch", first)
                if newer is not None:
                    self._call("execute_batch", newer)
            elif how == "attach_reserved":  # the row has tokens reserved, none computed: attach is refused (InvalidPlan)
                if self.model.state.extents:
                    self._call("prepare_batch", BatchPlan((BatchItem(request, (1,), (self._live_extent(i)[0],)),)))
                self._call("execute_batch", first)
            elif how == "cancel_earlier":
                self._call("prepare_batch", BatchPlan((BatchItem(request, (), append_previous_output=True),)))
                self._call("cancel_batch", first)
            elif how == "close_intent_under_newer":  # N fails whole; N+1 cannot run before it (OutOfOrder); without N+1, N closes
                newer = self._call("prepare_batch", BatchPlan((BatchItem(request, (), append_previous_output=True),)))
                self._call("execute_batch", first)
                if newer is not None:
                    self._call("execute_batch", newer)
                    self._call("cancel_batch", newer)
                    self._call("execute_batch", first)
            else:  # and another runtime's copy of the handle is refused first (ForeignRuntime), and a second run of N
                self._call("execute_batch", attrs.evolve(first, runtime_id=rid + "-other"))
                self._call("execute_batch", first)
                self._call("execute_batch", first)
                self._call("cancel_batch", first)

        @when(lambda self: any(slot.live for slot in self.model.state.slots))
        @rule(target=extents, i=st.integers(0, 7), pages=st.integers(3, 5), at=st.integers(1, 4))
        def insert_long_prefix(self, i, pages, at):
            """A long prompt: the i-th live request computes `pages` full pages at once, the tree inserts
            them and splits the node where a later request diverges (an extent of 3+ pages cut anywhere)."""
            request = self._live_request(i)
            if request is None:
                return multiple()
            slot = self.model.state.slots[request.slot_id]
            tokens = pages * ps - slot.reserved_tokens % ps
            handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(tokens))),)))
            if handle is None or self._call("execute_batch", handle) is None:
                return multiple()
            full = self.model.state.slots[request.slot_id].num_tokens // ps
            extent = self._call("publish", request, full - pages, pages)
            if extent is None:
                return multiple()
            halves = self._call("split", extent, min(at, pages - 1))
            if halves is not None:  # a late split of the pre-split ref, as another tree path still holds it: StaleHandle
                self._call("split", extent, 1)
            return multiple() if halves is None else multiple(*halves)

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), how=st.sampled_from(["repeated", "rearranged"]), operation=st.sampled_from(["retain", "release", "split"]))
        def use_reordered_runs(self, i, how, operation):
            """A ref with a live extent's own page names, its runs repeated or in another order: never issued
            (UnknownHandle), however alike as a set."""
            if not self.model.state.extents:
                return
            extent, _ = self._live_extent(i)
            names = pageruns.expand(extent.page_runs)
            if how == "rearranged" and len(names) > 1:
                runs = pageruns.coalesce(names[1:] + names[:1])
            else:
                runs = extent.page_runs + extent.page_runs
            forged = attrs.evolve(extent, page_runs=runs)
            self._call(operation, *((forged, 1) if operation == "split" else (forged,)))

        @rule(i=st.integers(0, 7), how=st.sampled_from(["generation_ahead", "runs_cut", "runs_rotated"]), operation=st.sampled_from(["retain", "release"]))
        def forge_live_handle(self, i, how, operation):
            """A handle forged from a live one the runtime issued, each never issued (UnknownHandle): the i-th
            live request's with the generation its slot will have next; the i-th live extent's ref with a run
            of two or more pages cut in two (the same pages, other runs), or with its whole runs in another
            order (an extent of two or more runs, made when none is live: a row whose pages another row's
            first page interleaves)."""
            if how == "generation_ahead":
                request = self._live_request(i)
                if request is not None:
                    self._call("close_request", attrs.evolve(request, generation=request.generation + 1))
                return
            wanted = (lambda runs: any(run.page_count > 1 for run in runs)) if how == "runs_cut" else (lambda runs: len(runs) > 1)
            refs = [ref for ref in (self._live_extent(k)[0] for k in range(len(self.model.state.extents))) if wanted(ref.page_runs)]
            if not refs:
                made = self._publish_fresh(i) if how == "runs_cut" else self._publish_interleaved(i)
                refs = [made] if made is not None and wanted(made.page_runs) else []
            if not refs:
                return
            extent = refs[i % len(refs)]
            runs = extent.page_runs
            if how == "runs_cut":
                k = next(n for n, run in enumerate(runs) if run.page_count > 1)
                cut = (PageRun(runs[k].first_page, 1), PageRun(runs[k].first_page + 1, runs[k].page_count - 1))
                runs = runs[:k] + cut + runs[k + 1 :]
            else:
                runs = runs[1:] + runs[:1]
            self._call(operation, attrs.evolve(extent, page_runs=runs))

        # -- extents --

        @rule(target=extents, request=requests, first_page=st.integers(-1, row_pages), page_count=st.integers(0, 4))
        def publish(self, request, first_page, page_count):
            ref = self._call("publish", request, first_page, page_count)
            return multiple() if ref is None else ref

        @rule(target=extents, extent=extents, at_page=st.integers(-1, 5))
        def split(self, extent, at_page):
            halves = self._call("split", extent, at_page)
            return multiple() if halves is None else multiple(*halves)

        @rule(extent=extents)
        def retain(self, extent):
            self._call("retain", extent)

        @rule(extent=extents)
        def release(self, extent):
            self._call("release", extent)

        # -- completions --

        # No precondition on transfers in flight: that depends on the runtime's timing, and rule
        # choice must not (Hypothesis replays a case and needs the same draws).
        @rule()
        def poll_completions(self):
            self._completions("poll_completions")

        @rule()
        def wait_completions(self):
            self._completions("wait_completions")

        # -- misuse: forged handles and wrong calls --

        @rule(request=requests, forgery=st.sampled_from(["foreign", "next_epoch", "next_generation", "no_slot"]))
        def close_forged_request(self, request, forgery):
            forged = {
                "foreign": attrs.evolve(request, runtime_id=rid + "-other"),
                "next_epoch": attrs.evolve(request, epoch=request.epoch + 1),
                "next_generation": attrs.evolve(request, generation=request.generation + 1),
                "no_slot": attrs.evolve(request, slot_id=info.max_requests),
            }[forgery]
            self._call("close_request", forged)

        @rule(extent=extents, forgery=st.sampled_from(["foreign", "next_epoch", "unissued", "other_pages"]))
        def release_forged_extent(self, extent, forgery):
            forged = {
                "foreign": attrs.evolve(extent, runtime_id=rid + "-other"),
                "next_epoch": attrs.evolve(extent, epoch=extent.epoch + 1),
                "unissued": attrs.evolve(extent, generation=10**6),
                "other_pages": attrs.evolve(extent, page_runs=extent.page_runs + (PageRun(10**6, 1),)),
            }[forgery]
            self._call("release", forged)

        @rule(
            forgery=st.sampled_from(
                [
                    "request",
                    "extent",
                    "batch",
                    "empty_plan",
                    "open_when_full",
                    "beyond_free_pages",
                    "duplicate_and_unknown_intent",
                    "foreign_after_genuine",
                    "split_unknown",
                    "foreign_close",
                    "cancel_unprepared",
                    "stale_twice",
                ]
            ),
            i=st.integers(0, 7),
        )
        def misuse(self, forgery, i=0):
            """One wrong call; the later forgeries put two faults in one call (which is raised is fixed: §3);
            `plain_plan_errors` sends the plain plans' errors through here too."""
            plain = (
                "empty_item",
                "past_row_end",
                "duplicate_and_unknown_intent",
                "foreign_after_genuine",
                "publish_partial_page",
                "publish_negative_first_page",
            )
            if forgery in plain:
                request = self._live_request(i)
                if request is None:
                    return
                slot = self.model.state.slots[request.slot_id]
                if forgery == "empty_item":  # an item with nothing to compute beside a plain one: InvalidPlan
                    other = self._live_request(i + 1)
                    if other == request:
                        other = self._call("open_request")
                    if other is not None:
                        self._call("prepare_batch", BatchPlan((BatchItem(request, (1, 2)), BatchItem(other, ()))))
                elif forgery == "past_row_end":  # a plain prefill one token past max_request_tokens: RowFull
                    tokens = self.info.max_request_tokens - slot.reserved_tokens + 1
                    self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(tokens))),)))
                elif forgery == "duplicate_and_unknown_intent":  # the intent's handle is checked first: UnknownHandle
                    forged = CacheExtentRef(rid, self.model.state.epoch, 10**6, (PageRun(0, 1),))
                    self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)), BatchItem(request, (2,))), (Release(forged),)))
                elif forgery == "foreign_after_genuine":  # the second item's handle is another runtime's: ForeignRuntime
                    foreign = attrs.evolve(request, runtime_id=rid + "-other", slot_id=(request.slot_id + 1) % info.max_requests)
                    self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)), BatchItem(foreign, (2,)))))
                elif forgery == "publish_negative_first_page":  # [-1, full): begun before the row's first page, ended at its last full one
                    self._call("publish", request, -1, slot.num_tokens // ps + 1)
                else:  # the row's partly written last page (one token computed into it first): InvalidPageRun
                    if slot.num_tokens % ps == 0 and slot.num_tokens == slot.reserved_tokens:
                        handle = self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)),)))
                        if handle is not None:
                            self._call("execute_batch", handle)
                    self._call("publish", request, self.model.state.slots[request.slot_id].num_tokens // ps, 1)
                    handle = self._call("prepare_batch", BatchPlan((BatchItem(request, (1,)),)))
                    if handle is not None:  # the row goes back to its length inside the page
                        self._call("cancel_batch", handle)
            elif forgery == "stale_twice":  # the slot closed and reopened twice since this handle: StaleHandle
                request = self._call("open_request")
                current = request
                for _ in range(2):  # open_request takes the lowest free slot: the one just closed
                    if current is None:
                        break
                    self._call("close_request", current)
                    current = self._call("open_request")
                if request is not None and current is not None:
                    self._call("close_request", request)
            elif forgery == "foreign_close":
                request = self._live_request(i)
                if request is not None:
                    self._call("close_request", attrs.evolve(request, runtime_id=rid + "-other"))
            elif forgery == "cancel_unprepared":
                self._call("cancel_batch", PreparedBatchHandle(rid, self.model.state.epoch, 10**6))
                self._call("execute_batch", PreparedBatchHandle(rid, self.model.state.epoch, 10**6 + 1))
            elif forgery == "split_unknown":
                self._call("split", CacheExtentRef(rid, self.model.state.epoch, 10**6, (PageRun(0, 2),)), 1)
            elif forgery == "beyond_free_pages":  # scenario 6: one page more than is free, when some are
                if not any(slot.live for slot in self.model.state.slots) and self._call("open_request") is None:
                    return
                slots = self.model.state.slots
                slot_id = min((i for i, s in enumerate(slots) if s.live), key=lambda i: slots[i].reserved_tokens)
                slot, free = slots[slot_id], len(self.model.state.pools[Tier.L1].free)
                tokens = (len(slot.pages) + free + 1) * ps - slot.reserved_tokens
                if free and slot.reserved_tokens + tokens <= self.info.max_request_tokens:
                    request = RequestRuntimeHandle(rid, self.model.state.epoch, slot_id, slot.generation)
                    self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(tokens))),)))
            elif forgery == "empty_plan":
                self._call("prepare_batch", BatchPlan(()))
            elif forgery == "open_when_full":
                while self._call("open_request") is not None:
                    pass
            elif forgery == "request":
                self._call("close_request", RequestRuntimeHandle(rid, 0, 0, 0))
            elif forgery == "extent":
                self._call("retain", CacheExtentRef(rid, 0, 1, (PageRun(0, 1),)))
            else:
                self._call("execute_batch", PreparedBatchHandle(rid, 0, 0))

        @rule(i=st.integers(0, 7))
        def plain_plan_errors(self, i):
            """The errors of plain plans that a fast path may skip, one after another on the i-th live request:
            an item with nothing to compute beside a plain one (InvalidPlan), a prefill one token past
            max_request_tokens (RowFull), a publish of the row's partly written last page and one of a
            negative first page, counted back from the row's end (InvalidPageRun both)."""
            for forgery in ("empty_item", "past_row_end", "publish_partial_page", "publish_negative_first_page"):
                self.misuse(forgery, i)

        @rule(batch=batches, forgery=st.sampled_from(["foreign", "unprepared"]), execute=st.booleans())
        def use_forged_batch(self, batch, forgery, execute):
            forged = {
                "foreign": attrs.evolve(batch, runtime_id=rid + "-other"),
                "unprepared": attrs.evolve(batch, batch_id=batch.batch_id + 10**6),
            }[forgery]
            self._call("execute_batch" if execute else "cancel_batch", forged)

        @rule(extent=extents)
        def submit_release(self, extent):
            self._call("submit", (Release(extent),))

    if tiers:

        @precondition(lambda self: self.bundle("extents"))
        @rule(intents=st.lists(tier_intent, min_size=1, max_size=3))
        def submit(self, intents):
            self._call("submit", tuple(intents))

        Machine.submit = submit

        @when(lambda self: self.model.state.extents)
        @rule(
            i=st.integers(0, 7),
            moves=st.lists(st.sampled_from([Backup, Demote, Restore, Drop]), min_size=1, max_size=3),
            in_plan=st.booleans(),
        )
        def move_extent(self, i, moves, in_plan=False):
            """The tree moves the i-th live extent between tiers (backup then demote: eviction to L2), through
            submit or, `in_plan`, as intents of a batch that decodes a live request (applied after compute)."""
            if not self.model.state.extents:
                return
            extent, _ = self._live_extent(i)
            intents = tuple(move(extent) for move in moves)
            request = self._live_request(i) if in_plan else None
            if request is None:
                self._call("submit", intents)
                return
            slot = self.model.state.slots[request.slot_id]
            decode = slot.produced > slot.appended
            handle = self._call("prepare_batch", BatchPlan((BatchItem(request, () if decode else (1,), append_previous_output=decode),), intents))
            if handle is not None:
                self._call("execute_batch", handle)

        Machine.move_extent = move_extent

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), n=st.integers(1, ps), poll=st.booleans(), drop=st.booleans())
        def evict_then_hit(self, i, n, poll, drop=False):
            """Scenario 1: the rows reading the i-th live extent finish, the tree evicts it to L2 (backup,
            demote), and a new request hits it while the backup may still be in flight (restore, compute).
            Extents of several pages not yet on the host go first: their restore waits on the backup."""
            if not self.model.state.extents:
                return
            pages_ = self.model.state.pages
            wide = [
                n
                for n, (_, record) in enumerate(sorted(self.model.state.extents.items()))
                if len(record.pages) > 1 and any(Tier.L2 not in pages_[p].copies for p in record.pages)
            ]
            extent, extent_pages = self._live_extent(wide[i % len(wide)] if wide else i)
            pages = set(extent_pages)
            for slot_id, slot in enumerate(self.model.state.slots):
                if slot.live and pages & set(slot.pages):
                    self._call("close_request", RequestRuntimeHandle(rid, self.model.state.epoch, slot_id, slot.generation))
            self._call("submit", (Backup(extent), Demote(extent)))
            if poll:
                self._completions("poll_completions")
            request = self._call("open_request")
            if request is not None:
                plan = BatchPlan((BatchItem(request, tuple(range(n)), (extent,)),), (Restore(extent),))
                handle = self._call("prepare_batch", plan)
                if drop:  # the host copy is dropped while the restore may still read it
                    self._call("submit", (Drop(extent),))
                if handle is not None:
                    self._call("execute_batch", handle)

        Machine.evict_then_hit = evict_then_hit

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), drop=st.booleans())
        def end_pages_under_restore(self, i, drop):
            """The tree restores the i-th evicted extent (evicting it first if it has no page off the device),
            optionally drops its host copy while the restore runs, and releases every ref of it before
            the restore lands: the page names end while the restore still reads their host pages, whose
            free must wait for the restore (O3) however the runtime frees them."""
            if not self.model.state.extents:
                self._publish_fresh(i)
            if not self.model.state.extents:
                return
            extent, pages = self._evicted_extent(i)
            if all(Tier.L1 in self.model.state.pages[p].copies for p in pages):
                self._evict(extent, pages)
            if not self._live(extent) or self._call("submit", (Restore(extent),)) is None:
                return
            if drop:
                self._call("submit", (Drop(extent),))
            self._close_rows_over(pages)
            generation = self.renaming.model_args(extent).generation
            for _ in range(self.model.state.extents[generation].refcount if generation in self.model.state.extents else 0):
                self._call("release", extent)

        Machine.end_pages_under_restore = end_pages_under_restore

        @rule(i=st.integers(0, 7), n=st.integers(1, ps))
        def hit_two_evicted(self, i, n):
            """Two requests hit two evicted extents in one batch: both restores in the plan, the batch's
            compute reads the pages of each, so it waits for every restore, not only the first (O1)."""
            pair = self._disjoint_extents(i)
            for _ in range(2):  # two extents over pages of their own, made when missing
                if pair is not None:
                    break
                self._publish_fresh(i)
                pair = self._disjoint_extents(i)
            if pair is None:
                return
            (a, a_pages), (b, b_pages) = pair
            self._evict(a, a_pages)
            self._evict(b, b_pages)
            if not (self._live(a) and self._live(b)):
                return
            first = self._free_slot(i)
            second = self._free_slot(i + 1)
            if first is None or second is None or first == second:
                return
            on_device = self.model.state.pages
            restores = tuple(Restore(ref) for ref, pages in ((a, a_pages), (b, b_pages)) if any(Tier.L1 not in on_device[p].copies for p in pages))
            items = (BatchItem(first, tuple(range(n)), (a,)), BatchItem(second, tuple(range(n)), (b,)))
            handle = self._call("prepare_batch", BatchPlan(items, restores))
            if handle is not None:
                self._call("execute_batch", handle)

        Machine.hit_two_evicted = hit_two_evicted

        @rule(i=st.integers(0, 7), how=st.sampled_from(["demote_half_backed", "drop_half_resident"]))
        def move_part_of_overlap(self, i, how):
            """The tree holds two extents over one row's pages, one page and both pages, and moves the longer
            one when only part of it can go: a Demote when only its first page has a host copy
            (NotBackedUp), or a Drop when its second page, demoted through the shorter extent, has no
            device copy (WouldLoseData). Every page of an extent is checked, not the first."""
            request = self._free_slot(i)
            if request is None:
                return
            self._make_room(2, request)
            handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(2 * ps))),)))
            if handle is None or self._call("execute_batch", handle) is None:
                return
            slot = self.model.state.slots[request.slot_id]
            first = slot.num_tokens // ps - 2
            part = self._call("publish", request, first + 1 if how == "drop_half_resident" else first, 1)
            whole = self._call("publish", request, first, 2)
            if part is None or whole is None:
                return
            self._call("submit", (Backup(part if how == "demote_half_backed" else whole),))
            self._completions("wait_completions")
            self._call("close_request", request)
            if how == "demote_half_backed":
                self._call("submit", (Demote(whole),))
                return
            self._call("submit", (Demote(part),))
            self._call("submit", (Drop(whole),))

        Machine.move_part_of_overlap = move_part_of_overlap

        if the_check.delay:

            @when(lambda self: self.model.state.extents)
            @rule(i=st.integers(0, 7), n=st.integers(1, ps), drop=st.booleans())
            def hit_while_backing_up(self, i, n, drop):
                """Scenario 1 again, without a poll: with slow transfers the hit surely comes while the backup
                runs, and its restore keeps the dropping device copies (the checks with a delay draw it twice
                as often as the others); without `drop`, on a prefix a hit extended by one page, so that only
                its last page is still backing up."""
                if not self.model.state.extents:
                    return
                if drop:
                    evict_then_hit(self, i, n, False, drop)
                    return
                # A hit extends a cached prefix by a page; the longer prefix is evicted and hit again while
                # only its new page is backing up: the restore must wait for that page's backup.
                extent, pages = self._live_extent(i)
                self._call("submit", (Backup(extent),))
                self._completions("wait_completions")
                request = self._free_slot(i)
                missing = any(Tier.L1 not in self.model.state.pages[p].copies for p in pages)
                plan = BatchPlan((BatchItem(request, tuple(range(ps)), (extent,)),), (Restore(extent),) if missing else ())
                handle = None if request is None else self._call("prepare_batch", plan)
                if handle is None or self._call("execute_batch", handle) is None:
                    return
                longer = self._call("publish", request, 0, len(pages) + 1)
                self._call("close_request", request)
                if longer is None:
                    return
                for slot_id, slot in enumerate(self.model.state.slots):
                    if slot.live and set(pages) & set(slot.pages):
                        self._call("close_request", RequestRuntimeHandle(rid, self.model.state.epoch, slot_id, slot.generation))
                self._call("submit", (Backup(longer), Demote(longer)))
                hit = self._call("open_request")
                handle = None if hit is None else self._call("prepare_batch", BatchPlan((BatchItem(hit, (1,), (longer,)),), (Restore(longer),)))
                if handle is not None:
                    self._call("execute_batch", handle)

            Machine.hit_while_backing_up = hit_while_backing_up

        if the_check.name == "faults":

            @rule(kind=st.sampled_from([FaultKind.BACKUP, FaultKind.RESTORE, FaultKind.COMPUTE, FaultKind.LOST]), nth=st.integers(1, 3))
            def inject_fault(self, kind, nth):
                """A fault on the Nth backup, restore, compute or launch from now (FAULT_INJECTION): the model
                fails the same transfer or compute; a lost worker is the environment's step when the runtime says so."""
                if kind is FaultKind.LOST:
                    if not (self.lost_armed or self.model.state.lost):  # one worker death at a time
                        self.runtime.inject_fault(kind, nth)
                        self.lost_armed = True
                    return
                self.runtime.inject_fault(kind, nth)
                self.model.inject_fault(kind, nth)

            Machine.inject_fault = inject_fault

            @rule(site=st.sampled_from(["backup_under_demote", "restore_at_kv_ready", "restore_reported_first", "compute", "lost_worker"]), i=st.integers(0, 7))
            def fault_where_it_matters(self, site, i):
                """A fault at the moment it can lose the most (`_fault_where_it_matters`)."""
                self._fault_where_it_matters(site, i)

            Machine.fault_where_it_matters = fault_where_it_matters

        @when(lambda self: self.model.state.extents)
        @rule(demote=st.booleans())
        def evict_all(self, demote):
            """Memory pressure: the tree backs up every live extent (and, with `demote`, evicts them to the
            host once no row reads them), so host pages fill up and are freed and reused out of order."""
            if not self.model.state.extents:
                return
            for n in range(len(self.model.state.extents)):
                extent, pages = self._live_extent(n)
                if demote:  # the rows reading it finish first, as in scenario 1
                    for slot_id, slot in enumerate(self.model.state.slots):
                        if slot.live and set(pages) & set(slot.pages):
                            self._call("close_request", RequestRuntimeHandle(rid, self.model.state.epoch, slot_id, slot.generation))
                if not demote:  # a tree that evicts before backing up is refused where a page has no host copy (NotBackedUp)
                    self._call("submit", (Demote(extent),))
                self._call("submit", (Backup(extent), Demote(extent)) if demote else (Backup(extent),))

        Machine.evict_all = evict_all

        @rule(
            keep_free=st.integers(1, 3),
            pages=st.integers(3, 5),
            then=st.sampled_from(["extend_and_backup", "hit_without_restore", "hit_short_of_pages", "backup_when_full", "cycle_host", "backup_in_plan"]),
        )
        def fill_host(self, keep_free, pages, then):
            """A burst of long prompts, each inserted into the tree and evicted to the host once it finishes,
            until at most `keep_free` host pages (or no device page) are left; then the hard cases of a
            nearly full host: a hit extended by new pages and backed up (only the new pages need host
            pages), a hit attached without its Restore (NotResident), a hit whose restore and prefill need
            a device page more than is free (OutOfPages), a backup with no host page left, or the tree
            evicting everything newest first and refilling, so that a restore reads host pages out of order."""
            last = None
            for _ in range(8):
                size = min(pages, len(self.model.state.pools[Tier.L2].free) - keep_free, len(self.model.state.pools[Tier.L1].free))
                request = self._free_slot(0) if size >= 1 else None
                if request is None:
                    break
                handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(size * ps))),)))
                if handle is None or self._call("execute_batch", handle) is None:
                    break
                extent = self._call("publish", request, 0, size)
                self._call("close_request", request)
                if extent is None or self._call("submit", (Backup(extent), Demote(extent))) is None:
                    break
                self._completions("poll_completions")  # the scheduler's next step: device pages of finished backups come free
                last = extent
            if last is None or not self._live(last):
                return
            if then == "cycle_host":
                for generation in sorted(self.model.state.extents, reverse=True):
                    self._call("release", self.renaming.runtime_ref(self._model_ref(generation)))
                request = self._free_slot(0)
                handle = None if request is None else self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(pages * ps))),)))
                if handle is None or self._call("execute_batch", handle) is None:
                    return
                last = self._call("publish", request, 0, pages)
                self._call("close_request", request)
                if last is None or self._call("submit", (Backup(last), Demote(last))) is None:
                    return
                # Write-back keeps the device copies until the backup lands: a hit before it would
                # keep them instead of reading the host pages (nothing moves), so the backup lands first.
                self._completions("wait_completions")
                then = "extend_and_backup"
            if then == "backup_when_full":
                for n in range(len(self.model.state.extents)):
                    self._call("submit", (Backup(self._live_extent(n)[0]),))
                return
            if then == "backup_in_plan":
                self._backup_in_plan_when_full()
                return
            request = self._free_slot(1)
            if request is None:
                return
            if then == "hit_without_restore":
                self._call("prepare_batch", BatchPlan((BatchItem(request, (1,), (last,)),)))
                return
            if then == "hit_short_of_pages":
                free = len(self.model.state.pools[Tier.L1].free) - last.page_count
                if free >= 0 and (free + 1) * ps <= self.info.max_request_tokens - last.page_count * ps:
                    self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range((free + 1) * ps)), (last,)),), (Restore(last),)))
                return
            handle = self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(ps)), (last,)),), (Restore(last),)))
            if handle is None or self._call("execute_batch", handle) is None:
                return
            extended = self._call("publish", request, 0, last.page_count + 1)
            if extended is not None:
                self._call("submit", (Backup(extended),))

        Machine.fill_host = fill_host

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), how=st.sampled_from(["short_of_pages", "no_restore", "drop_only_copy", "demote_attached"]))
        def hit_under_pressure(self, i, how):
            """A hit on the i-th live extent when it goes wrong: its restore and a plain prefill in one plan
            need one device page more than is free (OutOfPages, nothing started), it is attached without
            its Restore while only on the host (NotResident), its only copy, on the host, is dropped
            (WouldLoseData), or it is evicted while a prepared batch has attached it (ExtentInUse)."""
            if not self.model.state.extents:
                return
            extent, pages = self._live_extent(i) if how == "demote_attached" else self._evicted_extent(i)
            if how == "drop_only_copy":
                self._call("submit", (Drop(extent),))
                return
            request = self._live_request(i)
            if request is None:
                return
            if how == "demote_attached":
                fresh = self._free_slot(i)
                if fresh is None:
                    return
                handle = self._call("prepare_batch", BatchPlan((BatchItem(fresh, (1,), (extent,)),), (Restore(extent),)))
                self._call("submit", (Backup(extent), Demote(extent)))
                if handle is not None:
                    self._call("execute_batch", handle)
                return
            if how == "no_restore":
                fresh = self._free_slot(i)
                if fresh is not None:
                    self._call("prepare_batch", BatchPlan((BatchItem(fresh, (1,), (extent,)),)))
                return
            request = self._live_request(i)  # the row of the request above may have been freed
            if request is None:
                return
            missing = [p for p in pages if Tier.L1 not in self.model.state.pages[p].copies]
            slot = self.model.state.slots[request.slot_id]
            free = len(self.model.state.pools[Tier.L1].free)
            new_pages = max(1, free - len(missing) + 1)
            tokens = new_pages * ps - (-slot.reserved_tokens % ps)
            if tokens >= 1 and slot.reserved_tokens + tokens <= self.info.max_request_tokens:
                self._call("prepare_batch", BatchPlan((BatchItem(request, tuple(range(tokens))),), (Restore(extent),)))

        Machine.hit_under_pressure = hit_under_pressure

        @when(lambda self: self.model.state.extents)
        @rule(i=st.integers(0, 7), forgery=st.sampled_from(["unissued", "released"]))
        def submit_two_faults(self, i, forgery):
            """One submit whose first move fails its own precondition and whose second has a bad handle:
            every handle is checked before any move (§4.11), so the handle's error is the one raised."""
            if not self.model.state.extents:
                return
            extent, pages = self._live_extent(i)
            copies = [self.model.state.pages[p].copies for p in pages]
            first = Demote(extent) if any(Tier.L2 not in c for c in copies) else Drop(extent) if any(Tier.L1 not in c for c in copies) else Restore(extent)
            bad = attrs.evolve(extent, generation=10**6) if forgery == "unissued" else extent
            if forgery == "released":  # a ref released to zero, kept by a careless tree
                halves = self._call("split", extent, 1) if extent.page_count > 1 else None
                if halves is None:
                    return
                first, bad = attrs.evolve(first, extent=halves[0]), extent
            self._call("submit", (first, Backup(bad)))

        Machine.submit_two_faults = submit_two_faults

    if storage:

        @rule(i=st.integers(0, 7), where=st.sampled_from(["submit", "plan"]), fail=st.booleans())
        def persist(self, i, where, fail):
            """Control persists a cached extent to L3 (`_persist`), its store write failing or not."""
            self._persist(i, where, fail)

        Machine.persist = persist

        @rule(i=st.integers(0, 7), count=st.integers(1, 3), gone=st.sampled_from(["kept", "evicted", "kept_then_asked", "read_failed"]), execute=st.booleans())
        def fetch(self, i, count, gone, execute):
            """A prefix hit in L3 is fetched into a new request's row (`_fetch`): its last object kept, or
            removed behind the runtime's back first (MISS), or kept and asked about with `l3_exists` first,
            or kept but its store read failing (STORE)."""
            self._fetch(i, count, evict=gone == "evicted", ask=gone == "kept_then_asked", execute=execute, fail_read=gone == "read_failed")

        Machine.fetch = fetch

        @rule(i=st.integers(0, 7), known=st.integers(0, 3))
        def l3_exists(self, i, known):
            """Control asks which of some persisted keys, and a key never written, the store holds."""
            self._l3_exists(self.persisted[i % len(self.persisted)][:known] if self.persisted else ())

        Machine.l3_exists = l3_exists

        @rule(i=st.integers(0, 7), count=st.integers(1, 3), fail_read=st.booleans())
        def end_under_l3(self, i, count, fail_read):
            """Page names end under L3 transfers in flight, which then land: an extent released right after its
            persist starts (`_end_under_persist`), then a fetch of those objects planned and at once its batch
            cancelled and its request closed (`_fetch` with `cancel`), its store read failing or not."""
            self._end_under_persist(i)
            self._fetch(i, count, evict=False, ask=False, execute=False, fail_read=fail_read, cancel=True)

        Machine.end_under_l3 = end_under_l3

        if Capability.SCHEDULE_SEED not in info.capabilities:  # a simulated stream runs the held write on the caller's thread

            @rule(i=st.integers(0, 7))
            def hold_store_writes(self, i):
                """Store writes held while other steps take staging (`_hold_store_writes`)."""
                self._hold_store_writes(i)

            Machine.hold_store_writes = hold_store_writes

    if the_check.restart and Capability.RESTART in info.capabilities:

        @when(lambda self: self.model.state.calls["execute_batch"])
        @rule(busy=st.booleans(), i=st.integers(0, 7))
        def restart(self, busy=False, i=0):
            """Restart; when `busy`, with work in flight: the tree evicted the i-th live extent (its rows
            finish, backup, demote) and a request hit it (its restore waits on the backup), and the
            restart comes before the batch runs: the restart must drain both."""
            if not self.model.state.calls["execute_batch"]:
                return
            stale = None
            if busy and tiers and not self.model.state.extents:  # nothing cached yet: a request computes and publishes two pages
                self._publish_fresh(i)
            if busy and tiers and self.model.state.extents:
                extent, pages = self._live_extent(i)
                for slot_id, slot in enumerate(self.model.state.slots):
                    if slot.live and set(pages) & set(slot.pages):
                        self._call("close_request", RequestRuntimeHandle(rid, self.model.state.epoch, slot_id, slot.generation))
                self._call("submit", (Backup(extent), Demote(extent)))
                request = self._call("open_request")
                if request is not None:  # the batch never runs: its restore, after the backup, is in flight
                    stale = self._call("prepare_batch", BatchPlan((BatchItem(request, (1,), (extent,)),), (Restore(extent),)))
            self._call("restart")
            if stale is not None:  # a batch of the old epoch: StaleHandle
                self._call("execute_batch", stale)

        Machine.restart = restart

        @rule(i=st.integers(0, 7))
        def retain_reissued_ref(self, i):
            """Restart, a new request publishes two pages, restart again and the same again: the second epoch
            issues the first's ref anew but for its epoch (numbering starts over, §2.2), and a late retain of
            the first epoch's ref is StaleHandle by its epoch alone (§3, check 2)."""
            refs = []
            for _ in range(2):
                self._call("restart")
                refs.append(self._publish_fresh(i))
            if refs[0] is not None:
                self._call("retain", refs[0])

        Machine.retain_reissued_ref = retain_reissued_ref

    for name in the_check.leaves_out | (TIMED_LEAVES_OUT if timed else frozenset()):
        if hasattr(Machine, name):  # no longer a rule Hypothesis draws; still a method a script can call
            setattr(Machine, name, _not_a_rule(getattr(Machine, name)))
    Machine.__name__ = Machine.__qualname__ = "RuntimeConformance"
    Machine.target, Machine.check = target, the_check
    return Machine


def reproduction(target: Target, check: str, steps: list[str], set_aside: frozenset[str] = frozenset()) -> str:
    """A runnable script from Hypothesis's printed steps: imports and the machine, then the calls."""
    header = [
        "# Reproduces a conformance failure: run with python.",
        "from cacheruntime.protocol import *",
        "from cacheruntime.conformance.statemachine import machine_for",
        f"RuntimeConformance = machine_for({target.spec!r}, {dict(target.options)!r}, check={check!r})",
    ]
    if set_aside:  # the violations found before this one, tolerated as in the run that found it
        header.append(f"RuntimeConformance.set_aside = frozenset({sorted(set_aside)!r})")
    return "\n".join(header + steps) + "\n"
