"""Two-phase batches (spec §4.4-4.6): prepare stages a plan, execute computes it, cancel undoes it.

`prepare` checks everything first and changes nothing until every check has passed:
it starts the plan's restores early (their H2D overlaps the batch before), maps attached
extents to the front of their rows and names the new pages, in plan order. `execute`
waits for the restores its rows read (KV_READY), writes the tokens' version tags and
then applies the recorded intents against the state after compute. What compute
*writes into memory* and what it *reads back* as each item's token happen only once the
call commits (`runtime.SkeletonRuntime.execute_batch`), so a failed execute leaves
even the KV bytes untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from cacheruntime.protocol import (
    AlreadyExecuted,
    Backup,
    BatchCompletion,
    BatchDependency,
    BatchPlan,
    BatchState,
    Close,
    Demote,
    Drop,
    InvalidPlan,
    ItemResult,
    NotPrepared,
    NotResident,
    OutOfOrder,
    OutOfPages,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestBusy,
    Restore,
    RowFull,
    Tier,
    TransferKind,
)

from . import extents, requests, tiers
from .compute import Work
from .handles import check_batch, check_plan
from .ledger import Batch, Ledger
from .pages import drop_holder, new_pages
from .transfers import complete_with_predecessors


def prepare(ledger: Ledger, plan: BatchPlan) -> PreparedBatchHandle:
    """Validate the plan in the contract's order, then start its restores and reserve its rows."""
    slots = check_plan(ledger, plan)
    ps = ledger.page_size
    restores = [intent for intent in plan.intents if isinstance(intent, Restore)]
    restored: dict[int, None] = {}  # page names this plan gives a device copy, in order
    kept: set[int] = set()  # page names whose dropping device copy this plan's restore keeps (nothing moves)
    for intent in restores:
        pages = ledger.extents[intent.extent.generation].pages
        tiers.require_host_copies(ledger, pages, intent.extent.generation)
        restored.update(dict.fromkeys(tiers.lacking(ledger, pages, Tier.L1)))
        kept.update(pages)
    shapes, needed = [], len(restored)
    for item, slot in zip(plan.items, slots):
        if item.new_tokens < 1:
            raise InvalidPlan(f"the item for slot {item.request.slot_id} computes no token")
        if item.attach and slot.reserved_tokens:
            raise InvalidPlan(f"attach on slot {item.request.slot_id}, whose row already has tokens")
        if item.append_previous_output and slot.produced <= slot.appended:
            raise RequestBusy(f"slot {item.request.slot_id} has no output to append")
        attached = [name for ref in item.attach for name in ledger.extents[ref.generation].pages]
        if any(not tiers.counts(ledger, name, Tier.L1) and name not in restored and name not in kept for name in attached):
            raise NotResident(f"an extent attached to slot {item.request.slot_id} is not on the device; add a Restore")
        start = len(attached) * ps if item.attach else slot.reserved_tokens
        end = start + item.new_tokens
        if end > ledger.max_request_tokens:
            raise RowFull(f"slot {item.request.slot_id} would hold {end} tokens, more than {ledger.max_request_tokens}")
        fresh = -(-end // ps) - len(slot.pages) - len(attached)
        shapes.append((attached, start, end, fresh))
        needed += fresh
    free = len(ledger.pools[Tier.L1].free)
    if needed > free:
        raise OutOfPages(Tier.L1, needed, free)

    for intent in restores:
        tiers.move(ledger, intent)
    starts, ends, start_tokens, start_pages = [], [], [], []
    for item, slot, (attached, start, end, fresh) in zip(plan.items, slots, shapes):
        starts.append(start)
        ends.append(end)
        start_tokens.append(slot.reserved_tokens)
        start_pages.append(len(slot.pages))
        for name in attached:
            ledger.pages[name].holders += 1
        slot.pages += attached + new_pages(ledger, fresh)
        slot.reserved_tokens = end
        slot.produced += 1
        slot.appended += item.append_previous_output
    batch_id = ledger.next_batch
    ledger.next_batch += 1
    ledger.batches[batch_id] = Batch(
        plan, BatchState.PREPARED, tuple(i.request.slot_id for i in plan.items), tuple(starts), tuple(ends), tuple(start_tokens), tuple(start_pages)
    )
    return PreparedBatchHandle(ledger.runtime_id, ledger.epoch, batch_id)


def _check_preparable(ledger: Ledger, handle: PreparedBatchHandle) -> Batch:
    batch = check_batch(ledger, handle)
    if batch.state is BatchState.EXECUTED:
        raise AlreadyExecuted(f"batch {handle.batch_id} has executed")
    if batch.state is BatchState.CANCELLED:
        raise NotPrepared(f"batch {handle.batch_id} was cancelled")
    return batch


def _sharing(ledger: Ledger, batch_id: int, batch: Batch) -> list[int]:
    """Other prepared batches with a request in common."""
    return [
        other_id
        for other_id, other in ledger.batches.items()
        if other_id != batch_id and other.state is BatchState.PREPARED and set(other.slots) & set(batch.slots)
    ]


def execute(ledger: Ledger, handle: PreparedBatchHandle, kv_ready: Callable[[set[int]], None]) -> tuple[BatchCompletion, Work]:
    """Compute in the ledger, then the intents in plan order; the completion's tokens are left to `compute.run`.

    `kv_ready` blocks until the bytes of the given transfers have landed.
    """
    batch = _check_preparable(ledger, handle)
    if any(other_id < handle.batch_id for other_id in _sharing(ledger, handle.batch_id, batch)):
        raise OutOfOrder(f"batch {handle.batch_id} shares a request with an earlier batch that has not executed")
    ps = ledger.page_size
    read = {name for slot_id, end in zip(batch.slots, batch.ends) for name in ledger.slots[slot_id].pages[: -(-end // ps)]}
    restoring = {
        transfer_id
        for transfer_id, transfer in ledger.transfers.items()
        if transfer.ticket.kind is TransferKind.RESTORE and any(name in read for name, _, _ in transfer.moves)
    }
    kv_ready(restoring)
    complete_with_predecessors(ledger, restoring)

    work = Work()
    for slot_id, start, end in zip(batch.slots, batch.starts, batch.ends):
        slot = ledger.slots[slot_id]
        for position in range(start, end):
            page = ledger.pages[slot.pages[position // ps]]
            page.versions[position % ps] = ledger.next_version
            work.writes.append((page.copies[Tier.L1].phys, position % ps, ledger.next_version))
            ledger.next_version += 1
        slot.num_tokens = end
        work.rows.append((tuple(ledger.pages[name].copies[Tier.L1].phys for name in slot.pages[: -(-end // ps)]), end))

    published, tickets = [], []
    for intent in batch.plan.intents:
        if isinstance(intent, Publish):
            published.append(extents.publish(ledger, intent.request, intent.first_page, intent.page_count))
        elif isinstance(intent, (Backup, Demote, Drop)):
            ticket = tiers.move(ledger, intent)
            if ticket is not None:
                tickets.append(ticket)
        elif isinstance(intent, Release):
            extents.release(ledger, intent.extent)
        elif isinstance(intent, Close):
            requests.close_request(ledger, intent.request, executing=handle.batch_id)
    batch.state = BatchState.EXECUTED
    items = tuple(ItemResult(item.request, end, None) for item, end in zip(batch.plan.items, batch.ends))
    return BatchCompletion(handle, items, tuple(published), tuple(tickets)), work


def cancel(ledger: Ledger, handle: PreparedBatchHandle) -> None:
    """Rows back to their length before the batch; its pages lose their holders. Its restores go on."""
    batch = _check_preparable(ledger, handle)
    if any(other_id > handle.batch_id for other_id in _sharing(ledger, handle.batch_id, batch)):
        raise BatchDependency(f"a later prepared batch shares a request with batch {handle.batch_id}; cancel it first")
    for item, slot_id, start_tokens, start_pages in zip(batch.plan.items, batch.slots, batch.start_tokens, batch.start_pages):
        slot = ledger.slots[slot_id]
        dropped = slot.pages[start_pages:]
        del slot.pages[start_pages:]
        slot.reserved_tokens = start_tokens
        slot.produced -= 1
        slot.appended -= item.append_previous_output
        for name in dropped:
            drop_holder(ledger, name)
    batch.state = BatchState.CANCELLED
