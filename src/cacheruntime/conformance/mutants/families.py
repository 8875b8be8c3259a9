"""The `family` mutants: `LocalGPURuntime` with one seam swapped, per operation and error class.

Each mutant is the conformance configuration (`CONFORMANCE_OPTIONS`, as in
`cacheruntime.conformance.mutants.local`) with one part replaced through a constructor
seam: a `ledger_class` that overrides exactly one public method of `Ledger`, a ledger
`transaction_class`, an `ordering_class`, or a `memory_class` (the copy path). None
overrides a private method. Where a bug lives inside a long method, the override is a
copy of that method with the one change; the copies are the module's `_*` functions.

The family covers every boundary operation against the error classes `spec/protocol.md`
gives it (an error not raised when it should be, the wrong one raised, or one raised
spuriously) and the situations issue 14 lists: a restart with work in flight, out of
pages from a plan with a Restore, many host pages in use, a split of an extent of 3 or
more pages, a Drop while a Restore from that copy is pending, a handle more than one
generation stale, rearranged or repeated page runs, wrong completion reporting,
off-by-one page accounting and wrong tags written.

Three mutants whose only target was a restore reading a host copy a backup still fills
were removed with issue 17 (`restore_refuses_filling_host`: NotBackedUp for such a copy;
`restore_waits_for_first_page_only`: a restore's dependencies taken from its first page;
`restore_completed_before_backup`: compute's wait completing a restore before its backup):
a Demote while a page's backup is in flight now keeps the device copy (DROPPING) until the
backup lands, so a page a restore moves always has a valid host copy and no restore waits
for a backup. Each changed only code that no sequence of calls reaches any more.

The mutants were written from the spec and the runtime only, without reading the
suite's rules. `SURVIVORS` lists those the CI profile does not kill, with the reason as
far as the spec tells: they are the suite's blind spots, and
`tests/conformance/test_conformance_mutants.py` asserts that they still survive, so an
improvement of the suite that kills one fails that test until its entry is removed.
`EQUIVALENT` lists those no run of the conformance configuration can tell from the
landed runtime, with why.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from cacheruntime.protocol import (
    AlreadyExecuted,
    Backup,
    BatchDependency,
    BatchItem,
    BatchState,
    CacheExtentRef,
    Close,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    Intent,
    InvalidPageRun,
    InvalidPlan,
    NoL2,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfOrder,
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
    WouldLoseData,
)
from cacheruntime.runtime.device.memory import KVMemory
from cacheruntime.runtime.device.ordering import Ordering
from cacheruntime.runtime.device.streams import Event, Stream
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, suite_streams
from cacheruntime.runtime.ledger import Ledger, Transaction
from cacheruntime.runtime.ledger.batches import Executed
from cacheruntime.runtime.ledger.decode import ItemHandles
from cacheruntime.runtime.ledger.records import Batch, Extent, Slot
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


# -- copies of long ledger methods, each with knobs for the one change a mutant makes ------


def _check_items(
    self: Ledger,
    slots: list[int],
    rows: list[Slot],
    items: tuple[BatchItem, ...],
    start_tokens: list[int],
    restoring: set[int],
    moving: int,
    *,
    attach_gate: str = "reserved",
    resident_any_tier: bool = False,
) -> tuple[list[int], list[int], int, bool]:
    """`Batches.check_items`; `attach_gate="computed"` tests the row's computed tokens for attach,
    `resident_any_tier` takes a page with a copy in either tier as resident."""
    ps, max_tokens, pages, extents, l1 = self.page_size, self.max_request_tokens, self.state.pages, self.state.extents, Tier.L1
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
            if slot.num_tokens if attach_gate == "computed" else reserved:
                raise InvalidPlan(f"slot {slot_id}: attach is only allowed on an empty row")
            if append and slot.produced <= slot.appended:
                raise RequestBusy(f"slot {slot_id}: no previous output to append")
            attached = referenced = 0
            for extent in item.attach:
                extent_pages = extents[extent.generation].pages
                for page in extent_pages:
                    resident = bool(pages[page].copies) if resident_any_tier else self.has_copy(page, l1)
                    if not resident and page not in restoring:
                        raise NotResident(f"page {page} of an attached extent has no device copy and no restore")
                attached += len(extent_pages)
                referenced += extent.page_count
            end += attached * ps
            need -= referenced
        elif append and slot.produced <= slot.appended:
            raise RequestBusy(f"slot {slot_id}: no previous output to append")
        if end > max_tokens:
            raise RowFull(f"slot {slot_id}: {end} tokens > max_request_tokens {max_tokens}")
        starts.append(end - new_tokens)
        ends.append(end)
        need += -(-end // ps) - row_pages
    return starts, ends, need, one_token


def _decode_route(
    self: Ledger,
    handles: ItemHandles,
    start_tokens: list[int],
    ends: list[int],
    restoring: int,
    *,
    row_check: bool = True,
    count_restoring: bool = True,
    floor_ends: bool = False,
    empty_items_general: bool = True,
) -> tuple[list[int], bool, list[int] | None, int, int] | None:
    """`Decode.decode_route` with knobs for the mutants of the fast path's checks and counts."""
    if not self.fast_path or handles.special:
        return None
    if row_check and max(ends) > self.max_request_tokens:
        return None
    ps = self.page_size
    restore_need = restoring if count_restoring else 0
    if handles.single_inputs:
        offsets = [start % ps for start in start_tokens]
        opened = offsets.count(0)
        return start_tokens, True, offsets, opened, restore_need + opened
    if empty_items_general and min(handles.lengths) < 1:
        return None
    covered = sum(end // ps for end in ends) if floor_ends else sum(-(-end // ps) for end in ends)
    need = restore_need + covered - sum(-(-start // ps) for start in start_tokens)
    return start_tokens, False, None, 0, need


def _execute_intents_first(self: Ledger, batch: PreparedBatchHandle) -> Executed:
    """`Batches.execute` with the plan's intents applied before the batch's tokens are written."""
    record = self.check_batch(batch)
    self.check_execute_once(batch, record.state if isinstance(record, Batch) else record[0])
    assert isinstance(record, Batch)
    self.check_execute_order(batch, record.slot_set)
    intents = record.plan.intents
    if any(not isinstance(intent, Restore) for intent in intents):
        self.txn.start_journal()
    all_slots, ps = self.state.slots, self.page_size
    rows = list(map(all_slots.__getitem__, record.slots))
    ready: list[int] = []
    restoring = self.restoring_pages()
    if restoring:
        for slot, end in zip(rows, record.ends):
            read = slot.pages[: -(-end // ps)]
            if not restoring.isdisjoint(read):
                if self.txn.journal is None:
                    self.txn.start_journal()  # a restore it awaits may turn out failed: the call must undo
                ready += self.await_restores(set(read))
                restoring = self.restoring_pages()
    self.finish_batch(batch.batch_id, BatchState.EXECUTED)
    published: list[CacheExtentRef] = []
    tickets: list[TransferTicket] = []
    for intent in intents:
        if not isinstance(intent, Restore):
            outcome = self.apply_intent(intent)
            if isinstance(outcome, CacheExtentRef):
                published.append(outcome)
            elif isinstance(outcome, TransferTicket):
                tickets.append(outcome)
    first_tags: range | list[int]
    if self.fast_path and record.one_token and self.txn.journal is None:
        first_tags = self.write_decode_tags(rows, record.starts, record.ends)
    else:
        first_tags = self.write_tags(rows, record.starts, record.ends)
    return Executed(record, rows, first_tags, ready, tuple(published), tuple(tickets))


def _cancel(self: Ledger, batch: PreparedBatchHandle, *, keep_pages: str = "ceil", give_back_outputs: bool = True, idempotent: bool = False) -> None:
    """`Batches.cancel`; `keep_pages="floor"` keeps only the row's whole reserved pages,
    `give_back_outputs=False` leaves the batch's output counted as produced, `idempotent`
    takes a second cancel as done."""
    record = self.check_batch(batch)
    state = record.state if isinstance(record, Batch) else record[0]
    if state is BatchState.EXECUTED:
        raise AlreadyExecuted(f"batch {batch.batch_id} was executed; it cannot be cancelled")
    if state is BatchState.CANCELLED:
        if idempotent:
            return
        raise NotPrepared(f"batch {batch.batch_id} was cancelled already")
    assert isinstance(record, Batch)
    self.check_cancel_order(batch, record.slot_set)
    ps = self.page_size
    for slot_id, item, reserved in zip(record.slots, record.plan.items, record.start_tokens):
        slot = self.state.slots[slot_id]
        self.drop_row(slot, reserved // ps if keep_pages == "floor" else -(-reserved // ps))
        slot.reserved_tokens = reserved
        if give_back_outputs:
            slot.produced -= 1
            slot.appended -= int(item.append_previous_output)
    self.finish_batch(batch.batch_id, BatchState.CANCELLED)


def _publish_pages(self: Ledger, intent: Publish, *, measure: str = "computed_floor") -> CacheExtentRef:
    """`Extents.publish_pages`; `measure` is how the row's full pages are counted."""
    slot = self.check_slot(intent.request)
    ps = self.page_size
    if measure == "computed_ceil":
        full = -(-slot.num_tokens // ps)
    elif measure == "reserved_floor":
        full = slot.reserved_tokens // ps
    else:
        full = slot.num_tokens // ps
    if intent.page_count < 1 or intent.first_page < 0 or intent.first_page + intent.page_count > full:
        raise InvalidPageRun(f"row pages [{intent.first_page}, {intent.first_page + intent.page_count}) are not inside the {full} full pages")
    pages = tuple(slot.pages[intent.first_page : intent.first_page + intent.page_count])
    for page in pages:
        self.add_holder(page)
    return self.new_extent(pages)


def _split_extent(
    self: Ledger, extent: CacheExtentRef, at_page: int, *, end_inclusive: bool = False, tail: str = "rest", bounds_first: bool = False
) -> tuple[CacheExtentRef, CacheExtentRef]:
    """`Extents.split_extent`; the knobs are the mutants' one change each."""
    record = self.check_extent(extent)
    count = len(record.pages)
    in_range = 0 < at_page <= count if end_inclusive else 0 < at_page < count

    def shared() -> None:
        if record.refcount != 1:
            raise ExtentShared(f"extent {extent.generation} has {record.refcount} references")

    def bounds() -> None:
        if not in_range:
            raise InvalidPageRun(f"split point {at_page} is not inside 1..{count - 1}")

    for check in (bounds, shared) if bounds_first else (shared, bounds):
        check()
    extents, generation = self.state.extents, extent.generation
    del extents[generation]
    self.txn.undo(lambda: extents.__setitem__(generation, record))
    rest = record.pages[count - at_page :] if tail == "last_at_page" else record.pages[at_page:]
    return self.new_extent(record.pages[:at_page]), self.new_extent(rest)


def _apply_intent(self: Ledger, intent: Intent, *, backup_all_pages: bool = False, drop_needs_valid: bool = False) -> Any:
    """`Extents.apply_intent`; `backup_all_pages` asks free host pages for the whole extent,
    `drop_needs_valid` refuses a Drop while the device copy is still filling."""
    st = self.state
    if isinstance(intent, Publish):
        return self.publish_pages(intent)
    if isinstance(intent, Close):
        self.close_row(intent.request)
        return None
    self.check_intent_handles(intent)
    record = st.extents[intent.extent.generation]
    if isinstance(intent, Release):
        self.release_ref(intent.extent.generation)
        return None
    if isinstance(intent, Backup):
        todo = [p for p in record.pages if Tier.L2 not in st.pages[p].copies]
        self.require_free(Tier.L2, len(record.pages) if backup_all_pages else len(todo))
        self.keep_dropping(record.pages, Tier.L2)
        return self.start_transfer(TransferKind.BACKUP, intent.extent.generation, todo)
    if isinstance(intent, Demote):
        for page in record.pages:
            if not self.has_copy(page, Tier.L2):
                raise NotBackedUp(f"page {page} has no host copy and no backup in flight")
        self.check_demote_unmapped(record)
        for page in record.pages:
            self.drop_or_keep_until_landed(page, Tier.L1)
        return None
    if isinstance(intent, Drop):
        for page in record.pages:
            copy = st.pages[page].copies.get(Tier.L1)
            if not self.has_copy(page, Tier.L1) or (drop_needs_valid and copy is not None and copy.state is not CopyState.VALID):
                raise WouldLoseData(f"page {page} has no device copy; dropping its host copy loses it")
        for page in record.pages:
            self.drop_or_keep_until_landed(page, Tier.L2)
        return None
    raise InvalidPlan(f"unknown intent {type(intent).__name__}")


def _restart(
    self: Ledger, failed: Iterable[int] = (), abandoned: bool = False, *, versions_restart: bool = False, bump_live: bool = True, keep_drained: bool = False
) -> None:
    """`Ledger.restart`; the knobs are the mutants' one change each."""
    if not abandoned:
        self.complete_all(failed)
    st = self.state
    generations = [slot.generation + int(slot.live and bump_live) for slot in st.slots]
    tags = {tier: pool.tags for tier, pool in st.pools.items()}
    drained = list(st.unreported)
    self.state = self.fresh_state(st.epoch + 1, generations, tags, 1 if versions_restart else st.next_version)
    self.state.faults = st.faults
    self.held = []
    if keep_drained:
        self.state.unreported = drained


# -- ledgers with one wrong public method ------------------------------------------------


def _open_slot_short_loop(self: Ledger) -> tuple[int, Slot] | None:
    for slot_id, slot in enumerate(self.state.slots[:-1]):  # the loop stops one slot early
        if not slot.live:
            slot.live = True
            self.slot_changes += 1
            slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0
            slot.produced = slot.appended = 0
            slot.last_output = None
            return slot_id, slot
    return None


def _open_slot_keep_outputs(self: Ledger) -> tuple[int, Slot] | None:
    for slot_id, slot in enumerate(self.state.slots):
        if not slot.live:
            slot.live = True
            self.slot_changes += 1
            slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0  # produced, appended, last_output left over
            return slot_id, slot
    return None


def _close_busy_first(self: Ledger, request: RequestRuntimeHandle) -> None:
    if isinstance(request, RequestRuntimeHandle):
        self.check_not_busy(request)
    Ledger.close_row(self, request)


def _busy_newest_only(self: Ledger, request: RequestRuntimeHandle) -> None:
    batches = self.state.batches
    if batches:
        newest = max(batches)
        if batches[newest].state is BatchState.PREPARED and request.slot_id in batches[newest].slot_set:
            raise RequestBusy(f"request in slot {request.slot_id} is in prepared batch {newest}")


def _duplicates_first(self: Ledger, items: tuple[BatchItem, ...], intents: tuple[Intent, ...]) -> ItemHandles:
    slots, _, _ = self.check_item_handles(items)
    if len(set(slots)) != len(slots):
        raise InvalidPlan("a request appears twice in the plan")
    return Ledger.item_handles(self, items, intents)


def _execute_once_swapped(self: Ledger, batch: PreparedBatchHandle, state: BatchState) -> None:
    if state is BatchState.EXECUTED:
        raise NotPrepared(f"batch {batch.batch_id} is not prepared")
    if state is BatchState.CANCELLED:
        raise AlreadyExecuted(f"batch {batch.batch_id} is finished")


def _order_same_requests(self: Ledger, batch: PreparedBatchHandle, slot_set: frozenset[int]) -> None:
    for other_id, other in self.state.batches.items():
        if other_id < batch.batch_id and other.state is BatchState.PREPARED and other.slot_set == slot_set:
            raise OutOfOrder(f"batch {other_id} has the requests of batch {batch.batch_id} and has not executed")


def _demote_unmapped_computed(self: Ledger, record: Extent) -> None:
    mine, ps = set(record.pages), self.page_size
    held = {p for slot in self.state.slots if slot.live for p in slot.pages[: -(-slot.num_tokens // ps)]} & mine
    if held:
        raise ExtentInUse(f"pages {sorted(held)} are mapped into live request rows")


def _drop_copy_host_at_once(self: Ledger, name: int, tier: Tier) -> None:
    copies = self.state.pages[name].copies
    device = copies.get(Tier.L1)
    if tier is not Tier.L2 or device is None or device.state is not CopyState.FILLING:
        Ledger.drop_copy(self, name, tier)
        return
    # The restore reading this host page "already has" the data: free the host page now.
    copy = copies.pop(tier)
    self.txn.undo(lambda: copies.__setitem__(tier, copy))
    free = self.state.pools[tier].free
    free.append(copy.phys)
    self.txn.undo(free.pop)


def _write_tags_overlap(self: Ledger, rows: list[Slot], starts: list[int], ends: list[int]) -> list[int]:
    first_tags = Ledger.write_tags(self, rows, starts, ends)
    return first_tags[:1] + [tag - 1 for tag in first_tags[1:]]


def _cancel_order_earlier(self: Ledger, batch: PreparedBatchHandle, slot_set: frozenset[int]) -> None:
    for other_id, other in self.state.batches.items():
        if other_id < batch.batch_id and other.state is BatchState.PREPARED and not slot_set.isdisjoint(other.slot_set):
            raise BatchDependency(f"batch {other_id} shares a request with batch {batch.batch_id}")


def _retain_by_generation(self: Ledger, extent: CacheExtentRef) -> None:
    record = None
    if isinstance(extent, CacheExtentRef) and extent.runtime_id == self.runtime_id and extent.epoch == self.state.epoch:
        record = self.state.extents.get(extent.generation)
    if record is None:
        record = self.check_extent(extent)
    record.refcount += 1
    self.txn.undo(lambda: setattr(record, "refcount", record.refcount - 1))


def _issued_runs_as_set(self: Ledger, extent: CacheExtentRef, record: Extent | None) -> None:
    if record is None:
        if self.numbering.issued_extent(extent.generation, self.state.next_extent):
            raise StaleHandle(f"extent {extent.generation} was released or split")
        raise UnknownHandle(f"extent {extent.generation} was never published")
    if set(record.runs) != set(extent.page_runs):
        raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")


def _issued_before_newest(self: Ledger, extent: CacheExtentRef, record: Extent | None) -> None:
    if record is None:
        last = self.state.next_extent - self.numbering.stride  # taken as "one past the last issued"
        if self.numbering.issued_extent(extent.generation, last):
            raise StaleHandle(f"extent {extent.generation} was released or split")
        raise UnknownHandle(f"extent {extent.generation} was never published")
    if record.runs != tuple(extent.page_runs):
        raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")


def _release_keep_record(self: Ledger, generation: int) -> None:
    record = self.state.extents[generation]
    record.refcount -= 1
    self.txn.undo(lambda: setattr(record, "refcount", record.refcount + 1))
    if record.refcount == 0:  # the pages go; the record stays until control "forgets" the ref
        for page in record.pages:
            self.drop_holder(page)


def _generation_one_back(self: Ledger, request: RequestRuntimeHandle, slot: Slot) -> None:
    if request.generation == slot.generation - 1:
        raise StaleHandle(f"slot {request.slot_id} is at generation {slot.generation}, the handle has {request.generation}")
    if request.generation != slot.generation or not slot.live:
        raise UnknownHandle(f"slot {request.slot_id} generation {request.generation} is not a live handle")


def _item_handles_epoch_cache(self: Ledger, items: tuple[BatchItem, ...]) -> tuple[list[int], list[Slot], bool]:
    all_slots = self.state.slots
    accepted_epoch: Any = None
    slots, rows = [], []
    special = False
    for item in items:
        request = item.request
        if not isinstance(request, RequestRuntimeHandle):
            raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
        if request.epoch != accepted_epoch:  # the origin check is cached by epoch only
            self.check_origin("request handle", request.runtime_id, request.epoch)
            accepted_epoch = request.epoch
        if not 0 <= request.slot_id < len(all_slots):
            raise UnknownHandle(f"slot {request.slot_id} does not exist")
        slot = all_slots[request.slot_id]
        if request.generation != slot.generation or not slot.live:
            self.check_generation(request, slot)
        if item.attach:
            special = True
            for extent in item.attach:
                self.check_extent(extent)
        elif item.append_previous_output:
            special = True
        slots.append(request.slot_id)
        rows.append(slot)
    return slots, rows, special


def _intent_handles_l2_first(self: Ledger, intent: Intent) -> None:
    if isinstance(intent, (Publish, Close)):
        self.check_slot(intent.request)
    elif isinstance(intent, (Backup, Restore, Demote, Drop, Release)):
        if not isinstance(intent, Release) and not self.l2_pages:
            raise NoL2("this runtime has no L2 tier")
        self.check_extent(intent.extent)
    else:
        raise InvalidPlan(f"unknown intent {type(intent).__name__}")


def _submit_lazy_handles(self: Ledger, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
    for intent in intents:
        if not isinstance(intent, (Backup, Restore, Demote, Drop)):
            raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
    tickets = []
    for intent in intents:
        if isinstance(intent, Restore):
            self.check_intent_handles(intent)
            pages = self.restore_pages(intent.extent)
            self.require_free(Tier.L1, len(pages))
            tickets.append(self.start_restore(intent.extent, pages))
        else:
            outcome = self.apply_intent(intent)  # checks the intent's handles on its turn
            if isinstance(outcome, TransferTicket):
                tickets.append(outcome)
    return tuple(tickets)


def _require_free_with_deferred(self: Ledger, tier: Tier, needed: int) -> None:
    pool = self.state.pools[tier]
    free = len(pool.free) + len(pool.deferred)  # deferred pages "will be free soon"
    if needed > free:
        raise OutOfPages(tier, needed, free)


def _report_poll_keeps(self: Ledger, wait: bool) -> tuple[Any, ...]:
    if wait:
        return Ledger.report(self, wait)
    return tuple(sorted(self.state.unreported, key=lambda c: c.ticket.transfer_id))


def _complete_empty_unqueued(self: Ledger, transfer_id: int) -> None:
    record = self.state.transfers[transfer_id]
    Ledger.complete_transfer(self, transfer_id)
    if not record.pages:
        self.state.unreported.pop()  # nothing moved: nothing to tell control


def _complete_all_fresh_queue(self: Ledger, failed: Iterable[int] = ()) -> None:
    self.state.unreported.clear()  # the queue is rebuilt from what this drain completes
    Ledger.complete_all(self, failed)


# -- other seams ---------------------------------------------------------------------------


class _StartJournalNoop(Transaction):
    """A transaction that keeps no journal unless the call began with one."""

    __slots__ = ()

    def start_journal(self) -> None:
        return None


class _KvReadyFirstOnly(Ordering):
    def wait_kv_ready(self, compute: Stream, restores: Iterable[Event]) -> None:
        super().wait_kv_ready(compute, list(restores)[:1])


class _RestoreSortedHost(KVMemory):
    """A copy path that gathers a restore's host pages in ascending order, whatever their destinations."""

    def restore(self, src_l2: list[int], dst_l1: list[int]) -> None:
        if self.cuda:
            super().restore(src_l2, dst_l1)
            return
        lanes, l1_pages = self.lanes, self.l1.shape[2]
        pages = torch.tensor(dst_l1, dtype=torch.long)
        index = (torch.arange(lanes, dtype=torch.long)[None, :] * l1_pages + pages[:, None]).reshape(-1)
        rows = torch.cat([self.l2_rows[p * lanes : (p + 1) * lanes] for p in sorted(src_l2)])
        self.l1_rows.index_copy_(0, index, rows)


# -- the mutants ---------------------------------------------------------------------------


class OpenSlotLoopShort(_Mutant):
    """open_request's scan for a free slot stops one slot short, so the last slot is never handed out."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("OpenSlotLoopShortLedger", "open_slot", _open_slot_short_loop)}


class ReopenKeepsOutputs(_Mutant):
    """A reopened slot keeps the previous request's output counters, so append_previous_output passes on a fresh request."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("ReopenKeepsOutputsLedger", "open_slot", _open_slot_keep_outputs)}


class CloseChecksBusyFirst(_Mutant):
    """close_request tests RequestBusy before the handle checks, so a stale or foreign handle of a busy slot gets RequestBusy."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("CloseChecksBusyFirstLedger", "close_row", _close_busy_first)}


class BusyNewestBatchOnly(_Mutant):
    """The RequestBusy test looks only at the newest prepared batch, not every prepared one."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("BusyNewestBatchOnlyLedger", "check_not_busy", _busy_newest_only)}


class DuplicateBeforeIntentHandles(_Mutant):
    """prepare_batch rejects a duplicate request before it checks the intents' handles (wrong error order)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("DuplicateBeforeIntentHandlesLedger", "item_handles", _duplicates_first)}


class EmptyItemOnFastPath(_Mutant):
    """The prefill fast path lets an item with no input ids through instead of InvalidPlan."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("EmptyItemOnFastPathLedger", "decode_route", functools.partialmethod(_decode_route, empty_items_general=False))
    }


class AttachTestsComputedTokens(_Mutant):
    """attach is allowed on a row with tokens reserved by a prepared batch but none computed yet."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("AttachTestsComputedTokensLedger", "check_items", functools.partialmethod(_check_items, attach_gate="computed"))
    }


class ResidentInEitherTier(_Mutant):
    """NotResident only fires for a page with no copy at all: a host-only page passes as resident."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("ResidentInEitherTierLedger", "check_items", functools.partialmethod(_check_items, resident_any_tier=True))
    }


class FastPathSkipsRowFull(_Mutant):
    """The plain-item fast path leaves out the row-length check, so an over-long prefill meets OutOfPages, not RowFull."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("FastPathSkipsRowFullLedger", "decode_route", functools.partialmethod(_decode_route, row_check=False))
    }


class FastPathForgetsRestorePages(_Mutant):
    """The fast path counts only new pages against the free device pages, not those the plan's Restores take."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("FastPathForgetsRestorePagesLedger", "decode_route", functools.partialmethod(_decode_route, count_restoring=False))
    }


class PrefillPagesFloor(_Mutant):
    """The prefill fast path counts the pages a row needs as floor(end / page_size), one short for a partial last page."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("PrefillPagesFloorLedger", "decode_route", functools.partialmethod(_decode_route, floor_ends=True))
    }


class FinishedErrorsSwapped(_Mutant):
    """Executing an executed batch says NotPrepared and a cancelled one AlreadyExecuted (the two errors swapped)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("FinishedErrorsSwappedLedger", "check_execute_once", _execute_once_swapped)}


class OrderOnlySameRequests(_Mutant):
    """OutOfOrder only when the earlier batch has exactly the same requests, not when the sets merely overlap."""

    invariant = "O4"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("OrderOnlySameRequestsLedger", "check_execute_order", _order_same_requests)}


class IntentsBeforeTokens(_Mutant):
    """execute_batch applies the plan's intents before it writes the batch's tokens (a Publish of the new pages fails)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("IntentsBeforeTokensLedger", "execute", _execute_intents_first)}


class ExecuteKeepsComputeOnIntentError(_Mutant):
    """A failing intent in execute_batch leaves the batch's compute applied: the call fails but the batch is executed."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": type("ExecuteKeepsComputeLedger", (Ledger,), {"transaction_class": _StartJournalNoop})}


class BackupCountsAllPages(_Mutant):
    """A Backup asks free host pages for every page of the extent, not only those without a host copy."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("BackupCountsAllPagesLedger", "apply_intent", functools.partialmethod(_apply_intent, backup_all_pages=True))
    }


class DemoteIgnoresReservedRows(_Mutant):
    """The ExtentInUse test sees only the rows' computed pages, so pages attached by a prepared batch can be demoted."""

    invariant = "E1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("DemoteIgnoresReservedRowsLedger", "check_demote_unmapped", _demote_unmapped_computed)}


class DropRefusesPendingRestore(_Mutant):
    """A Drop while a Restore of the extent is pending is refused (WouldLoseData): a filling device copy is not counted."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("DropRefusesPendingRestoreLedger", "apply_intent", functools.partialmethod(_apply_intent, drop_needs_valid=True))
    }


class DropFreesHostUnderRestore(_Mutant):
    """Dropping a host copy that a pending restore still reads frees the host page at once instead of after the H2D."""

    invariant = "O3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("DropFreesHostUnderRestoreLedger", "drop_copy", _drop_copy_host_at_once)}


class ItemTagsOverlap(_Mutant):
    """On the general route each item after the first is handed tags starting one early, overlapping the previous item's."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("ItemTagsOverlapLedger", "write_tags", _write_tags_overlap)}


class CancelKeepsWholePagesOnly(_Mutant):
    """cancel_batch keeps floor(previous reserved length / page_size) pages, dropping a partly written last page."""

    invariant = "O1"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("CancelKeepsWholePagesOnlyLedger", "cancel", functools.partialmethod(_cancel, keep_pages="floor"))
    }


class CancelKeepsOutput(_Mutant):
    """cancel_batch leaves the cancelled batch's output counted, so a later append_previous_output is accepted."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("CancelKeepsOutputLedger", "cancel", functools.partialmethod(_cancel, give_back_outputs=False))}


class CancelDependencyReversed(_Mutant):
    """cancel_batch's BatchDependency test looks at earlier prepared batches instead of later ones."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("CancelDependencyReversedLedger", "check_cancel_order", _cancel_order_earlier)}


class CancelTwiceIsNoop(_Mutant):
    """cancel_batch of a batch already cancelled returns quietly (an "idempotent" cancel) instead of NotPrepared."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("CancelTwiceIsNoopLedger", "cancel", functools.partialmethod(_cancel, idempotent=True))}


class PublishCeilPages(_Mutant):
    """publish counts a row's full pages as ceil(num_tokens / page_size), so a partly written page can be published."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("PublishCeilPagesLedger", "publish_pages", functools.partialmethod(_publish_pages, measure="computed_ceil"))
    }


class PublishReservedPages(_Mutant):
    """publish measures the row by its reserved length, so pages of a prepared, not yet executed batch can be published."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("PublishReservedPagesLedger", "publish_pages", functools.partialmethod(_publish_pages, measure="reserved_floor"))
    }


class SplitAtEndAccepted(_Mutant):
    """split accepts at_page == page_count (an empty second half) instead of InvalidPageRun."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("SplitAtEndAcceptedLedger", "split_extent", functools.partialmethod(_split_extent, end_inclusive=True))
    }


class SplitTailWrongLength(_Mutant):
    """split takes the second half as the last at_page pages, not the last page_count - at_page (right only for 2 pages)."""

    invariant = "R3"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("SplitTailWrongLengthLedger", "split_extent", functools.partialmethod(_split_extent, tail="last_at_page"))
    }


class SplitBoundsBeforeShared(_Mutant):
    """split checks the split point before the reference count (InvalidPageRun where ExtentShared comes first)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("SplitBoundsBeforeSharedLedger", "split_extent", functools.partialmethod(_split_extent, bounds_first=True))
    }


class RetainSkipsRunsCheck(_Mutant):
    """retain finds the extent by generation and skips the page-run check, so a ref with forged runs is retained."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("RetainSkipsRunsCheckLedger", "retain_extent", _retain_by_generation)}


class RunsComparedAsSet(_Mutant):
    """A ref's page runs are compared as a set, so rearranged or repeated runs of a real extent pass."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("RunsComparedAsSetLedger", "check_extent_issued", _issued_runs_as_set)}


class NewestExtentUnknownAfterRelease(_Mutant):
    """The issued-extent test treats next_extent as the last issued, so the newest released extent is UnknownHandle, not StaleHandle."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("NewestExtentUnknownLedger", "check_extent_issued", _issued_before_newest)}


class ReleaseKeepsRecord(_Mutant):
    """The last release frees the extent's pages but keeps its record, so a second release is not refused (a double free)."""

    invariant = "R4"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("ReleaseKeepsRecordLedger", "release_ref", _release_keep_record)}


class StaleOnlyOneGenerationBack(_Mutant):
    """Only the slot's previous generation is StaleHandle; a handle two or more generations old is UnknownHandle."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("StaleOnlyOneGenerationBackLedger", "check_generation", _generation_one_back)}


class OriginCachedByEpoch(_Mutant):
    """A plan's origin check is cached by epoch only, so a later item with another runtime's handle is not ForeignRuntime."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("OriginCachedByEpochLedger", "check_item_handles", _item_handles_epoch_cache)}


class NoL2BeforeExtentCheck(_Mutant):
    """A tier intent on a runtime without L2 raises NoL2 before its extent's handle checks."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("NoL2BeforeExtentCheckLedger", "check_intent_handles", _intent_handles_l2_first)}


class SubmitChecksHandlesLazily(_Mutant):
    """submit checks each intent's handle only on its turn, after the earlier intents' preconditions (wrong error first)."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("SubmitChecksHandlesLazilyLedger", "submit", _submit_lazy_handles)}


class DeferredCountedFree(_Mutant):
    """OutOfPages counts deferred frees as free pages, so an allocation can run past the free list."""

    invariant = "R1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("DeferredCountedFreeLedger", "require_free", _require_free_with_deferred)}


class PollKeepsQueue(_Mutant):
    """poll_completions hands over the completion queue without emptying it: each completion is reported again."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("PollKeepsQueueLedger", "report", _report_poll_keeps)}


class EmptyMoveNeverReported(_Mutant):
    """A transfer with nothing to move completes at once but is never reported."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("EmptyMoveNeverReportedLedger", "complete_transfer", _complete_empty_unqueued)}


class WaitForgetsQueuedCompletions(_Mutant):
    """wait_completions empties the completion queue before draining, so completions queued by compute's waits are never reported."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("WaitForgetsQueuedCompletionsLedger", "complete_all", _complete_all_fresh_queue)}


class RestartResetsVersions(_Mutant):
    """restart starts the version tags at 1 again, so new writes can pass for the old epoch's."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("RestartResetsVersionsLedger", "restart", functools.partialmethod(_restart, versions_restart=True))
    }


class RestartKeepsLiveGenerations(_Mutant):
    """restart closes live slots without growing their generations."""

    invariant = "H2"
    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": _ledger("RestartKeepsLiveGenerationsLedger", "restart", functools.partialmethod(_restart, bump_live=False))
    }


class RestartReportsDrained(_Mutant):
    """restart keeps the unreported completions, the drained transfers' among them, and reports them in the new epoch."""

    invariant = "contract"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ledger("RestartReportsDrainedLedger", "restart", functools.partialmethod(_restart, keep_drained=True))}


class KvReadyFirstRestoreOnly(_Mutant):
    """Compute waits for the first restore it reads, not for every one (O1 with two restores in a batch)."""

    invariant = "O1"
    parts: ClassVar[dict[str, Any]] = {"ordering_class": _KvReadyFirstOnly}


class RestoreHostPagesSorted(_Mutant):
    """The restore copy path gathers host pages in ascending order, not in the order of their device destinations."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {"memory_class": _RestoreSortedHost}


#: name -> mutant class
MUTANTS: dict[str, type[_Mutant]] = {
    "open_slot_loop_short": OpenSlotLoopShort,
    "reopen_keeps_outputs": ReopenKeepsOutputs,
    "close_checks_busy_first": CloseChecksBusyFirst,
    "busy_newest_batch_only": BusyNewestBatchOnly,
    "duplicate_before_intent_handles": DuplicateBeforeIntentHandles,
    "empty_item_on_fast_path": EmptyItemOnFastPath,
    "attach_tests_computed_tokens": AttachTestsComputedTokens,
    "resident_in_either_tier": ResidentInEitherTier,
    "fast_path_skips_row_full": FastPathSkipsRowFull,
    "fast_path_forgets_restore_pages": FastPathForgetsRestorePages,
    "prefill_pages_floor": PrefillPagesFloor,
    "finished_errors_swapped": FinishedErrorsSwapped,
    "order_only_same_requests": OrderOnlySameRequests,
    "intents_before_tokens": IntentsBeforeTokens,
    "execute_keeps_compute_on_intent_error": ExecuteKeepsComputeOnIntentError,
    "backup_counts_all_pages": BackupCountsAllPages,
    "demote_ignores_reserved_rows": DemoteIgnoresReservedRows,
    "drop_refuses_pending_restore": DropRefusesPendingRestore,
    "drop_frees_host_under_restore": DropFreesHostUnderRestore,
    "item_tags_overlap": ItemTagsOverlap,
    "cancel_keeps_whole_pages_only": CancelKeepsWholePagesOnly,
    "cancel_keeps_output": CancelKeepsOutput,
    "cancel_dependency_reversed": CancelDependencyReversed,
    "cancel_twice_is_noop": CancelTwiceIsNoop,
    "publish_ceil_pages": PublishCeilPages,
    "publish_reserved_pages": PublishReservedPages,
    "split_at_end_accepted": SplitAtEndAccepted,
    "split_tail_wrong_length": SplitTailWrongLength,
    "split_bounds_before_shared": SplitBoundsBeforeShared,
    "retain_skips_runs_check": RetainSkipsRunsCheck,
    "runs_compared_as_set": RunsComparedAsSet,
    "newest_extent_unknown_after_release": NewestExtentUnknownAfterRelease,
    "release_keeps_record": ReleaseKeepsRecord,
    "stale_only_one_generation_back": StaleOnlyOneGenerationBack,
    "origin_cached_by_epoch": OriginCachedByEpoch,
    "nol2_before_extent_check": NoL2BeforeExtentCheck,
    "submit_checks_handles_lazily": SubmitChecksHandlesLazily,
    "deferred_counted_free": DeferredCountedFree,
    "poll_keeps_queue": PollKeepsQueue,
    "empty_move_never_reported": EmptyMoveNeverReported,
    "wait_forgets_queued_completions": WaitForgetsQueuedCompletions,
    "restart_resets_versions": RestartResetsVersions,
    "restart_keeps_live_generations": RestartKeepsLiveGenerations,
    "restart_reports_drained": RestartReportsDrained,
    "kv_ready_first_restore_only": KvReadyFirstRestoreOnly,
    "restore_host_pages_sorted": RestoreHostPagesSorted,
}

#: Mutants the CI profile does not kill: name -> why, as far as the spec tells (the suite's
#: rules were not read). They stay in MUTANTS; the mutant test asserts that they survive, so
#: the entry goes when the suite learns to kill one. The 20 listed until issue 14's item 4
#: all die now: each needed a situation the suite never reached (coverage.SITUATIONS). So do
#: the two that survived issue 17: `drop_frees_host_under_restore` (tiers, O3: the guided rule
#: `end_pages_under_restore` ends page names while a restore reads their host copies) and
#: `kv_ready_first_restore_only` (ordering, D1: `hit_two_evicted` computes over two restores).
SURVIVORS: dict[str, str] = {}

#: Mutants that behave like the landed runtime in the conformance configuration, so no
#: conformance run of that configuration can tell them apart: name -> why. They are not
#: asserted to die or to survive; a check on another configuration would be needed.
EQUIVALENT: dict[str, str] = {
    "nol2_before_extent_check": (
        "the order of NoL2 and the extent checks can show only on a runtime without L2, and every mutant is the conformance "
        "configuration (24 host pages): it never raises NoL2, so its behaviour is the landed runtime's there"
    ),
}

#: The check that killed each other mutant in the measured kill table (CI profile). The
#: mutant test tries it first, then the others: the same verdict, in less CI time.
KILLED_BY: dict[str, str] = {
    "kv_ready_first_restore_only": "ordering",
    "drop_frees_host_under_restore": "tiers",
    "open_slot_loop_short": "core",
    "reopen_keeps_outputs": "restart",
    "close_checks_busy_first": "core",
    "attach_tests_computed_tokens": "core",
    "prefill_pages_floor": "core",
    "finished_errors_swapped": "core",
    "order_only_same_requests": "core",
    "intents_before_tokens": "core",
    "execute_keeps_compute_on_intent_error": "tiers",
    "item_tags_overlap": "core",
    "cancel_dependency_reversed": "tiers",
    "cancel_twice_is_noop": "core",
    "split_at_end_accepted": "core",
    "split_tail_wrong_length": "core",
    "split_bounds_before_shared": "core",
    "retain_skips_runs_check": "tiers",
    "newest_extent_unknown_after_release": "core",
    "release_keeps_record": "core",
    "stale_only_one_generation_back": "core",
    "deferred_counted_free": "tiers",
    "poll_keeps_queue": "tiers",
    "empty_move_never_reported": "tiers",
    "wait_forgets_queued_completions": "tiers",
    "restart_resets_versions": "restart",
    "restart_keeps_live_generations": "restart",
    # killed since issue 14's item 4 (the suite reaches the situations they need)
    "busy_newest_batch_only": "core",
    "duplicate_before_intent_handles": "core",
    "fast_path_skips_row_full": "core",
    "publish_ceil_pages": "core",
    "runs_compared_as_set": "core",
    "origin_cached_by_epoch": "core",
    "cancel_keeps_output": "core",
    "cancel_keeps_whole_pages_only": "core",
    "empty_item_on_fast_path": "core",
    "publish_reserved_pages": "core",
    "resident_in_either_tier": "tiers",
    "fast_path_forgets_restore_pages": "tiers",
    "backup_counts_all_pages": "tiers",
    "demote_ignores_reserved_rows": "tiers",
    "submit_checks_handles_lazily": "tiers",
    "restore_host_pages_sorted": "tiers",
    "drop_refuses_pending_restore": "ordering",
    "restart_reports_drained": "restart",
}
