"""The executable reference model: the whole contract as a pure-Python state machine.

One public method per operation of `spec/protocol.md`, named as there and as the
actions of `tla/CacheRuntime.tla`. Every call is a transaction: it runs on a copy of
the state and commits only if no precondition failed, so a raised `CacheRuntimeError`
leaves the model exactly as it was.

The model has no compute and no bytes. Instead every token written gets a version tag
(a counter that never resets, not even across restarts), each copy of a page records
the tags it holds, and a transfer copies tags when it completes. D1 is then a plain
equality: every valid copy holds the tags last written. With the same tagging, a
runtime that claims TAGGED_COMPUTE returns `tag_digest` of the tags compute read as
each item's next token, and so does the model.

Transfers are abstract pending events. They complete when the environment says so
(`complete_transfer`, the TLA+ action CompleteTransfer), when compute needs them
(`execute_batch` waits for the restores its pages need: O1), or at
`wait_completions`. A transfer never completes before the transfers it waits for.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass, field

from cacheruntime import pageruns
from cacheruntime.protocol import (
    AbstractState,
    AlreadyExecuted,
    Backup,
    BatchCompletion,
    BatchDependency,
    BatchPlan,
    BatchView,
    CacheExtentRef,
    CacheRuntimeError,
    Capability,
    Close,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    ExtentView,
    ForeignRuntime,
    Intent,
    InvalidPageRun,
    InvalidPlan,
    ItemResult,
    NoL2,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfOrder,
    OutOfPages,
    OutOfSlots,
    PageView,
    PoolView,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestBusy,
    RequestRuntimeHandle,
    Restore,
    RowFull,
    RuntimeInfo,
    SlotView,
    StaleHandle,
    Tier,
    TierIntent,
    TransferCompletion,
    TransferKind,
    TransferTicket,
    TransferView,
    UnknownHandle,
    WouldLoseData,
    tag_digest,
)

# ---------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------


@dataclass
class Slot:
    """A request slot. `produced`/`appended` count outputs made and outputs fed back."""

    generation: int = 0
    live: bool = False
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0
    reserved_tokens: int = 0
    produced: int = 0
    appended: int = 0


@dataclass
class Copy:
    """One tier's copy of a page: its physical location and whether it is readable yet."""

    phys: int
    state: CopyState


@dataclass
class Page:
    """A page name: holders (rows and extents), last-written versions, and its copies."""

    holders: int
    versions: list[int]
    copies: dict[Tier, Copy] = field(default_factory=dict)


@dataclass
class Pool:
    """A physical pool: its bytes (as tags), the free list, and releases waiting on transfers.

    `content` survives frees and restarts, as memory does: a page taken from the free
    list holds whatever was there, so reading a position nobody wrote shows up.
    """

    total: int
    free: list[int]
    content: list[list[int]]
    deferred: dict[int, set[int]] = field(default_factory=dict)  # phys -> blocking transfer ids


@dataclass
class Extent:
    """A live extent: its page names in order and its reference count."""

    pages: tuple[int, ...]
    refcount: int


@dataclass
class Batch:
    """A prepared batch: its plan, the row lengths it ends at, what it allocated."""

    plan: BatchPlan
    state: str  # prepared | executed | cancelled
    end_tokens: dict[int, int]  # slot -> row length after this batch
    start_tokens: dict[int, int]  # slot -> row length before this batch (for cancel)
    start_pages: dict[int, int]  # slot -> row page count before this batch (for cancel)


@dataclass
class Transfer:
    """An in-flight tier move: per page the source and destination physical copies."""

    kind: TransferKind
    extent_generation: int
    pages: list[tuple[int, int, int]]  # (page name, source phys, destination phys)
    waits_for: set[int]
    ticket: TransferTicket


@dataclass
class State:
    """Everything the model knows; compared for equality to prove atomicity."""

    epoch: int
    slots: list[Slot]
    pages: dict[int, Page]
    pools: dict[Tier, Pool]
    extents: dict[int, Extent]
    batches: dict[int, Batch]
    transfers: dict[int, Transfer]
    unreported: list[TransferCompletion]
    next_page: int = 0
    next_extent: int = 1
    next_batch: int = 0
    next_transfer: int = 0
    next_version: int = 1
    calls: Counter = field(default_factory=Counter)

    def clone(self) -> State:
        """A copy deep enough for a transaction: every container an operation mutates is new.

        `copy.deepcopy` would do, but costs milliseconds per call; the conformance suite and
        the stateful tests make hundreds of thousands of calls. Plans, tickets and page
        tuples are immutable and stay shared.
        """
        return State(
            epoch=self.epoch,
            slots=[dataclasses.replace(slot, pages=list(slot.pages)) for slot in self.slots],
            pages={
                name: Page(page.holders, list(page.versions), {t: Copy(c.phys, c.state) for t, c in page.copies.items()})
                for name, page in self.pages.items()
            },
            pools={
                tier: Pool(pool.total, list(pool.free), [list(row) for row in pool.content], {p: set(b) for p, b in pool.deferred.items()})
                for tier, pool in self.pools.items()
            },
            extents={g: Extent(e.pages, e.refcount) for g, e in self.extents.items()},
            batches={b: dataclasses.replace(batch) for b, batch in self.batches.items()},
            transfers={t: dataclasses.replace(tr, waits_for=set(tr.waits_for)) for t, tr in self.transfers.items()},
            unreported=list(self.unreported),
            next_page=self.next_page,
            next_extent=self.next_extent,
            next_batch=self.next_batch,
            next_transfer=self.next_transfer,
            next_version=self.next_version,
            calls=Counter(self.calls),
        )


def _fresh_state(epoch: int, generations: list[int], contents: dict[Tier, list[list[int]]], next_version: int) -> State:
    return State(
        epoch=epoch,
        slots=[Slot(generation=g) for g in generations],
        pages={},
        pools={tier: Pool(len(c), list(range(len(c))), c) for tier, c in contents.items()},
        extents={},
        batches={},
        transfers={},
        unreported=[],
        next_version=next_version,
    )


def operation(method):
    """Run a boundary operation as a transaction on a copy of the state; count it on success."""

    @functools.wraps(method)
    def transaction(self: ReferenceModel, *args, **kwargs):
        saved = self.state
        self.state = saved.clone()
        try:
            result = method(self, *args, **kwargs)
        except CacheRuntimeError:
            self.state = saved
            raise
        except BaseException:
            self.state = saved
            raise
        self.state.calls[method.__name__] += 1
        return result

    return transaction


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


class ReferenceModel:
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
    ):
        if page_size < 1 or max_requests < 1 or l1_pages < 1 or l2_pages < 0 or max_request_tokens < page_size:
            raise ValueError("page_size, max_requests, l1_pages >= 1, l2_pages >= 0, max_request_tokens >= page_size")
        self.runtime_id = runtime_id
        self.page_size = page_size
        self.max_requests = max_requests
        self.max_request_tokens = max_request_tokens
        self.l1_pages = l1_pages
        self.l2_pages = l2_pages
        contents = {Tier.L1: [[0] * page_size for _ in range(l1_pages)], Tier.L2: [[0] * page_size for _ in range(l2_pages)]}
        self.state = _fresh_state(0, [0] * max_requests, contents, 1)

    # -- info --------------------------------------------------------------------------

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The model claims everything a runtime can claim, except the test knobs."""
        caps = {Capability.ASYNC_TRANSFERS, Capability.INTROSPECTION, Capability.RESTART, Capability.TAGGED_COMPUTE}
        if self.l2_pages:
            caps.add(Capability.L2)
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
                return RequestRuntimeHandle(self.runtime_id, self.state.epoch, slot_id, slot.generation)
        raise OutOfSlots(f"all {self.max_requests} request slots are live")

    @operation
    def close_request(self, request: RequestRuntimeHandle) -> None:
        """CloseRequest: retire the handle now; the row's pages go with their last holder."""
        self._close(request, in_batch=None)

    # -- two-phase batches ---------------------------------------------------------------

    @operation
    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        """PrepareBatch: validate the plan, allocate pages, map prefixes, start restores."""
        st = self.state
        if not isinstance(plan, BatchPlan):
            raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
        if not plan.items:
            raise InvalidPlan("a plan needs at least one item")
        for item in plan.items:
            self._slot(item.request)
            for extent in item.attach:
                self._extent(extent)
        for intent in plan.intents:
            self._check_intent_handles(intent)
        slots = [item.request.slot_id for item in plan.items]
        if len(set(slots)) != len(slots):
            raise InvalidPlan("a request appears twice in the plan")
        batch_id = st.next_batch
        start_tokens, start_pages, end_tokens = {}, {}, {}
        restoring: set[int] = set()
        for intent in plan.intents:
            if isinstance(intent, Restore):
                restoring.update(self._restore_pages(intent.extent))
        for item in plan.items:
            slot = st.slots[item.request.slot_id]
            if item.new_tokens < 1:
                raise InvalidPlan(f"slot {item.request.slot_id}: an item must compute at least one token")
            if item.attach and slot.reserved_tokens:
                raise InvalidPlan(f"slot {item.request.slot_id}: attach is only allowed on an empty row")
            if item.append_previous_output and slot.produced <= slot.appended:
                raise RequestBusy(f"slot {item.request.slot_id}: no previous output to append")
            attached = [p for extent in item.attach for p in st.extents[extent.generation].pages]
            for page in attached:
                l1 = st.pages[page].copies.get(Tier.L1)
                if l1 is None and page not in restoring:
                    raise NotResident(f"page {page} of an attached extent has no device copy and no restore")
            end = slot.reserved_tokens + len(attached) * self.page_size + item.new_tokens
            if end > self.max_request_tokens:
                raise RowFull(f"slot {item.request.slot_id}: {end} tokens > max_request_tokens {self.max_request_tokens}")
            start_tokens[item.request.slot_id] = slot.reserved_tokens
            start_pages[item.request.slot_id] = len(slot.pages)
            end_tokens[item.request.slot_id] = end
        need = sum(
            -(-end_tokens[s] // self.page_size) - start_pages[s] - sum(e.page_count for e in item.attach)
            for s, item in zip(slots, plan.items)
        )
        need += len(restoring)
        self._require_free(Tier.L1, need)
        for intent in plan.intents:
            if isinstance(intent, Restore):
                self._start_restore(intent.extent)
        for item in plan.items:
            slot = st.slots[item.request.slot_id]
            for extent in item.attach:
                for page in st.extents[extent.generation].pages:
                    st.pages[page].holders += 1
                    slot.pages.append(page)
            while len(slot.pages) * self.page_size < end_tokens[item.request.slot_id]:
                slot.pages.append(self._new_page())
            slot.reserved_tokens = end_tokens[item.request.slot_id]
            slot.produced += 1
            slot.appended += int(item.append_previous_output)
        st.batches[batch_id] = Batch(plan, "prepared", end_tokens, start_tokens, start_pages)
        st.next_batch += 1
        return PreparedBatchHandle(self.runtime_id, st.epoch, batch_id)

    @operation
    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """ExecuteBatch: wait for the restores compute reads, compute, then apply the intents."""
        st = self.state
        record = self._batch(batch)
        if record.state == "executed":
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed already")
        if record.state == "cancelled":
            raise NotPrepared(f"batch {batch.batch_id} was cancelled")
        mine = set(record.end_tokens)
        for other_id, other in st.batches.items():
            if other_id < batch.batch_id and other.state == "prepared" and mine & set(other.end_tokens):
                raise OutOfOrder(f"batch {other_id} shares a request with batch {batch.batch_id} and has not executed")
        results = []
        for item in record.plan.items:
            slot = st.slots[item.request.slot_id]
            end = record.end_tokens[item.request.slot_id]
            start = end - item.new_tokens
            read_pages = slot.pages[: -(-end // self.page_size)]
            self._await_restores(read_pages)  # O1: compute waits for KV_READY
            l1 = st.pools[Tier.L1].content
            for position in range(start, end):
                page = st.pages[slot.pages[position // self.page_size]]
                page.versions[position % self.page_size] = st.next_version
                l1[page.copies[Tier.L1].phys][position % self.page_size] = st.next_version
                st.next_version += 1
            read = tuple(
                l1[st.pages[slot.pages[pos // self.page_size]].copies[Tier.L1].phys][pos % self.page_size]
                for pos in range(end)
            )
            slot.num_tokens = end
            results.append(ItemResult(item.request, end, tag_digest(read)))
        record.state = "executed"
        published, tickets = [], []
        for intent in record.plan.intents:
            if isinstance(intent, Restore):
                continue
            outcome = self._apply_intent(intent, batch_id=batch.batch_id)
            if isinstance(intent, Publish):
                published.append(outcome)
            elif isinstance(intent, Backup):
                tickets.append(outcome)
        return BatchCompletion(batch, tuple(results), tuple(published), tuple(tickets))

    @operation
    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        """CancelBatch: undo the batch's allocations and mappings; started restores go on."""
        st = self.state
        record = self._batch(batch)
        if record.state == "executed":
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed; it cannot be cancelled")
        if record.state == "cancelled":
            raise NotPrepared(f"batch {batch.batch_id} was cancelled already")
        for other_id, other in st.batches.items():
            if other_id > batch.batch_id and other.state == "prepared" and set(record.end_tokens) & set(other.end_tokens):
                raise BatchDependency(f"batch {other_id} shares a request with batch {batch.batch_id}")
        for item in record.plan.items:
            slot = st.slots[item.request.slot_id]
            keep = record.start_pages[item.request.slot_id]
            for page in slot.pages[keep:]:
                self._drop_holder(page)
            del slot.pages[keep:]
            slot.reserved_tokens = record.start_tokens[item.request.slot_id]
            slot.produced -= 1
            slot.appended -= int(item.append_previous_output)
        record.state = "cancelled"

    # -- extents -----------------------------------------------------------------------

    @operation
    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        """Publish: make full pages of a request's row an extent with one reference."""
        return self._publish(Publish(request, first_page, page_count))

    @operation
    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        """Split: retire the extent's only ref and issue refs for its first `at_page` pages and the rest."""
        st = self.state
        record = self._extent(extent)
        if record.refcount != 1:
            raise ExtentShared(f"extent {extent.generation} has {record.refcount} references")
        if not 0 < at_page < len(record.pages):
            raise InvalidPageRun(f"split point {at_page} is not inside 1..{len(record.pages) - 1}")
        del st.extents[extent.generation]
        head = self._new_extent(record.pages[:at_page])
        tail = self._new_extent(record.pages[at_page:])
        return head, tail

    @operation
    def retain(self, extent: CacheExtentRef) -> None:
        """Retain: add a reference to a live extent."""
        self._extent(extent).refcount += 1

    @operation
    def release(self, extent: CacheExtentRef) -> None:
        """Release: drop a reference; with the last one the extent ends and its pages lose a holder."""
        self._apply_intent(Release(extent), batch_id=None)

    # -- tier moves --------------------------------------------------------------------

    @operation
    def submit(self, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
        """Submit: apply standalone tier intents in order; a ticket per Backup and Restore."""
        tickets = []
        for intent in intents:
            if not isinstance(intent, (Backup, Restore, Demote, Drop)):
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
            self._check_intent_handles(intent)
        for intent in intents:
            if isinstance(intent, Restore):
                pages = self._restore_pages(intent.extent)
                self._require_free(Tier.L1, len(pages))
                tickets.append(self._start_restore(intent.extent))
            else:
                outcome = self._apply_intent(intent, batch_id=None)
                if isinstance(intent, Backup):
                    tickets.append(outcome)
        return tuple(tickets)

    @operation
    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        """PollCompletions: the transfers completed since the last poll, each reported once."""
        return self._report()

    @operation
    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        """WaitCompletions: block until no transfer is in flight, then report as poll does."""
        while self.state.transfers:
            self._complete(self._next_completable(self.state.transfers))
        return self._report()

    def _report(self) -> tuple[TransferCompletion, ...]:
        """Hand over the unreported completions, ordered by transfer id (timing is the runtime's)."""
        done = tuple(sorted(self.state.unreported, key=lambda c: c.ticket.transfer_id))
        self.state.unreported = []
        return done

    # -- restart -----------------------------------------------------------------------

    @operation
    def restart(self) -> RuntimeInfo:
        """Restart: drain transfers, forget everything, bump the epoch; every handle goes stale."""
        st = self.state
        while st.transfers:  # drain: in-flight copies land before the epoch ends
            self._complete(self._next_completable(st.transfers))
        generations = [slot.generation + int(slot.live) for slot in st.slots]
        contents = {tier: pool.content for tier, pool in st.pools.items()}
        self.state = _fresh_state(st.epoch + 1, generations, contents, st.next_version)
        return RuntimeInfo(
            self.runtime_id, self.state.epoch, self.page_size, self.max_requests, self.max_request_tokens,
            self.l1_pages, self.l2_pages, self.capabilities,
        )

    # -- environment -------------------------------------------------------------------

    def completable(self) -> tuple[int, ...]:
        """Transfers whose every predecessor has completed: the ones that may complete next."""
        return tuple(t for t, tr in sorted(self.state.transfers.items()) if not tr.waits_for & self.state.transfers.keys())

    def complete_transfer(self, transfer_id: int) -> None:
        """CompleteTransfer (environment): the transfer's copies land; deferred frees it blocked run."""
        if transfer_id not in self.completable():
            raise ValueError(f"transfer {transfer_id} is not in flight or waits for another")
        self._complete(transfer_id)

    # -- introspection -----------------------------------------------------------------

    def probe(self) -> AbstractState:
        """The abstract state that every invariant predicate reads."""
        st = self.state
        pools = []
        for tier, pool in st.pools.items():
            mapped = tuple(
                sorted((c.phys, name) for name, page in st.pages.items() for t, c in page.copies.items() if t is tier)
            )
            pools.append(PoolView(tier, pool.total, tuple(pool.free), mapped, tuple(sorted(pool.deferred))))
        empty = (0,) * self.page_size

        def tags(page: Page, tier: Tier) -> tuple[int, ...]:
            return tuple(st.pools[tier].content[page.copies[tier].phys]) if tier in page.copies else empty
        return AbstractState(
            epoch=st.epoch,
            page_size=self.page_size,
            slots=tuple(
                SlotView(i, s.generation, s.live, tuple(s.pages), s.num_tokens, s.reserved_tokens)
                for i, s in enumerate(st.slots)
            ),
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
            batches=tuple(
                BatchView(
                    b,
                    rec.state,
                    tuple(sorted(rec.end_tokens)),
                    tuple(p for s in sorted(rec.end_tokens) for p in st.slots[s].pages) if rec.state == "prepared" else (),
                )
                for b, rec in sorted(st.batches.items())
            ),
            transfers=tuple(
                TransferView(
                    t,
                    tr.kind,
                    tuple(p for p, _, _ in tr.pages),
                    tuple(src for _, src, _ in tr.pages),
                    tuple(dst for _, _, dst in tr.pages),
                )
                for t, tr in sorted(st.transfers.items())
            ),
            boundary_calls=tuple(sorted(st.calls.items())),
        )

    def check_invariants(self) -> None:
        """Evaluate every state invariant of the catalogue on the model; raise on the first violated."""
        from cacheruntime.invariants import check_state

        check_state(self.probe())

    # ---------------------------------------------------------------------------------
    # Handle checks: ForeignRuntime, then StaleHandle (epoch, generation), then UnknownHandle
    # ---------------------------------------------------------------------------------

    def _check_origin(self, what: str, runtime_id: str, epoch: int) -> None:
        if runtime_id != self.runtime_id:
            raise ForeignRuntime(f"{what} belongs to runtime {runtime_id!r}, not {self.runtime_id!r}")
        if epoch < self.state.epoch:
            raise StaleHandle(f"{what} is from epoch {epoch}; the runtime restarted into epoch {self.state.epoch}")
        if epoch > self.state.epoch:
            raise UnknownHandle(f"{what} names epoch {epoch}, which has not begun")

    def _slot(self, request: RequestRuntimeHandle) -> Slot:
        if not isinstance(request, RequestRuntimeHandle):
            raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
        self._check_origin("request handle", request.runtime_id, request.epoch)
        if not 0 <= request.slot_id < len(self.state.slots):
            raise UnknownHandle(f"slot {request.slot_id} does not exist")
        slot = self.state.slots[request.slot_id]
        if request.generation < slot.generation:
            raise StaleHandle(f"slot {request.slot_id} is at generation {slot.generation}, the handle has {request.generation}")
        if request.generation > slot.generation or not slot.live:
            raise UnknownHandle(f"slot {request.slot_id} generation {request.generation} was never opened")
        return slot

    def _extent(self, extent: CacheExtentRef) -> Extent:
        if not isinstance(extent, CacheExtentRef):
            raise UnknownHandle(f"expected a CacheExtentRef, got {type(extent).__name__}")
        self._check_origin("extent ref", extent.runtime_id, extent.epoch)
        record = self.state.extents.get(extent.generation)
        if record is None:
            if 0 < extent.generation < self.state.next_extent:
                raise StaleHandle(f"extent {extent.generation} was released or split")
            raise UnknownHandle(f"extent {extent.generation} was never published")
        if pageruns.coalesce(record.pages) != tuple(extent.page_runs):
            raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")
        return record

    def _batch(self, batch: PreparedBatchHandle) -> Batch:
        if not isinstance(batch, PreparedBatchHandle):
            raise UnknownHandle(f"expected a PreparedBatchHandle, got {type(batch).__name__}")
        self._check_origin("batch handle", batch.runtime_id, batch.epoch)
        record = self.state.batches.get(batch.batch_id)
        if record is None:
            raise UnknownHandle(f"batch {batch.batch_id} was never prepared")
        return record

    def _check_intent_handles(self, intent: Intent) -> None:
        if isinstance(intent, (Publish, Close)):
            self._slot(intent.request)
        elif isinstance(intent, (Backup, Restore, Demote, Drop, Release)):
            self._extent(intent.extent)
            if not isinstance(intent, Release) and not self.l2_pages:
                raise NoL2("this runtime has no L2 tier")
        else:
            raise InvalidPlan(f"unknown intent {type(intent).__name__}")

    # ---------------------------------------------------------------------------------
    # Pages and pools
    # ---------------------------------------------------------------------------------

    def _require_free(self, tier: Tier, needed: int) -> None:
        free = len(self.state.pools[tier].free)
        if needed > free:
            raise OutOfPages(tier, needed, free)

    def _take(self, tier: Tier) -> int:
        return self.state.pools[tier].free.pop(0)

    def _new_page(self) -> int:
        st = self.state
        name, st.next_page = st.next_page, st.next_page + 1
        st.pages[name] = Page(
            holders=1,
            versions=[0] * self.page_size,
            copies={Tier.L1: Copy(self._take(Tier.L1), CopyState.VALID)},
        )
        return name

    def _transfers_on(self, tier: Tier, phys: int) -> set[int]:
        """In-flight transfers that read or write physical page `phys` of `tier`."""
        found = set()
        for t, tr in self.state.transfers.items():
            src_tier, dst_tier = (Tier.L1, Tier.L2) if tr.kind is TransferKind.BACKUP else (Tier.L2, Tier.L1)
            for _, src, dst in tr.pages:
                if (src_tier is tier and src == phys) or (dst_tier is tier and dst == phys):
                    found.add(t)
        return found

    def _free_phys(self, tier: Tier, phys: int) -> None:
        """Return a physical page to its free list, or defer it while a transfer touches it (O3)."""
        blocking = self._transfers_on(tier, phys)
        if blocking:
            self.state.pools[tier].deferred[phys] = blocking
        else:
            self.state.pools[tier].free.append(phys)

    def _drop_copy(self, name: int, tier: Tier) -> None:
        copy_ = self.state.pages[name].copies.pop(tier)
        self._free_phys(tier, copy_.phys)

    def _drop_holder(self, name: int) -> None:
        page = self.state.pages[name]
        page.holders -= 1
        if page.holders == 0:
            for tier in list(page.copies):
                self._drop_copy(name, tier)
            del self.state.pages[name]

    def _row_held(self) -> set[int]:
        return {p for slot in self.state.slots if slot.live for p in slot.pages}

    # ---------------------------------------------------------------------------------
    # Extents and intents
    # ---------------------------------------------------------------------------------

    def _new_extent(self, pages: tuple[int, ...]) -> CacheExtentRef:
        st = self.state
        generation, st.next_extent = st.next_extent, st.next_extent + 1
        st.extents[generation] = Extent(tuple(pages), 1)
        return CacheExtentRef(self.runtime_id, st.epoch, generation, pageruns.coalesce(pages))

    def _publish(self, intent: Publish) -> CacheExtentRef:
        slot = self._slot(intent.request)
        full = slot.num_tokens // self.page_size
        if intent.page_count < 1 or intent.first_page < 0 or intent.first_page + intent.page_count > full:
            raise InvalidPageRun(
                f"row pages [{intent.first_page}, {intent.first_page + intent.page_count}) are not inside the "
                f"{full} full pages written so far"
            )
        pages = tuple(slot.pages[intent.first_page : intent.first_page + intent.page_count])
        for page in pages:
            self.state.pages[page].holders += 1
        return self._new_extent(pages)

    def _close(self, request: RequestRuntimeHandle, in_batch: int | None) -> None:
        slot = self._slot(request)
        for b, rec in self.state.batches.items():
            if b != in_batch and rec.state == "prepared" and request.slot_id in rec.end_tokens:
                raise RequestBusy(f"request in slot {request.slot_id} is in prepared batch {b}")
        slot.live = False
        slot.generation += 1
        for page in slot.pages:
            self._drop_holder(page)
        slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0

    def _apply_intent(self, intent: Intent, batch_id: int | None):
        """Apply one non-restore intent now; Backup returns its ticket, Publish its ref."""
        st = self.state
        if isinstance(intent, Publish):
            return self._publish(intent)
        if isinstance(intent, Close):
            return self._close(intent.request, in_batch=batch_id)
        self._check_intent_handles(intent)
        record = st.extents[intent.extent.generation]
        if isinstance(intent, Release):
            record.refcount -= 1
            if record.refcount == 0:
                del st.extents[intent.extent.generation]
                for page in record.pages:
                    self._drop_holder(page)
            return None
        if isinstance(intent, Backup):
            todo = [p for p in record.pages if Tier.L2 not in st.pages[p].copies]
            self._require_free(Tier.L2, len(todo))
            return self._start_transfer(TransferKind.BACKUP, intent.extent.generation, todo)
        if isinstance(intent, Demote):
            for page in record.pages:
                if Tier.L2 not in st.pages[page].copies:
                    raise NotBackedUp(f"page {page} has no host copy and no backup in flight")
            held = self._row_held() & set(record.pages)
            if held:
                raise ExtentInUse(f"pages {sorted(held)} are mapped into live request rows")
            for page in record.pages:
                if Tier.L1 in st.pages[page].copies:
                    self._drop_copy(page, Tier.L1)
            return None
        if isinstance(intent, Drop):
            for page in record.pages:
                if Tier.L1 not in st.pages[page].copies:
                    raise WouldLoseData(f"page {page} has no device copy; dropping its host copy loses it")
            for page in record.pages:
                if Tier.L2 in st.pages[page].copies:
                    self._drop_copy(page, Tier.L2)
            return None
        raise InvalidPlan(f"unknown intent {type(intent).__name__}")

    # ---------------------------------------------------------------------------------
    # Transfers
    # ---------------------------------------------------------------------------------

    def _restore_pages(self, extent: CacheExtentRef) -> list[int]:
        """Pages of the extent a restore must move; NotBackedUp if one has no host copy."""
        record = self.state.extents[extent.generation]
        todo = []
        for page in record.pages:
            copies = self.state.pages[page].copies
            if Tier.L1 in copies:
                continue
            if Tier.L2 not in copies:
                raise NotBackedUp(f"page {page} has neither a device nor a host copy")
            todo.append(page)
        return todo

    def _start_restore(self, extent: CacheExtentRef) -> TransferTicket:
        return self._start_transfer(TransferKind.RESTORE, extent.generation, self._restore_pages(extent))

    def _start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket:
        st = self.state
        src_tier, dst_tier = (Tier.L1, Tier.L2) if kind is TransferKind.BACKUP else (Tier.L2, Tier.L1)
        transfer_id = st.next_transfer
        st.next_transfer += 1
        moves, waits = [], set()
        for name in pages:
            page = st.pages[name]
            source = page.copies[src_tier]
            if source.state is CopyState.FILLING:
                waits |= self._transfers_on(src_tier, source.phys)
            dst = self._take(dst_tier)
            page.copies[dst_tier] = Copy(dst, CopyState.FILLING)
            moves.append((name, source.phys, dst))
        ticket = TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(moves))
        st.transfers[transfer_id] = Transfer(kind, generation, moves, waits, ticket)
        if not moves:
            self._complete(transfer_id)
        return ticket

    def _next_completable(self, transfers: dict[int, Transfer]) -> int:
        return next(t for t, tr in sorted(transfers.items()) if not tr.waits_for & transfers.keys())

    def _complete(self, transfer_id: int) -> None:
        st = self.state
        tr = st.transfers.pop(transfer_id)
        src_tier, dst_tier = (Tier.L1, Tier.L2) if tr.kind is TransferKind.BACKUP else (Tier.L2, Tier.L1)
        for name, src, dst in tr.pages:
            st.pools[dst_tier].content[dst] = list(st.pools[src_tier].content[src])
            page = st.pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if target is not None and target.phys == dst:
                target.state = CopyState.VALID
        for tier in (Tier.L1, Tier.L2):
            pool = st.pools[tier]
            for phys in sorted(pool.deferred):
                pool.deferred[phys].discard(transfer_id)
                if not pool.deferred[phys]:
                    del pool.deferred[phys]
                    pool.free.append(phys)
        st.unreported.append(TransferCompletion(tr.ticket))

    def _await_restores(self, pages: list[int]) -> None:
        """Complete, in dependency order, every transfer filling an L1 copy of `pages` (O1)."""
        st = self.state
        while True:
            waiting = [
                t for t, tr in st.transfers.items() if tr.kind is TransferKind.RESTORE and any(p in pages for p, _, _ in tr.pages)
            ]
            if not waiting:
                return
            target = min(waiting)
            chain = {target}
            while chain:
                ready = [t for t in sorted(chain) if not st.transfers[t].waits_for & st.transfers.keys()]
                if ready:
                    self._complete(ready[0])
                    break
                chain = {w for t in chain for w in st.transfers[t].waits_for if w in st.transfers}
