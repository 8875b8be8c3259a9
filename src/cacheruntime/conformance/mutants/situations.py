"""The `situation` mutants: the error classes and situations the other families leave out.

Written from the contract (`spec/protocol.md`, `spec/invariants.md`) and the runtime's
seams only, without reading the suite's rules: each is `LocalGPURuntime` in the
conformance configuration with one constructor seam replaced (a `ledger_class` whose one
public method is wrong, a `memory_class`), never a private method. A bug that lives inside
a long method is a copy of that method with one change, behind a keyword knob (the `_*`
functions below), as in `families.py`.

They fill two gaps of the earlier families:

- **operation x error class.** `OPERATION_ERRORS` below is the table of every boundary
  operation against every error class the spec lets it raise (section 3's handle checks
  and each operation's own preconditions), with the mutants of every family that get that
  error wrong (not raised, raised spuriously, or another class raised). A cell with no
  mutant is explained in `UNREACHABLE`.
- **situations** issue 14 measured the CI profile never reaching: a restart with work in
  flight; OutOfPages from a plan that contains a Restore; many host pages in use at once;
  a split of an extent of 3 or more pages; a Drop while a Restore from that copy is
  pending; a handle 2 or more generations stale; repeated or rearranged page runs of a real
  extent. `SITUATIONS` maps each to the mutants that need it to be caught. (Issue 14's
  "multi-page restore waiting on a backup under delay" and "restore waiting on another
  extent's backup" are gone with issue 17, and so is `restore_waits_same_extent_only`, a
  restore that waited only for backups of its own extent: a Demote while a page's backup
  is in flight keeps the device copy, DROPPING, until the backup lands, so no restore waits
  for a backup.)

`SITUATION_SURVIVORS` lists the mutants the CI profile does not kill, with what it would
take to catch each as far as the spec tells: they are findings about the suite's reach,
not mistakes of the mutants (a directed call sequence per mutant in
tests/runtime/test_situation_mutants.py tells each from the landed runtime).
`SITUATION_KILLED_BY` names the check that killed each other one; the measured kill
table (20 of 31 killed on 2026-12-01 against the suite before its reach work, 23 of 31
asserted in CI after it; after issue 17, 30 mutants on the suite's new draws, 23 killed;
25 once the suite's rules sent a Close intent under a later batch, a negative first page,
and a release while a restore reads, which killed those three and lost
`future_generation_stale` to the new draws; all 30 once guided rules sent what the last
seven need, 2026-12-02) is in docs/mutation-score.md.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, ClassVar

from cacheruntime.protocol import (
    Backup,
    BatchPlan,
    BatchState,
    CacheExtentRef,
    Close,
    Demote,
    Drop,
    ExtentShared,
    Intent,
    InvalidPageRun,
    InvalidPlan,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfPages,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestBusy,
    RequestRuntimeHandle,
    Restore,
    RowFull,
    StaleHandle,
    Tier,
    TierIntent,
    TransferKind,
    TransferTicket,
    UnknownHandle,
    Unsupported,
    WouldLoseData,
)
from cacheruntime.runtime.device.memory import KVMemory
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, suite_streams
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.ledger.batches import CheckedPlan
from cacheruntime.runtime.ledger.records import DROPPING, Batch, Extent, Slot
from cacheruntime.runtime.local import LocalGPURuntime


class _Mutant(LocalGPURuntime):
    """The conformance runtime with the seams a mutant names."""

    invariant = ""
    ledger: Ledger
    parts: ClassVar[dict[str, Any]] = {}  # the seams this mutant replaces (constructor options)

    def __init__(self, device: str = "cpu", **options: Any):
        super().__init__(device=device, **{**CONFORMANCE_OPTIONS, **suite_streams(device), **self.parts, **options})


def _ledger(name: str, method: str, body: Any) -> type[Ledger]:
    """A `Ledger` subclass named `name` whose one public method `method` is `body`."""
    assert not method.startswith("_") and hasattr(Ledger, method), method
    return type(name, (Ledger,), {method: body, "__module__": __name__})


# -- handle checks ---------------------------------------------------------------------------


def _origin_without_runtime_id(self: Ledger, what: str, runtime_id: str, epoch: int) -> None:
    # The runtime id "cannot differ" inside one process, so only the epoch is compared.
    Ledger.check_origin(self, what, self.runtime_id, epoch)


def _batch_by_id_first(self: Ledger, batch: PreparedBatchHandle) -> Any:
    if isinstance(batch, PreparedBatchHandle):
        st = self.state
        record = st.batches.get(batch.batch_id) or st.finished.get(batch.batch_id)
        if record is not None:  # a known id is taken as this epoch's own batch
            return record
    return Ledger.check_batch(self, batch)


def _unknown_batch_not_prepared(self: Ledger, batch: PreparedBatchHandle) -> Any:
    try:
        return Ledger.check_batch(self, batch)
    except UnknownHandle:
        if isinstance(batch, PreparedBatchHandle) and batch.runtime_id == self.runtime_id and batch.epoch == self.state.epoch:
            raise NotPrepared(f"batch {batch.batch_id} is not prepared") from None
        raise


def _any_generation_mismatch_stale(self: Ledger, request: RequestRuntimeHandle, slot: Slot) -> None:
    if request.generation != slot.generation:
        raise StaleHandle(f"slot {request.slot_id} is at generation {slot.generation}, the handle has {request.generation}")
    if not slot.live:
        raise UnknownHandle(f"slot {request.slot_id} is not open")


def _generation_low_bit(self: Ledger, request: RequestRuntimeHandle, slot: Slot) -> None:
    if slot.live and (request.generation - slot.generation) % 2 == 0:
        return None  # the slot keeps one generation bit: the same parity reads as the same generation
    return Ledger.check_generation(self, request, slot)


def _slot_range_inclusive(self: Ledger, request: RequestRuntimeHandle) -> Slot:
    if not isinstance(request, RequestRuntimeHandle):
        raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
    self.check_origin("request handle", request.runtime_id, request.epoch)
    if not 0 <= request.slot_id <= len(self.state.slots):  # one past the last slot passes
        raise UnknownHandle(f"slot {request.slot_id} does not exist")
    slot = self.state.slots[request.slot_id]
    self.check_generation(request, slot)
    return slot


def _missing_extent_stale(self: Ledger, extent: CacheExtentRef, record: Extent | None) -> None:
    if record is None:
        raise StaleHandle(f"extent {extent.generation} is not live")
    Ledger.check_extent_issued(self, extent, record)


def _runs_compared_sorted(self: Ledger, extent: CacheExtentRef, record: Extent | None) -> None:
    if record is None:
        Ledger.check_extent_issued(self, extent, record)
        return

    def order(runs: Any) -> list[tuple[int, int]]:
        return sorted((run.first_page, run.page_count) for run in runs)

    if order(record.runs) != order(extent.page_runs):
        raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")


def _runs_compared_as_pages(self: Ledger, extent: CacheExtentRef, record: Extent | None) -> None:
    if record is None:
        Ledger.check_extent_issued(self, extent, record)
        return
    named = [page for run in extent.page_runs for page in range(run.first_page, run.first_page + run.page_count)]
    if tuple(named) != record.pages:  # the same names in the same order, however the runs cut them
        raise UnknownHandle(f"extent {extent.generation}: the ref's pages are not the ones issued")


def _retain_without_epoch(self: Ledger, extent: CacheExtentRef) -> None:
    record = None
    if isinstance(extent, CacheExtentRef) and extent.runtime_id == self.runtime_id:
        record = self.state.extents.get(extent.generation)
    if record is None or record.runs != tuple(extent.page_runs):
        Ledger.retain_extent(self, extent)
        return
    record.refcount += 1  # runtime id, generation and runs match: the epoch is not compared
    self.txn.undo(functools.partial(_add_refs, record, -1))


# -- copies of long ledger methods, each with knobs for the one change a mutant makes --------


def _check_plan(self: Ledger, plan: BatchPlan, *, needed_without_restores: bool = False, restore_counts_resident: bool = False) -> CheckedPlan:
    """`Batches.check_plan`; `needed_without_restores` reports OutOfPages' `needed` without the
    plan's restored pages, `restore_counts_resident` counts every page of a restored extent."""
    if not isinstance(plan, BatchPlan):
        raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
    items = plan.items
    if not items:
        raise InvalidPlan("a plan needs at least one item")
    handles = self.item_handles(items, plan.intents)
    restoring: set[int] = set()  # pages a restore of the plan moves or keeps (dropping)
    moving: set[int] = set()  # of those, the pages it moves: each needs a free device page
    resident_restored = 0
    for intent in plan.intents:
        if isinstance(intent, Restore):
            moved = self.restore_pages(intent.extent)
            moving.update(moved)
            extent_pages = self.state.extents[intent.extent.generation].pages
            restoring.update(extent_pages)
            resident_restored += len(extent_pages) - len(moved)
    rows = handles.rows
    start_tokens = [slot.reserved_tokens for slot in rows]
    ends = [start + length for start, length in zip(start_tokens, handles.lengths)]
    route = self.decode_route(handles, start_tokens, ends, len(moving))
    if route is not None:
        starts, one_token, offsets, opened, need = route
    else:
        starts, ends, need, one_token = self.check_items(handles.slots, rows, items, start_tokens, restoring, len(moving))
        offsets, opened = None, 0
    if restore_counts_resident:
        need += resident_restored
    free = len(self.state.pools[Tier.L1].free)
    if need > free:
        raise OutOfPages(Tier.L1, need - len(moving) if needed_without_restores else need, free)
    return CheckedPlan(plan, handles.slots, rows, handles.slot_set, handles.requests, starts, ends, start_tokens, one_token, handles.special, offsets, opened)


def _check_items(
    self: Ledger,
    slots: list[int],
    rows: list[Slot],
    items: Any,
    start_tokens: list[int],
    restoring: set[int],
    moving: int,
    *,
    count_attached: bool = False,
) -> tuple[list[int], list[int], int, bool]:
    """`Batches.check_items`; `count_attached` counts an attached extent's pages as pages to allocate."""
    ps, max_tokens, extents, l1 = self.page_size, self.max_request_tokens, self.state.extents, Tier.L1
    starts: list[int] = []
    ends: list[int] = []
    need = moving
    one_token = True
    for slot_id, slot, item, reserved in zip(slots, rows, items, start_tokens):
        row_pages = len(slot.pages)
        append = item.append_previous_output
        new_tokens = len(item.input_ids) + 1 if append else len(item.input_ids)
        if new_tokens != 1:
            if new_tokens < 1:
                raise InvalidPlan(f"slot {slot_id}: an item must compute at least one token")
            one_token = False
        end = reserved + new_tokens
        if item.attach:
            if reserved:
                raise InvalidPlan(f"slot {slot_id}: attach is only allowed on an empty row")
            if append and slot.produced <= slot.appended:
                raise RequestBusy(f"slot {slot_id}: no previous output to append")
            attached = referenced = 0
            for extent in item.attach:
                extent_pages = extents[extent.generation].pages
                for page in extent_pages:
                    if not self.has_copy(page, l1) and page not in restoring:
                        raise NotResident(f"page {page} of an attached extent has no device copy and no restore")
                attached += len(extent_pages)
                referenced += extent.page_count
            end += attached * ps
            if not count_attached:
                need -= referenced
        elif append and slot.produced <= slot.appended:
            raise RequestBusy(f"slot {slot_id}: no previous output to append")
        if end > max_tokens:
            raise RowFull(f"slot {slot_id}: {end} tokens > max_request_tokens {max_tokens}")
        starts.append(end - new_tokens)
        ends.append(end)
        need += -(-end // ps) - row_pages
    return starts, ends, need, one_token


def _cancel_executed_not_prepared(self: Ledger, batch: PreparedBatchHandle) -> None:
    record = self.check_batch(batch)
    if (record.state if isinstance(record, Batch) else record[0]) is BatchState.EXECUTED:
        raise NotPrepared(f"batch {batch.batch_id} is no longer prepared")  # "finished" is one error for both
    Ledger.cancel(self, batch)


def _publish_any_first_page(self: Ledger, intent: Publish) -> CacheExtentRef:
    slot = self.check_slot(intent.request)
    full = slot.num_tokens // self.page_size
    if intent.page_count < 1 or intent.first_page + intent.page_count > full:  # first_page >= 0 left out
        raise InvalidPageRun(f"row pages [{intent.first_page}, {intent.first_page + intent.page_count}) are not inside the {full} full pages")
    pages = tuple(slot.pages[intent.first_page : intent.first_page + intent.page_count])
    for page in pages:
        self.add_holder(page)
    return self.new_extent(pages)


def _split_extent(
    self: Ledger, extent: CacheExtentRef, at_page: int, *, shared_above: int = 1, lowest: int = 1, tail_from_second_page: bool = False
) -> tuple[CacheExtentRef, CacheExtentRef]:
    """`Extents.split_extent`; `shared_above` is the reference count from which ExtentShared is
    raised, `lowest` the lowest split point accepted, `tail_from_second_page` takes the
    second half from the extent's second page on (right only for at_page == 1)."""
    record = self.check_extent(extent)
    if record.refcount > shared_above:
        raise ExtentShared(f"extent {extent.generation} has {record.refcount} references")
    count = len(record.pages)
    if not lowest <= at_page < count:
        raise InvalidPageRun(f"split point {at_page} is not inside 1..{count - 1}")
    extents, generation = self.state.extents, extent.generation
    del extents[generation]
    self.txn.undo(lambda: extents.__setitem__(generation, record))
    first = 1 if tail_from_second_page else at_page
    return self.new_extent(record.pages[:at_page]), self.new_extent(record.pages[first : first + count - at_page])


def _apply_intent(
    self: Ledger,
    intent: Intent,
    *,
    close_ignores_busy: bool = False,
    demote_first_page_only: bool = False,
    drop_first_page_only: bool = False,
    plan_backup_unchecked: bool = False,
) -> Any:
    """`Extents.apply_intent`; each knob is one mutant's change."""
    st = self.state
    if isinstance(intent, Publish):
        return self.publish_pages(intent)
    if isinstance(intent, Close):
        if not close_ignores_busy:
            self.close_row(intent.request)
            return None
        slot = self.check_slot(intent.request)  # "the batch executing it holds the request anyway"
        self.close_slot(slot)
        self.drop_row(slot, 0)
        self.txn.undo(functools.partial(_set_lengths, slot, slot.num_tokens, slot.reserved_tokens))
        slot.num_tokens = slot.reserved_tokens = 0
        return None
    self.check_intent_handles(intent)
    record = st.extents[intent.extent.generation]
    if isinstance(intent, Release):
        self.release_ref(intent.extent.generation)
        return None
    if isinstance(intent, Backup):
        todo = [p for p in record.pages if Tier.L2 not in st.pages[p].copies]
        if not (plan_backup_unchecked and self.txn.operation == "execute_batch"):
            self.require_free(Tier.L2, len(todo))
        self.keep_dropping(record.pages, Tier.L2)
        return self.start_transfer(TransferKind.BACKUP, intent.extent.generation, todo)
    if isinstance(intent, Demote):
        for page in record.pages[:1] if demote_first_page_only else record.pages:
            if not self.has_copy(page, Tier.L2):
                raise NotBackedUp(f"page {page} has no host copy and no backup in flight")
        self.check_demote_unmapped(record)
        for page in record.pages:
            _drop_or_keep_until_landed(self, page, Tier.L1)
        return None
    if isinstance(intent, Drop):
        for page in record.pages[:1] if drop_first_page_only else record.pages:
            if not self.has_copy(page, Tier.L1):
                raise WouldLoseData(f"page {page} has no device copy; dropping its host copy loses it")
        for page in record.pages:
            _drop_or_keep_until_landed(self, page, Tier.L2)
        return None
    raise InvalidPlan(f"unknown intent {type(intent).__name__}")


def _drop_or_keep_until_landed(self: Ledger, name: int, tier: Tier) -> None:
    """`Pages.drop_or_keep_until_landed`, for a page whose other tier may have no copy at all: the
    landed method may assume one (Demote's and Drop's checks ensure it), a check that looks at the
    first page only does not, and the copy then goes (the data is lost, as the mutant means)."""
    copies = self.state.pages[name].copies
    other = copies.get(Tier.L2 if tier is Tier.L1 else Tier.L1)
    if other is None and tier in copies and copies[tier].state is not DROPPING:
        self.drop_copy(name, tier)
        return
    self.drop_or_keep_until_landed(name, tier)


def _submit(
    self: Ledger, intents: tuple[TierIntent, ...], *, release_allowed: bool = False, restore_counts_resident: bool = False
) -> tuple[TransferTicket, ...]:
    """`Extents.submit`; `release_allowed` takes Release as a tier intent, `restore_counts_resident`
    asks free device pages for every page of a restored extent."""
    allowed: tuple[type, ...] = (Backup, Restore, Demote, Drop, Release) if release_allowed else (Backup, Restore, Demote, Drop)
    for intent in intents:
        if not isinstance(intent, allowed):
            raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
        self.check_intent_handles(intent)
    tickets = []
    for intent in intents:
        if isinstance(intent, Restore):
            pages = self.restore_pages(intent.extent)
            whole = len(self.state.extents[intent.extent.generation].pages)
            self.require_free(Tier.L1, whole if restore_counts_resident else len(pages))
            tickets.append(self.start_restore(intent.extent, pages))
        else:
            outcome = self.apply_intent(intent)
            if isinstance(outcome, TransferTicket):
                tickets.append(outcome)
    return tuple(tickets)


def _restart(
    self: Ledger,
    failed: Iterable[int] = (),
    abandoned: bool = False,
    *,
    refuse_in_flight: bool = False,
    leak_in_flight: bool = False,
    bump_every_slot: bool = False,
) -> None:
    """`Ledger.restart`; each knob is one mutant's change."""
    st = self.state
    if refuse_in_flight and st.transfers:
        raise Unsupported(f"restart with {len(st.transfers)} transfers in flight; wait for them first")
    held: dict[Tier, set[int]] = {Tier.L1: set(), Tier.L2: set()}
    if leak_in_flight:  # the pages in-flight transfers write or deferred frees wait on are "still busy"
        for tier, pool in st.pools.items():
            held[tier].update(pool.deferred)
        for transfer in st.transfers.values():
            held[transfer.tiers[1]].update(dst for _, _, dst in transfer.pages)
    elif not abandoned:
        self.complete_all(failed)
    generations = [slot.generation + int(slot.live or bump_every_slot) for slot in st.slots]
    tags = {tier: pool.tags for tier, pool in st.pools.items()}
    self.state = self.fresh_state(st.epoch + 1, generations, tags, st.next_version)
    self.state.faults = st.faults
    for tier, pages in held.items():
        free = self.state.pools[tier].free
        for phys in sorted(pages):
            free.remove(phys)
    self.held = []


def _host_pool_sized_as_device(self: Ledger, tier: Tier, needed: int) -> None:
    pools = self.state.pools
    if tier is not Tier.L2:
        Ledger.require_free(self, tier, needed)
        return
    pool = pools[Tier.L2]
    in_use = pool.total - len(pool.free)
    free = max(0, pools[Tier.L1].total - in_use)  # the host pool's size taken from the device pool's
    if needed > free:
        raise OutOfPages(tier, needed, free)


def _free_phys_readers_unprotected(self: Ledger, tier: Tier, phys: int) -> None:
    pool, transfers = self.state.pools[tier], self.state.transfers
    # Only a transfer that writes the host page holds it: a restore merely reads it.
    blocking = {t for t in self.transfers_on(tier, phys) if not (tier is Tier.L2 and transfers[t].kind is TransferKind.RESTORE)}
    journal = self.txn.journal
    if blocking:
        pool.deferred[phys] = blocking
        if journal is not None:
            journal.append(lambda: pool.deferred.pop(phys))
    else:
        pool.free.append(phys)
        if journal is not None:
            journal.append(pool.free.pop)


def _add_refs(record: Extent, count: int) -> None:
    record.refcount += count


def _set_lengths(slot: Slot, num_tokens: int, reserved_tokens: int) -> None:
    slot.num_tokens, slot.reserved_tokens = num_tokens, reserved_tokens


# -- other seams -----------------------------------------------------------------------------

#: The host pages a staging window of `_HostWindow16` spans.
HOST_WINDOW_PAGES = 16


class _HostWindow16(KVMemory):
    """A copy path that addresses host pages through a 16-page window: page p lands on p mod 16."""

    def restore(self, src_l2: list[int], dst_l1: list[int]) -> None:
        super().restore([p % HOST_WINDOW_PAGES for p in src_l2], dst_l1)

    def backup(self, src_l1: list[int], dst_l2: list[int]) -> None:
        super().backup(src_l1, [p % HOST_WINDOW_PAGES for p in dst_l2])


# -- the mutants -----------------------------------------------------------------------------


class OriginIgnoresRuntimeId(_Mutant):
    """Handle checks compare only the epoch, not the runtime id: another runtime's handles pass (no ForeignRuntime)."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_OriginIgnoresRuntimeId", "check_origin", _origin_without_runtime_id)}


class BatchFoundBeforeOrigin(_Mutant):
    """A batch handle whose id is known is taken without its runtime id and epoch checked (an old epoch's batch runs)."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_BatchFoundBeforeOrigin", "check_batch", _batch_by_id_first)}


class UnknownBatchNotPrepared(_Mutant):
    """A batch id never prepared in this epoch is refused as NotPrepared instead of UnknownHandle."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_UnknownBatchNotPrepared", "check_batch", _unknown_batch_not_prepared)}


class FutureGenerationStale(_Mutant):
    """A request handle with a generation above its slot's is StaleHandle, not UnknownHandle (any mismatch is stale)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_FutureGenerationStale", "check_generation", _any_generation_mismatch_stale)}


class GenerationComparedLowBit(_Mutant):
    """Generations are compared on their low bit, so a handle 2 generations stale acts on the slot's new request."""

    invariant = "H3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_GenerationComparedLowBit", "check_generation", _generation_low_bit)}


class SlotRangeInclusive(_Mutant):
    """close_request and publish take slot_id == max_requests as in range (an index error, not UnknownHandle)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_SlotRangeInclusive", "check_slot", _slot_range_inclusive)}


class MissingExtentStale(_Mutant):
    """Any extent ref without a live record is StaleHandle, a never-issued generation included (no UnknownHandle)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_MissingExtentStale", "check_extent_issued", _missing_extent_stale)}


class RunsComparedSorted(_Mutant):
    """A ref's page runs are compared after sorting, so a real extent's runs in another order pass."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RunsComparedSorted", "check_extent_issued", _runs_compared_sorted)}


class RunsComparedAsPages(_Mutant):
    """A ref's runs are compared as the page names they cover, so the same pages cut into other runs pass."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RunsComparedAsPages", "check_extent_issued", _runs_compared_as_pages)}


class RetainWithoutEpoch(_Mutant):
    """retain does not compare the epoch: after a restart an old ref whose generation and runs recur is retained."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RetainWithoutEpoch", "retain_extent", _retain_without_epoch)}


class CloseIntentIgnoresBusy(_Mutant):
    """A Close intent in execute_batch skips the RequestBusy test: it closes a request a later prepared batch holds."""

    invariant = "O4"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_CloseIntentIgnoresBusy", "apply_intent", functools.partialmethod(_apply_intent, close_ignores_busy=True))
    }


class CancelExecutedNotPrepared(_Mutant):
    """cancel_batch of an executed batch raises NotPrepared instead of AlreadyExecuted."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_CancelExecutedNotPrepared", "cancel", _cancel_executed_not_prepared)}


class PublishNegativeFirstPage(_Mutant):
    """publish leaves out first_page >= 0: a negative first page counts from the row's end instead of InvalidPageRun."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_PublishNegativeFirstPage", "publish_pages", _publish_any_first_page)}


class SplitSharedOffByOne(_Mutant):
    """split raises ExtentShared only from 3 references, so an extent with 2 is split under its other holder."""

    invariant = "R3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_SplitSharedOffByOne", "split_extent", functools.partialmethod(_split_extent, shared_above=2))}


class SplitAtZeroAccepted(_Mutant):
    """split accepts at_page == 0 (an empty first half) instead of InvalidPageRun."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_SplitAtZeroAccepted", "split_extent", functools.partialmethod(_split_extent, lowest=0))}


class SplitTailFromSecondPage(_Mutant):
    """split takes the second half from the extent's second page on: right for at_page 1, wrong from a 3-page extent split at 2."""

    invariant = "R3"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_SplitTailFromSecondPage", "split_extent", functools.partialmethod(_split_extent, tail_from_second_page=True))
    }


class SubmitAcceptsRelease(_Mutant):
    """submit takes a Release among its tier intents (and releases the ref) instead of InvalidPlan."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_SubmitAcceptsRelease", "submit", functools.partialmethod(_submit, release_allowed=True))}


class DemoteChecksFirstPageBacked(_Mutant):
    """Demote's NotBackedUp test looks at the extent's first page only: later pages without a host copy lose their data."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_DemoteChecksFirstPageBacked", "apply_intent", functools.partialmethod(_apply_intent, demote_first_page_only=True))
    }


class DropChecksFirstPageResident(_Mutant):
    """Drop's WouldLoseData test looks at the extent's first page only: later pages with no device copy lose their data."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_DropChecksFirstPageResident", "apply_intent", functools.partialmethod(_apply_intent, drop_first_page_only=True))
    }


class PlanBackupUnchecked(_Mutant):
    """A Backup intent in execute_batch skips the free-host-page test (it lives on submit's path): no OutOfPages(L2)."""

    invariant = "R1"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_PlanBackupUnchecked", "apply_intent", functools.partialmethod(_apply_intent, plan_backup_unchecked=True))
    }


class SubmitRestoreCountsResident(_Mutant):
    """submit's Restore asks free device pages for every page of the extent, not only those without a device copy."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_SubmitRestoreCountsResident", "submit", functools.partialmethod(_submit, restore_counts_resident=True))
    }


class PlanNeededWithoutRestores(_Mutant):
    """prepare_batch's OutOfPages(L1) reports `needed` without the pages the plan's Restores take (right verdict, wrong count)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_PlanNeededWithoutRestores", "check_plan", functools.partialmethod(_check_plan, needed_without_restores=True))
    }


class PlanRestoreCountsResident(_Mutant):
    """prepare_batch counts every page of a restored extent against the free device pages, resident ones included."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_PlanRestoreCountsResident", "check_plan", functools.partialmethod(_check_plan, restore_counts_resident=True))
    }


class AttachCountsAttachedPages(_Mutant):
    """prepare_batch counts an attached extent's pages as pages to allocate: OutOfPages(L1) where they fit."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("_AttachCountsAttachedPages", "check_items", functools.partialmethod(_check_items, count_attached=True))
    }


class RestartRefusesInFlight(_Mutant):
    """restart with a transfer in flight raises Unsupported instead of draining it (the runtime claims RESTART)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RestartRefusesInFlight", "restart", functools.partialmethod(_restart, refuse_in_flight=True))}


class RestartLeaksInFlightPages(_Mutant):
    """restart forgets in-flight transfers without completing them: the pages they write, and deferred frees, never come back."""

    invariant = "R1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RestartLeaksInFlightPages", "restart", functools.partialmethod(_restart, leak_in_flight=True))}


class RestartBumpsEverySlot(_Mutant):
    """restart grows the generation of every slot, closed ones too, so the next open_request's handle has the wrong generation."""

    invariant = "H2"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RestartBumpsEverySlot", "restart", functools.partialmethod(_restart, bump_every_slot=True))}


class HostPoolSizedAsDevice(_Mutant):
    """OutOfPages(L2) counts against a host pool the size of the device pool: with many host pages in use, Backups fail."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_HostPoolSizedAsDevice", "require_free", _host_pool_sized_as_device)}


class HostWindow16(_Mutant):
    """The copy path addresses host pages through a 16-page window: host pages 16 and up alias pages 0 and up."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {"memory_class": _HostWindow16}


class RestoreReadersUnprotected(_Mutant):
    """A host page a pending restore still reads is freed at once on Drop or release (only writers defer a free)."""

    invariant = "O3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("_RestoreReadersUnprotected", "free_phys", _free_phys_readers_unprotected)}


#: name -> mutant class
MUTANTS: dict[str, type[_Mutant]] = {
    "origin_ignores_runtime_id": OriginIgnoresRuntimeId,
    "batch_found_before_origin": BatchFoundBeforeOrigin,
    "unknown_batch_not_prepared": UnknownBatchNotPrepared,
    "future_generation_stale": FutureGenerationStale,
    "generation_compared_low_bit": GenerationComparedLowBit,
    "slot_range_inclusive": SlotRangeInclusive,
    "missing_extent_stale": MissingExtentStale,
    "runs_compared_sorted": RunsComparedSorted,
    "runs_compared_as_pages": RunsComparedAsPages,
    "retain_without_epoch": RetainWithoutEpoch,
    "close_intent_ignores_busy": CloseIntentIgnoresBusy,
    "cancel_executed_not_prepared": CancelExecutedNotPrepared,
    "publish_negative_first_page": PublishNegativeFirstPage,
    "split_shared_off_by_one": SplitSharedOffByOne,
    "split_at_zero_accepted": SplitAtZeroAccepted,
    "split_tail_from_second_page": SplitTailFromSecondPage,
    "submit_accepts_release": SubmitAcceptsRelease,
    "demote_checks_first_page_backed": DemoteChecksFirstPageBacked,
    "drop_checks_first_page_resident": DropChecksFirstPageResident,
    "plan_backup_unchecked": PlanBackupUnchecked,
    "submit_restore_counts_resident": SubmitRestoreCountsResident,
    "plan_needed_without_restores": PlanNeededWithoutRestores,
    "plan_restore_counts_resident": PlanRestoreCountsResident,
    "attach_counts_attached_pages": AttachCountsAttachedPages,
    "restart_refuses_in_flight": RestartRefusesInFlight,
    "restart_leaks_in_flight_pages": RestartLeaksInFlightPages,
    "restart_bumps_every_slot": RestartBumpsEverySlot,
    "host_pool_sized_as_device": HostPoolSizedAsDevice,
    "host_window_16": HostWindow16,
    "restore_readers_unprotected": RestoreReadersUnprotected,
}


# -- the tables ------------------------------------------------------------------------------

_SAME_AS_EVERY_REQUEST_HANDLE = ("local.stale_generation_accepted", "situation.generation_compared_low_bit", "local.old_epoch_accepted")

#: operation -> error class -> the mutants (of every family) that get that error wrong: not
#: raised where the spec asks for it, raised where it does not, or another class raised. The
#: errors are those spec/protocol.md gives each operation (section 3's handle checks first,
#: then the operation's own; an execute_batch's intents raise their standalone errors).
OPERATION_ERRORS: dict[str, dict[str, tuple[str, ...]]] = {
    "info": {},
    "open_request": {"OutOfSlots": ("local.second_handle_to_live_slot", "family.open_slot_loop_short")},
    "close_request": {
        "ForeignRuntime": ("situation.origin_ignores_runtime_id",),
        "StaleHandle": (*_SAME_AS_EVERY_REQUEST_HANDLE, "family.stale_only_one_generation_back"),
        "UnknownHandle": ("situation.future_generation_stale", "situation.slot_range_inclusive"),
        "RequestBusy": ("family.close_checks_busy_first", "family.busy_newest_batch_only"),
    },
    "prepare_batch": {
        "InvalidPlan": ("family.empty_item_on_fast_path", "family.attach_tests_computed_tokens", "family.duplicate_before_intent_handles"),
        "ForeignRuntime": ("family.origin_cached_by_epoch", "situation.origin_ignores_runtime_id"),
        "StaleHandle": _SAME_AS_EVERY_REQUEST_HANDLE,
        "UnknownHandle": ("situation.future_generation_stale", "situation.missing_extent_stale", "situation.runs_compared_sorted"),
        "NoL2": ("family.nol2_before_extent_check",),
        "NoL3": (),
        "NotBackedUp": (),
        "RequestBusy": ("family.reopen_keeps_outputs", "family.cancel_keeps_output"),
        "NotResident": ("family.resident_in_either_tier",),
        "RowFull": ("family.fast_path_skips_row_full",),
        "OutOfPages": (
            "family.prefill_pages_floor",
            "family.deferred_counted_free",
            "family.fast_path_forgets_restore_pages",
            "situation.plan_needed_without_restores",
            "situation.plan_restore_counts_resident",
            "situation.attach_counts_attached_pages",
        ),
    },
    "execute_batch": {
        "ForeignRuntime": ("situation.batch_found_before_origin", "situation.origin_ignores_runtime_id"),
        "StaleHandle": ("situation.batch_found_before_origin", "local.old_epoch_accepted"),
        "UnknownHandle": ("situation.unknown_batch_not_prepared",),
        "AlreadyExecuted": ("local.execute_twice", "family.finished_errors_swapped"),
        "NotPrepared": ("family.finished_errors_swapped",),
        "OutOfOrder": ("local.execute_out_of_order", "family.order_only_same_requests"),
        "OutOfPages": ("situation.plan_backup_unchecked", "family.backup_counts_all_pages", "family.execute_keeps_compute_on_intent_error"),
        "NotBackedUp": ("situation.demote_checks_first_page_backed",),
        "ExtentInUse": ("local.demote_in_use", "family.demote_ignores_reserved_rows"),
        "WouldLoseData": ("situation.drop_checks_first_page_resident", "family.drop_refuses_pending_restore"),
        "InvalidPageRun": ("family.intents_before_tokens", "family.publish_ceil_pages", "situation.publish_negative_first_page"),
        "RequestBusy": ("situation.close_intent_ignores_busy",),
    },
    "cancel_batch": {
        "ForeignRuntime": ("situation.batch_found_before_origin", "situation.origin_ignores_runtime_id"),
        "StaleHandle": ("situation.batch_found_before_origin", "local.old_epoch_accepted"),
        "UnknownHandle": ("situation.unknown_batch_not_prepared",),
        "AlreadyExecuted": ("situation.cancel_executed_not_prepared",),
        "NotPrepared": ("family.cancel_twice_is_noop",),
        "BatchDependency": ("family.cancel_dependency_reversed",),
    },
    "publish": {
        "ForeignRuntime": ("situation.origin_ignores_runtime_id",),
        "StaleHandle": _SAME_AS_EVERY_REQUEST_HANDLE,
        "UnknownHandle": ("situation.future_generation_stale", "situation.slot_range_inclusive"),
        "InvalidPageRun": ("family.publish_ceil_pages", "family.publish_reserved_pages", "situation.publish_negative_first_page"),
    },
    "split": {
        "ForeignRuntime": ("situation.origin_ignores_runtime_id",),
        "StaleHandle": ("family.newest_extent_unknown_after_release", "local.old_epoch_accepted"),
        "UnknownHandle": (
            "situation.missing_extent_stale",
            "situation.runs_compared_sorted",
            "situation.runs_compared_as_pages",
            "family.runs_compared_as_set",
        ),
        "ExtentShared": ("situation.split_shared_off_by_one", "family.split_bounds_before_shared"),
        "InvalidPageRun": ("family.split_at_end_accepted", "situation.split_at_zero_accepted", "family.split_bounds_before_shared"),
    },
    "retain": {
        "ForeignRuntime": ("situation.origin_ignores_runtime_id",),
        "StaleHandle": ("situation.retain_without_epoch", "family.newest_extent_unknown_after_release", "local.old_epoch_accepted"),
        "UnknownHandle": ("family.retain_skips_runs_check", "situation.missing_extent_stale"),
    },
    "release": {
        "ForeignRuntime": ("situation.origin_ignores_runtime_id",),
        "StaleHandle": ("family.release_keeps_record", "family.newest_extent_unknown_after_release", "local.old_epoch_accepted"),
        "UnknownHandle": ("situation.missing_extent_stale", "situation.runs_compared_as_pages"),
    },
    "submit": {
        "InvalidPlan": ("situation.submit_accepts_release",),
        "ForeignRuntime": ("situation.origin_ignores_runtime_id",),
        "StaleHandle": ("family.newest_extent_unknown_after_release", "local.old_epoch_accepted"),
        "UnknownHandle": ("situation.missing_extent_stale", "family.submit_checks_handles_lazily"),
        "NoL2": ("family.nol2_before_extent_check",),
        "NoL3": (),
        "OutOfPages": (
            "family.backup_counts_all_pages",
            "family.deferred_counted_free",
            "situation.submit_restore_counts_resident",
            "situation.host_pool_sized_as_device",
        ),
        "NotBackedUp": ("situation.demote_checks_first_page_backed",),
        "ExtentInUse": ("local.demote_in_use", "family.demote_ignores_reserved_rows"),
        "WouldLoseData": ("situation.drop_checks_first_page_resident", "family.drop_refuses_pending_restore"),
    },
    "poll_completions": {},
    "wait_completions": {},
    "restart": {"Unsupported": ("situation.restart_refuses_in_flight",)},
}
# InvalidArgument (every operation that takes arguments), ComputeFailed (execute_batch) and
# RuntimeFault (every operation but info and restart) came after this table was written
# (issue 17); the last two are the faults check's, and the fault mutants fill their cells.
for _operation in ("close_request", "prepare_batch", "execute_batch", "cancel_batch", "publish", "split", "retain", "release", "submit"):
    OPERATION_ERRORS[_operation]["InvalidArgument"] = ()
OPERATION_ERRORS["execute_batch"]["ComputeFailed"] = (
    "faults.failed_batch_committed",
    "faults.reads_of_failed_restore_served",
    "faults.reads_of_reported_failure_served",
)
for _operation in OPERATION_ERRORS:
    if _operation != "restart":
        OPERATION_ERRORS[_operation]["RuntimeFault"] = ("faults.lost_machinery_serves",)

#: Cells of the table whose only possible mutant is of one kind, and why (from the spec).
UNREACHABLE: dict[tuple[str, str], str] = {
    ("prepare_batch", "NotBackedUp"): (
        "a Restore's NotBackedUp cannot be missed: every page of a live extent keeps a copy in some tier (Demote needs "
        "a host copy, Drop a device copy), so only a spurious NotBackedUp is a possible bug; the one mutant of it, "
        "family.restore_refuses_filling_host (NotBackedUp for a host copy a backup still fills), was removed with issue 17: "
        "a page a restore moves has no device copy, and since a Demote under a backup keeps the device copy (DROPPING) "
        "such a page's host copy is always valid"
    ),
    ("prepare_batch", "NoL2"): "the conformance configuration has L2, so a missing NoL2 never shows; only the order of the checks can be wrong",
    ("submit", "NoL2"): "as for prepare_batch",
    ("restart", "Unsupported"): "the runtime claims RESTART: only a spurious Unsupported is a possible bug",
    ("prepare_batch", "NoL3"): (
        "no check draws an L3 intent yet (the `storage` check of issue 21 item 4 is not built), so no mutant of NoL3 can "
        "be told; tests/runtime/test_runtime_l3.py holds LocalGPURuntime to the model's NoL3 directly"
    ),
    ("submit", "NoL3"): "as for prepare_batch",
    **{
        (operation, "InvalidArgument"): (
            "the state machine sends only well-typed arguments, so only a spurious InvalidArgument shows there; ill-typed "
            "ones are the bad-input fuzz's (conformance/badinput.py, tests/test_bad_input.py, whose tests kill a model "
            "without argument checks and a ledger that changes state on error)"
        )
        for operation in ("close_request", "prepare_batch", "execute_batch", "cancel_batch", "publish", "split", "retain", "release", "submit")
    },
}

#: The situations issue 14 measured the CI profile never reaching -> the mutants that need one.
SITUATIONS: dict[str, tuple[str, ...]] = {
    "restart with work in flight": (
        "situation.batch_found_before_origin",
        "situation.retain_without_epoch",
        "situation.restart_refuses_in_flight",
        "situation.restart_leaks_in_flight_pages",
        "family.restart_reports_drained",
    ),
    "OutOfPages from a plan that contains a Restore": (
        "situation.plan_needed_without_restores",
        "situation.plan_restore_counts_resident",
        "family.fast_path_forgets_restore_pages",
    ),
    "many host pages in use at once": (
        "situation.host_pool_sized_as_device",
        "situation.host_window_16",
        "family.backup_counts_all_pages",
        "family.restore_host_pages_sorted",
    ),
    "split of an extent of 3 or more pages": ("situation.split_tail_from_second_page", "family.split_tail_wrong_length"),
    "Drop while a Restore from that copy is pending": (
        "situation.restore_readers_unprotected",
        "family.drop_refuses_pending_restore",
        "family.drop_frees_host_under_restore",
    ),
    "a handle 2 or more generations stale": ("situation.generation_compared_low_bit", "family.stale_only_one_generation_back"),
    "repeated or rearranged page runs of a real extent": (
        "situation.runs_compared_sorted",
        "situation.runs_compared_as_pages",
        "family.runs_compared_as_set",
    ),
    # added here: the generations a restart leaves (spec section 2.2), with or without work in flight
    "the slot generations after a restart": ("situation.restart_bumps_every_slot", "family.restart_keeps_live_generations"),
    # added with the guided rules for the last survivors (coverage.SITUATIONS names each)
    "a request handle a generation ahead of its slot": ("situation.future_generation_stale",),
    "a real extent's pages cut into other runs": ("situation.runs_compared_as_pages",),
    "a real extent's whole runs in another order": ("situation.runs_compared_sorted",),
    "a retain of an old epoch's ref whose generation and runs the new epoch issued again": ("situation.retain_without_epoch",),
    "a Demote or Drop of an extent whose first page alone has the copy it needs": (
        "situation.demote_checks_first_page_backed",
        "situation.drop_checks_first_page_resident",
    ),
    "OutOfPages(L2) from a Backup intent at execute_batch": ("situation.plan_backup_unchecked",),
}

#: Mutants the CI profile does not kill: name -> what it takes to catch it, as far as the spec
#: tells (each a real bug: tests/runtime/test_situation_mutants.py tells it from the landed
#: runtime with a directed call sequence). Empty since 2026-12-02: the last seven
#: (`future_generation_stale`, `runs_compared_as_pages`, `runs_compared_sorted`,
#: `retain_without_epoch`, `drop_checks_first_page_resident`,
#: `demote_checks_first_page_backed`, `plan_backup_unchecked`) die since the suite's guided
#: rules `forge_live_handle`, `move_part_of_overlap`, `fill_host`'s `backup_in_plan` and
#: `retain_reissued_ref` send their situations (docs/mutation-score.md).
SITUATION_SURVIVORS: dict[str, str] = {}

#: The check that killed each other mutant in the measured kill table (CI profile, first
#: violation): trying it first gives the same verdict in less CI time.
SITUATION_KILLED_BY: dict[str, str] = {
    "close_intent_ignores_busy": "core",
    "publish_negative_first_page": "core",
    "restore_readers_unprotected": "tiers",
    "origin_ignores_runtime_id": "core",
    "batch_found_before_origin": "core",
    "unknown_batch_not_prepared": "core",
    "generation_compared_low_bit": "core",
    "slot_range_inclusive": "tiers",
    "missing_extent_stale": "core",
    "split_shared_off_by_one": "core",
    "split_at_zero_accepted": "core",
    "submit_accepts_release": "core",
    "plan_restore_counts_resident": "tiers",
    "attach_counts_attached_pages": "tiers",
    "restart_refuses_in_flight": "restart",
    "restart_leaks_in_flight_pages": "restart",
    "restart_bumps_every_slot": "restart",
    "cancel_executed_not_prepared": "core",
    "host_pool_sized_as_device": "tiers",
    "submit_restore_counts_resident": "tiers",
    "host_window_16": "tiers",
    "plan_needed_without_restores": "tiers",
    "split_tail_from_second_page": "core",
    "future_generation_stale": "core",
    "runs_compared_as_pages": "core",
    "runs_compared_sorted": "core",
    "demote_checks_first_page_backed": "tiers",
    "drop_checks_first_page_resident": "tiers",
    "plan_backup_unchecked": "tiers",
    "retain_without_epoch": "restart",
}
