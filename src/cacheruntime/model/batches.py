"""Two-phase batches: prepare (validate, allocate, map, start restores), execute, cancel.

Prepare reserves every row's new length and its pages, so that execute cannot fail for
want of pages; execute waits for the restores its rows read (O1), writes a new version
tag per token computed and reads the row back as the item's token (`tag_digest`), then
applies the plan's intents. Executed and cancelled batches leave only their outcome
(`State.finished`).
"""

from __future__ import annotations

from cacheruntime.model.arguments import check_plan_fields
from cacheruntime.model.extents import Extents
from cacheruntime.model.records import Batch
from cacheruntime.protocol import (
    FINISHED_BATCHES_KEPT,
    AlreadyExecuted,
    BatchCompletion,
    BatchDependency,
    BatchPlan,
    BatchState,
    CacheExtentRef,
    FaultKind,
    Fetch,
    InvalidPlan,
    ItemResult,
    NotPrepared,
    NotResident,
    OutOfOrder,
    PreparedBatchHandle,
    RequestBusy,
    Restore,
    RowFull,
    Tier,
    TransferTicket,
    tag_digest,
)


class ComputeCannotRun(Exception):
    """Inside `execute`: the batch's compute fails (a restore it reads failed, or an injected
    fault); `execute_batch` turns it into the failed batch and `ComputeFailed`. Not a
    `CacheRuntimeError`: it never crosses the boundary."""

    def __init__(self, what: str, injected: bool = False):
        self.injected = injected
        super().__init__(what)


class Batches(Extents):
    """The section that prepares, executes and cancels batches."""

    max_request_tokens: int
    vocab_size: int

    def prepare(self, plan: BatchPlan) -> PreparedBatchHandle:
        """PrepareBatch: validate the plan, allocate pages, map prefixes, start restores."""
        st = self.state
        if not isinstance(plan, BatchPlan):
            raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
        check_plan_fields(plan, self.vocab_size)
        if not plan.items:
            raise InvalidPlan("a plan needs at least one item")
        for item in plan.items:
            self.check_slot(item.request)
            for extent in item.attach:
                self.check_extent(extent)
        for intent in plan.intents:
            self.check_intent_handles(intent)
        slots = [item.request.slot_id for item in plan.items]
        if len(set(slots)) != len(slots):
            raise InvalidPlan("a request appears twice in the plan")
        fetches: dict[int, tuple[str, ...]] = {}
        for intent in plan.intents:
            if isinstance(intent, Fetch):
                if intent.request.slot_id not in slots:
                    raise InvalidPlan(f"Fetch into slot {intent.request.slot_id}, which has no item in the plan: a fetch fills the row of an item")
                if intent.request.slot_id in fetches:
                    raise InvalidPlan(f"two Fetch intents for slot {intent.request.slot_id}: name every key in one")
                fetches[intent.request.slot_id] = tuple(intent.keys)
        batch_id = st.next_batch
        start_tokens: list[int] = []
        start_pages: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        restoring: set[int] = set()
        moving: set[int] = set()
        for intent in plan.intents:
            if isinstance(intent, Restore):
                moving.update(self.restore_pages(intent.extent))
                restoring.update(st.extents[intent.extent.generation].pages)
        for item in plan.items:
            slot = st.slots[item.request.slot_id]
            if item.new_tokens < 1:
                raise InvalidPlan(f"slot {item.request.slot_id}: an item must compute at least one token")
            fetched = len(fetches.get(item.request.slot_id, ()))
            if (item.attach or fetched) and slot.reserved_tokens:
                raise InvalidPlan(f"slot {item.request.slot_id}: attach and fetch are only allowed on an empty row")
            if item.append_previous_output and slot.produced <= slot.appended:
                raise RequestBusy(f"slot {item.request.slot_id}: no previous output to append")
            attached = [p for extent in item.attach for p in st.extents[extent.generation].pages]
            for page in attached:
                if not self.has_copy(page, Tier.L1) and page not in restoring:
                    raise NotResident(f"page {page} of an attached extent has no device copy and no restore")
            end = slot.reserved_tokens + (len(attached) + fetched) * self.page_size + item.new_tokens
            if end > self.max_request_tokens:
                raise RowFull(f"slot {item.request.slot_id}: {end} tokens > max_request_tokens {self.max_request_tokens}")
            start_tokens.append(slot.reserved_tokens)
            start_pages.append(len(slot.pages))
            starts.append(end - item.new_tokens)
            ends.append(end)
        need = sum(-(-end // self.page_size) - held - sum(e.page_count for e in item.attach) for end, held, item in zip(ends, start_pages, plan.items))
        need += len(moving)
        self.require_free(Tier.L1, need)
        self.require_free(Tier.L2, sum(len(keys) for keys in fetches.values()))  # a staging page per fetched page
        for intent in plan.intents:
            if isinstance(intent, Restore):
                self.start_restore(intent.extent)
        for item, end in zip(plan.items, ends):
            slot = st.slots[item.request.slot_id]
            for extent in item.attach:
                for page in st.extents[extent.generation].pages:
                    st.pages[page].holders += 1
                    slot.pages.append(page)
            if item.request.slot_id in fetches:
                slot.pages += self.fetch_into_row(fetches[item.request.slot_id])
            slot.pages += self.new_pages(-(-end // self.page_size) - len(slot.pages))
            slot.reserved_tokens = end
            slot.produced += 1
            slot.appended += int(item.append_previous_output)
        st.batches[batch_id] = Batch(
            plan=plan,
            state=BatchState.PREPARED,
            slots=tuple(slots),
            slot_set=frozenset(slots),
            starts=tuple(starts),
            ends=tuple(ends),
            start_tokens=tuple(start_tokens),
            requests=tuple(item.request for item in plan.items),
            one_token=all(item.new_tokens == 1 for item in plan.items),
        )
        st.next_batch += 1
        return PreparedBatchHandle(self.runtime_id, st.epoch, batch_id)

    def check_execute_order(self, batch_id: int, record: Batch) -> None:
        """OutOfOrder while an earlier prepared batch shares a request (O4)."""
        for other_id, other in self.state.batches.items():
            if other_id < batch_id and record.slot_set & other.slot_set:
                raise OutOfOrder(f"batch {other_id} shares a request with batch {batch_id} and has not executed")

    def check_cancel_order(self, batch_id: int, record: Batch) -> None:
        """BatchDependency while a later prepared batch shares a request."""
        for other_id, other in self.state.batches.items():
            if other_id > batch_id and record.slot_set & other.slot_set:
                raise BatchDependency(f"batch {other_id} shares a request with batch {batch_id}")

    def finish_batch(self, batch_id: int, state: BatchState) -> None:
        """The batch is executed, cancelled or failed: only its state and sorted slots are kept,
        for the last `FINISHED_BATCHES_KEPT` batches to finish (the oldest outcome is forgotten)."""
        record = self.state.batches.pop(batch_id)
        finished = self.state.finished
        finished[batch_id] = (state, tuple(sorted(record.slot_set)))
        if len(finished) > FINISHED_BATCHES_KEPT:
            del finished[next(iter(finished))]

    def execute(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """ExecuteBatch: wait for the restores compute reads, compute, then apply the intents."""
        st = self.state
        state = self.check_batch(batch)
        if state is BatchState.EXECUTED:
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed already")
        if state is BatchState.CANCELLED or state is BatchState.FAILED:
            raise NotPrepared(f"batch {batch.batch_id} was {state}")
        record = st.batches[batch.batch_id]
        self.check_execute_order(batch.batch_id, record)
        results = []
        lost: list[int] = []
        for slot_id, end in zip(record.slots, record.ends):
            read_pages = st.slots[slot_id].pages[: -(-end // self.page_size)]
            self.await_restores(read_pages)  # O1: compute waits for KV_READY
            lost += [p for p in read_pages if not self.has_copy(p, Tier.L1)]
        # The intents are preconditions: they are checked (below, against the state compute
        # would leave) before a failed read or an injected fault fails the batch.
        injected = not lost and self.count_toward_fault(FaultKind.COMPUTE, None)
        for slot_id, start, end, request in zip(record.slots, record.starts, record.ends, record.requests):
            slot = st.slots[slot_id]
            l1 = st.pools[Tier.L1].tags
            for position in range(start, end):
                page = st.pages[slot.pages[position // self.page_size]]
                page.versions[position % self.page_size] = st.next_version
                l1[page.copies[Tier.L1].phys][position % self.page_size] = st.next_version
                st.next_version += 1
            slot.num_tokens = end  # the intents are checked against the rows compute would leave
            if lost:  # compute will not run: nothing to read (the batch fails below, all undone)
                continue
            read = tuple(l1[st.pages[slot.pages[pos // self.page_size]].copies[Tier.L1].phys][pos % self.page_size] for pos in range(end))
            slot.last_output = tag_digest(read)
            results.append(ItemResult(request, end, slot.last_output))
        self.finish_batch(batch.batch_id, BatchState.EXECUTED)
        published: list[CacheExtentRef] = []
        tickets: list[TransferTicket] = []
        for intent in record.plan.intents:
            if isinstance(intent, (Restore, Fetch)):
                continue
            outcome = self.apply_intent(intent)
            if isinstance(outcome, CacheExtentRef):
                published.append(outcome)
            elif isinstance(outcome, TransferTicket):
                tickets.append(outcome)
        if lost:
            raise ComputeCannotRun(f"pages {sorted(set(lost))} have no device copy: the restore or fetch that would fill them failed")
        if injected:
            raise ComputeCannotRun("injected compute fault (FaultKind.COMPUTE)", injected=True)
        return BatchCompletion(batch, tuple(results), tuple(published), tuple(tickets))

    def cancel(self, batch: PreparedBatchHandle) -> None:
        """CancelBatch: undo the batch's allocations and mappings; started restores go on."""
        st = self.state
        state = self.check_batch(batch)
        if state is BatchState.EXECUTED:
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed; it cannot be cancelled")
        if state is BatchState.CANCELLED or state is BatchState.FAILED:
            raise NotPrepared(f"batch {batch.batch_id} was {state} already")
        record = st.batches[batch.batch_id]
        self.check_cancel_order(batch.batch_id, record)
        self.unreserve(record)
        self.finish_batch(batch.batch_id, BatchState.CANCELLED)

    def unreserve(self, record: Batch) -> None:
        """Undo a prepared batch's reservations and mappings (cancel, and a failed batch)."""
        st = self.state
        for slot_id, reserved, item in zip(record.slots, record.start_tokens, record.plan.items):
            slot = st.slots[slot_id]
            keep = -(-reserved // self.page_size)  # the pages the row held: those its reservation covered
            for page in slot.pages[keep:]:
                self.drop_holder(page)
            del slot.pages[keep:]
            slot.reserved_tokens = reserved
            slot.produced -= 1
            slot.appended -= int(item.append_previous_output)

    def fail_batches(self, batch_id: int) -> tuple[int, ...]:
        """The prepared batch's compute failed: it and every later prepared batch sharing a request
        with it (transitively) fail; returns their ids, ascending.

        The restores the batch's compute waited for (O1) completed, as for an executed batch;
        nothing the batch would have written is visible (no tag, no row length, no intent);
        each failed batch's reservations are undone as a cancel does, newest first.
        """
        st = self.state
        record = st.batches[batch_id]
        for slot_id, end in zip(record.slots, record.ends):
            self.await_restores(st.slots[slot_id].pages[: -(-end // self.page_size)])
        failed, slots = [batch_id], set(record.slot_set)
        for other_id in sorted(st.batches):
            if other_id > batch_id and not slots.isdisjoint(st.batches[other_id].slot_set):
                failed.append(other_id)
                slots |= st.batches[other_id].slot_set
        for other_id in reversed(failed):
            self.unreserve(st.batches[other_id])
            self.finish_batch(other_id, BatchState.FAILED)
        return tuple(failed)
