"""`ReferenceModel`: the sections composed into one state machine, one method per operation.

One public method per operation of `spec/protocol.md`, named as there and as the
actions of `tla/CacheRuntime.tla`. Every call is a transaction (`operation`): it runs
on a copy of the state and commits only if no precondition failed, so a raised
`CacheRuntimeError` leaves the model exactly as it was. The work is done by the
sections (`handles`, `pages`, `extents`, `batches`, `transfers`); this module holds
what belongs to no one section: the transaction, the sizes, restart, the environment's
`complete_transfer`, and `probe()`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from cacheruntime.model.arguments import check_batch_fields, check_extent_fields, check_intents, check_keys, check_request_fields, require_int
from cacheruntime.model.batches import Batches, ComputeCannotRun
from cacheruntime.model.extents import Extents
from cacheruntime.model.handles import HandleChecks
from cacheruntime.model.pages import Pages
from cacheruntime.model.records import Page, fresh_state
from cacheruntime.model.transfers import Transfers
from cacheruntime.protocol import (
    TAG_DIGEST_MODULUS,
    AbstractState,
    Backup,
    BatchCompletion,
    BatchPlan,
    BatchView,
    CacheExtentRef,
    Capability,
    ComputeFailed,
    CopyState,
    Demote,
    Drop,
    ExtentView,
    FaultKind,
    Fetch,
    HostMode,
    InvalidArgument,
    InvalidPlan,
    NoL3,
    ObjectView,
    OutOfSlots,
    PageView,
    Persist,
    PoolView,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
    RuntimeFault,
    RuntimeInfo,
    SlotView,
    Tier,
    TierIntent,
    TransferCompletion,
    TransferTicket,
    TransferView,
)

#: The model's vocabulary when none is given: every token it returns (a `tag_digest`), so that
#: control can feed its outputs back as the next turn's input (the main job on the model does),
#: and larger than any tokenizer's, so that a trace of real token ids runs on it; a runtime
#: under test configures the model with its own.
MODEL_VOCAB_SIZE = TAG_DIGEST_MODULUS

P = ParamSpec("P")
R = TypeVar("R")


def operation(method: Callable[Concatenate[ReferenceModel, P], R]) -> Callable[Concatenate[ReferenceModel, P], R]:
    """Run a boundary operation as a transaction on a copy of the state; count it on success."""

    @functools.wraps(method)
    def transaction(self: ReferenceModel, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.state.lost and method.__name__ != "restart":
            raise RuntimeFault(f"{method.__name__}: the runtime's machinery is gone (RuntimeLost)")
        saved = self.state
        self.state = saved.clone()
        try:
            result = method(self, *args, **kwargs)
        except BaseException:
            self.state = saved
            raise
        self.state.calls[method.__name__] += 1
        return result

    return transaction


class ReferenceModel(Batches, Extents, Transfers, Pages, HandleChecks):
    """The contract as a state machine; a `RuntimeInterface` without compute or bytes."""

    def __init__(
        self,
        *,
        runtime_id: str = "model",
        page_size: int = 4,
        max_requests: int = 4,
        max_request_tokens: int = 64,
        l1_pages: int = 16,
        l2_pages: int = 32,
        vocab_size: int = MODEL_VOCAB_SIZE,
        l3: bool = False,
        host_mode: HostMode = HostMode.RESIDENT,
    ):
        """`l3` gives the model an L3 store (the L3 capability, spec/protocol.md §9) and `host_mode`
        says what its host pages are: a tier (resident, the L2 capability) or staging only
        (buffer_only, which needs `l3`). Without them the model is the model of §1-8."""
        if vocab_size < 1:
            raise ValueError("vocab_size must be >= 1")
        if host_mode is HostMode.BUFFER_ONLY and not l3:
            raise ValueError("host_mode=BUFFER_ONLY stages between the device and L3: it needs l3=True")
        if l3 and l2_pages < 1:
            raise ValueError("l3=True needs l2_pages >= 1: L3 transfers stage through host pages")
        if page_size < 1 or max_requests < 1 or l1_pages < 1 or l2_pages < 0 or max_request_tokens < page_size:
            raise ValueError("page_size, max_requests, l1_pages >= 1, l2_pages >= 0, max_request_tokens >= page_size")
        self.runtime_id = runtime_id
        self.page_size = page_size
        self.max_requests = max_requests
        self.max_request_tokens = max_request_tokens
        self.l1_pages = l1_pages
        self.l2_pages = l2_pages
        self.vocab_size = vocab_size
        self.l3 = l3
        self.host_mode = host_mode
        tags = {Tier.L1: [[0] * page_size for _ in range(l1_pages)], Tier.L2: [[0] * page_size for _ in range(l2_pages)]}
        self.state = fresh_state(0, [0] * max_requests, tags, 1)

    # -- info --------------------------------------------------------------------------

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The model claims everything a runtime can claim, except the test knobs."""
        caps = {Capability.ASYNC_TRANSFERS, Capability.INTROSPECTION, Capability.RESTART, Capability.TAGGED_COMPUTE}
        if self.has_l2:
            caps.add(Capability.L2)
        if self.l3:
            caps.add(Capability.L3)
        return frozenset(caps)

    @operation
    def info(self) -> RuntimeInfo:
        """Identity, epoch, sizes and capabilities."""
        return RuntimeInfo(
            runtime_id=self.runtime_id,
            epoch=self.state.epoch,
            page_size=self.page_size,
            max_requests=self.max_requests,
            max_request_tokens=self.max_request_tokens,
            l1_pages=self.l1_pages,
            l2_pages=self.l2_pages,
            capabilities=self.capabilities,
            vocab_size=self.vocab_size,
        )

    # -- request lifecycle -------------------------------------------------------------

    @operation
    def open_request(self) -> RequestRuntimeHandle:
        """OpenRequest: take the lowest free slot at its current generation."""
        for slot_id, slot in enumerate(self.state.slots):
            if not slot.live:
                slot.live = True
                slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0
                slot.produced = slot.appended = 0
                slot.last_output = None
                return RequestRuntimeHandle(self.runtime_id, self.state.epoch, slot_id, slot.generation)
        raise OutOfSlots(f"all {self.max_requests} request slots are live")

    @operation
    def close_request(self, request: RequestRuntimeHandle) -> None:
        """CloseRequest: close the slot now; the row's pages go with their last holder."""
        check_request_fields(request)
        self.close_row(request)

    # -- two-phase batches ---------------------------------------------------------------

    @operation
    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        """PrepareBatch: validate the plan, allocate pages, map prefixes, start restores."""
        return self.prepare(plan)

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """ExecuteBatch: wait for the restores compute reads, compute, then apply the intents.

        If a restore compute reads failed, or an injected compute fault picks this batch,
        the batch fails instead (FailCompute's outcome) and `ComputeFailed` is raised.
        """
        return self.run_execute(batch, fail=False)

    def fail_compute(self, batch: PreparedBatchHandle) -> None:
        """FailCompute (environment): `execute_batch` of `batch` whose compute fails; raises `ComputeFailed`."""
        self.run_execute(batch, fail=True)

    def run_execute(self, batch: PreparedBatchHandle, fail: bool) -> BatchCompletion:
        """`execute_batch` as a transaction; with `fail`, or when compute cannot run, the batch fails.

        Every precondition of `execute_batch` is checked (its intents against the state
        compute would have left) and raises as there, changing nothing; a failing batch and
        its later dependents fail (`fail_batches`), which is committed and counted as an
        `execute_batch` call (it crossed the boundary and changed the state) before
        `ComputeFailed` is raised (F2: nothing it would have written is visible).
        """
        if self.state.lost:
            raise RuntimeFault("execute_batch: the runtime's machinery is gone (RuntimeLost)")
        saved = self.state
        self.state = saved.clone()
        cause = "injected"
        try:
            check_batch_fields(batch)
            completion = self.execute(batch)
        except ComputeCannotRun as cannot:
            cause, fail = str(cannot), True
            injected = cannot.injected
        except BaseException:
            self.state = saved
            raise
        else:
            injected = False
        if fail:
            self.state = saved.clone()
            failed = self.fail_batches(batch.batch_id)
            if injected:
                self.count_toward_fault(FaultKind.COMPUTE, None)
            self.state.calls["execute_batch"] += 1
            raise ComputeFailed(f"the compute of batch {batch.batch_id} failed ({cause}); batches {list(failed)} failed with no effect", failed, cause)
        self.state.calls["execute_batch"] += 1
        return completion

    @operation
    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        """CancelBatch: undo the batch's allocations and mappings; started restores go on."""
        check_batch_fields(batch)
        self.cancel(batch)

    # -- extents -----------------------------------------------------------------------

    @operation
    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        """Publish: make full pages of a request's row an extent with one reference."""
        check_request_fields(request)
        require_int("first_page", first_page)
        require_int("page_count", page_count)
        return self.publish_pages(Publish(request, first_page, page_count))

    @operation
    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        """Split: end the extent's only ref and issue refs for its first `at_page` pages and the rest."""
        check_extent_fields(extent)
        require_int("at_page", at_page)
        return self.split_extent(extent, at_page)

    @operation
    def retain(self, extent: CacheExtentRef) -> None:
        """Retain: add a reference to a live extent."""
        check_extent_fields(extent)
        self.retain_extent(extent)

    @operation
    def release(self, extent: CacheExtentRef) -> None:
        """Release: drop a reference; with the last one the extent ends and its pages lose a holder."""
        check_extent_fields(extent)
        self.apply_intent(Release(extent))

    # -- tier moves --------------------------------------------------------------------

    @operation
    def submit(self, intents: tuple[TierIntent | Persist, ...]) -> tuple[TransferTicket, ...]:
        """Submit: apply standalone tier intents in order; a ticket per Backup and Restore."""
        check_intents("submit's intents", intents)
        tickets = []
        for intent in intents:
            if isinstance(intent, Fetch):
                raise InvalidPlan("a Fetch fills a request's row: send it in the plan of that request's item")
            if not isinstance(intent, (Backup, Restore, Demote, Drop, Persist)):
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
            self.check_intent_handles(intent)
        for intent in intents:
            if isinstance(intent, Restore):
                pages = self.restore_pages(intent.extent)
                self.require_free(Tier.L1, len(pages))
                tickets.append(self.start_restore(intent.extent))
            else:
                outcome = self.apply_intent(intent)
                if isinstance(outcome, TransferTicket):
                    tickets.append(outcome)
        self.judge_submit(intents, tuple(tickets))
        return tuple(tickets)

    def judge_submit(self, intents: tuple[object, ...], tickets: tuple[TransferTicket, ...]) -> None:
        """T4 on the model itself, right after a submit it accepted (the suite's runtimes are not
        yet held to it: spec/invariants.md, planned)."""
        from cacheruntime.invariants import InvariantViolation, T4_submit_applies

        violations = T4_submit_applies(self.probe(), intents, tickets)
        if violations:
            raise InvariantViolation("T4", violations)

    @operation
    def l3_exists(self, keys: tuple[str, ...]) -> tuple[bool, ...]:
        """L3Exists: per key, whether the store holds an object under it now. A hint: the store may
        remove the object before a fetch reads it (which then fails with MISS)."""
        check_keys("l3_exists's keys", keys)
        if not self.l3:
            raise NoL3("this runtime has no L3 store")
        return tuple(key in self.state.objects for key in keys)

    @operation
    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        """PollCompletions: the transfers completed since the last poll, each reported once."""
        return self.report()

    @operation
    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        """WaitCompletions: block until no transfer is in flight, then report as poll does."""
        while self.state.transfers:
            self.complete_transfer(self.completable()[0])
        return self.report()

    # -- restart -----------------------------------------------------------------------

    @operation
    def restart(self) -> RuntimeInfo:
        """Restart: drain transfers, forget everything, bump the epoch; every handle goes stale."""
        st = self.state
        while st.transfers and not st.lost:  # drain: in-flight copies land before the epoch ends
            self.complete_transfer(self.completable()[0])
        generations = [slot.generation + int(slot.live) for slot in st.slots]
        tags = {tier: pool.tags for tier, pool in st.pools.items()}
        self.state = fresh_state(st.epoch + 1, generations, tags, st.next_version)
        self.state.faults = st.faults  # injections are the harness's, not the epoch's
        self.state.objects = st.objects  # the store outlives the runtime's epochs
        return RuntimeInfo(
            self.runtime_id,
            self.state.epoch,
            self.page_size,
            self.max_requests,
            self.max_request_tokens,
            self.l1_pages,
            self.l2_pages,
            self.capabilities,
            vocab_size=self.vocab_size,
        )

    # -- environment -------------------------------------------------------------------

    def completable(self) -> tuple[int, ...]:
        """Transfers whose every predecessor has completed: the ones that may complete next."""
        return tuple(t for t, tr in sorted(self.state.transfers.items()) if not tr.waits_for & self.state.transfers.keys())

    def complete_transfer(self, transfer_id: int) -> None:
        """CompleteTransfer (environment): the transfer's copies land; deferred frees it blocked run.

        Only a completable transfer may complete; the model's own completions (compute
        waiting, wait_completions, restart) pick completable ones too.
        """
        if transfer_id not in self.completable():
            raise ValueError(f"transfer {transfer_id} is not in flight or waits for another")
        super().complete_transfer(transfer_id)

    def fail_transfer(self, transfer_id: int) -> None:
        """FailTransfer (environment): the transfer fails; enabled exactly when it could complete (F1)."""
        if transfer_id not in self.completable():
            raise ValueError(f"transfer {transfer_id} is not in flight or waits for another")
        super().fail_transfer(transfer_id)

    def remove_object(self, key: str) -> None:
        """RemoveObject (environment): the store drops the object under `key` (evicted, or removed by
        another runtime sharing it), at any time; a fetch that reads it later misses."""
        if key not in self.state.objects:
            raise ValueError(f"the store holds no object under {key!r}")
        del self.state.objects[key]

    def lose(self) -> None:
        """RuntimeLost (environment): the machinery is gone; every call but restart raises RuntimeFault.

        In-flight transfers never land: restart abandons them instead of draining.
        """
        self.state.lost = True

    def inject_fault(self, kind: FaultKind, nth: int) -> None:
        """The model's side of FAULT_INJECTION: the Nth transfer of `kind` (moving a page), or the
        Nth compute, from now fails where it would complete. LOST has no model side: the
        harness calls `lose()` when the runtime reports RuntimeFault."""
        if not isinstance(kind, FaultKind) or kind is FaultKind.LOST:
            raise InvalidArgument(f"inject_fault takes FaultKind.BACKUP, RESTORE or COMPUTE on the model, not {kind!r}")
        require_int("nth", nth)
        if nth < 1:
            raise InvalidArgument(f"nth counts from 1, got {nth}")
        self.state.faults = (*self.state.faults, (kind, nth))

    # -- introspection -----------------------------------------------------------------

    def probe(self) -> AbstractState:
        """The abstract state that every invariant predicate reads."""
        st = self.state
        pools = []
        for tier, pool in st.pools.items():
            mapped = tuple(sorted((c.phys, name) for name, page in st.pages.items() for t, c in page.copies.items() if t is tier))
            pools.append(PoolView(tier, pool.total, tuple(pool.free), mapped, tuple(sorted(pool.deferred))))
        empty = (0,) * self.page_size

        def tags(page: Page, tier: Tier) -> tuple[int, ...]:
            return tuple(st.pools[tier].tags[page.copies[tier].phys]) if tier in page.copies else empty

        batches = [
            BatchView(b, rec.state, tuple(sorted(rec.slot_set)), tuple(p for s in sorted(rec.slot_set) for p in st.slots[s].pages))
            for b, rec in st.batches.items()
        ]
        batches += [BatchView(b, state, slots, ()) for b, (state, slots) in st.finished.items()]
        return AbstractState(
            epoch=st.epoch,
            page_size=self.page_size,
            slots=tuple(SlotView(i, s.generation, s.live, tuple(s.pages), s.num_tokens, s.reserved_tokens) for i, s in enumerate(st.slots)),
            pages=tuple(
                PageView(
                    name,
                    page.holders,
                    page.copies[Tier.L1].state if Tier.L1 in page.copies else CopyState.ABSENT,
                    page.copies[Tier.L2].state if Tier.L2 in page.copies else CopyState.ABSENT,
                    tuple(page.versions),
                    tags(page, Tier.L1),
                    tags(page, Tier.L2),
                )
                for name, page in sorted(st.pages.items())
            ),
            pools=tuple(pools),
            extents=tuple(ExtentView(g, e.pages, e.refcount) for g, e in sorted(st.extents.items())),
            batches=tuple(sorted(batches, key=lambda view: view.batch_id)),
            transfers=tuple(
                TransferView(
                    t,
                    tr.kind,
                    tuple(p for p, _, _ in tr.pages),
                    tuple(src for _, src, _ in tr.pages),
                    tuple(dst for _, _, dst in tr.pages if dst >= 0),  # a persist from host copies stages nothing
                )
                for t, tr in sorted(st.transfers.items())
            ),
            boundary_calls=tuple(sorted(st.calls.items())),
            objects=tuple(ObjectView(key, tags) for key, tags in sorted(st.objects.items())),
            page_keys=tuple(sorted(st.keys.items())),
        )

    def check_invariants(self) -> None:
        """Evaluate every state invariant of the catalogue on the model; raise on the first violated."""
        from cacheruntime.invariants import InvariantViolation, S1_host_pages_only_stage, T2_filling_has_transfer, check_state
        from cacheruntime.model.transfers import T1_completions_sound

        probe = self.probe()
        check_state(probe)
        # T1 and T2 judge the model only for now: the conformance suite's runtimes are not yet
        # held to them (spec/invariants.md: planned)
        checks = [
            ("T1", T1_completions_sound(self.state.transfers, self.state.unreported, self.state.next_transfer)),
            ("T2", T2_filling_has_transfer(probe)),
        ]
        if self.host_mode is HostMode.BUFFER_ONLY:
            checks.append(("S1", S1_host_pages_only_stage(probe)))
        for invariant, violations in checks:
            if violations:
                raise InvariantViolation(invariant, violations)
