"""Handle checks: ForeignRuntime, then StaleHandle (epoch, generation), then UnknownHandle (H1).

Every handle control passes in is checked here before a call changes anything, in the
reference model's order. Each guard is one public method, so that a mutant can weaken
exactly one of them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from cacheruntime.protocol import (
    FINISHED_BATCHES_KEPT,
    Backup,
    BatchItem,
    CacheExtentRef,
    Close,
    Demote,
    Drop,
    Fetch,
    ForeignRuntime,
    Intent,
    InvalidPlan,
    NoL2,
    NoL3,
    Persist,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
    StaleHandle,
    UnknownHandle,
)
from cacheruntime.runtime.ledger.arguments import extent_fields
from cacheruntime.runtime.ledger.records import Batch, Extent, Slot

if TYPE_CHECKING:
    from cacheruntime.runtime.ledger.ledger import LedgerBase

    _Base = LedgerBase
else:
    _Base = object


class HandleChecks(_Base):
    """The H1 guards, in the model's order, over `self.state`."""

    def check_origin(self, what: str, runtime_id: str, epoch: int) -> None:
        """ForeignRuntime for another runtime's handle; StaleHandle or UnknownHandle for another epoch."""
        if runtime_id != self.runtime_id:
            raise ForeignRuntime(f"{what} belongs to runtime {runtime_id!r}, not {self.runtime_id!r}")
        if epoch < self.state.epoch:
            raise StaleHandle(f"{what} is from epoch {epoch}; the runtime restarted into epoch {self.state.epoch}")
        if epoch > self.state.epoch:
            raise UnknownHandle(f"{what} names epoch {epoch}, which has not begun")

    def check_generation(self, request: RequestRuntimeHandle, slot: Slot) -> None:
        """A request handle's generation against its slot's (H1, H3)."""
        if request.generation < slot.generation:
            raise StaleHandle(f"slot {request.slot_id} is at generation {slot.generation}, the handle has {request.generation}")
        if request.generation > slot.generation or not slot.live:
            raise UnknownHandle(f"slot {request.slot_id} generation {request.generation} was never opened")

    def check_slot(self, request: RequestRuntimeHandle) -> Slot:
        """The live slot a request handle names."""
        if not isinstance(request, RequestRuntimeHandle):
            raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
        self.check_origin("request handle", request.runtime_id, request.epoch)
        if not 0 <= request.slot_id < len(self.state.slots):
            raise UnknownHandle(f"slot {request.slot_id} does not exist")
        slot = self.state.slots[request.slot_id]
        self.check_generation(request, slot)
        return slot

    def check_item_handles(self, items: tuple[BatchItem, ...]) -> tuple[list[int], list[Slot], bool]:
        """`check_slot` every item's request (and `check_extent` its attached refs), in plan order.

        Returns the slot ids, their records, and whether any item attaches or appends. The
        same guards as `check_slot`, with two savings: `check_origin` depends only on the
        handle's runtime id and epoch, which no check changes, so it runs again only when a
        handle names another pair than the one it last accepted; and `check_generation` runs
        only for a handle whose generation is not its live slot's current one (the only
        handles it can refuse).
        """
        check_origin, check_generation, check_extent = self.check_origin, self.check_generation, self.check_extent
        all_slots = self.state.slots
        count = len(all_slots)
        accepted_id: Any = None
        accepted_epoch: Any = None
        slots, rows = [], []
        special = False
        for item in items:
            request = item.request
            if type(request) is not RequestRuntimeHandle and not isinstance(request, RequestRuntimeHandle):
                raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
            runtime_id, epoch, slot_id = request.runtime_id, request.epoch, request.slot_id
            if epoch != accepted_epoch or runtime_id != accepted_id or accepted_id is None:
                check_origin("request handle", runtime_id, epoch)
                accepted_id, accepted_epoch = runtime_id, epoch
            if not 0 <= slot_id < count:
                raise UnknownHandle(f"slot {slot_id} does not exist")
            slot = all_slots[slot_id]
            if request.generation != slot.generation or not slot.live:
                check_generation(request, slot)
            if item.attach:
                special = True
                for extent in item.attach:
                    check_extent(extent)
            elif item.append_previous_output:
                special = True
            slots.append(slot_id)
            rows.append(slot)
        return slots, rows, special

    def check_extent_issued(self, extent: CacheExtentRef, record: Extent | None) -> None:
        """Released and split refs are stale, never-issued ones unknown; the runs must be the issued ones (H1, R4)."""
        if record is None:
            if self.numbering.issued_extent(extent.generation, self.state.next_extent):
                raise StaleHandle(f"extent {extent.generation} was released or split")
            raise UnknownHandle(f"extent {extent.generation} was never published")
        if record.runs != extent.page_runs and record.runs != tuple(extent.page_runs):
            raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")

    def check_extent(self, extent: CacheExtentRef) -> Extent:
        """The live extent a ref names."""
        if not isinstance(extent, CacheExtentRef):
            raise UnknownHandle(f"expected a CacheExtentRef, got {type(extent).__name__}")
        self.check_origin("extent ref", extent.runtime_id, extent.epoch)
        record = self.state.extents.get(extent.generation)
        self.check_extent_issued(extent, record)
        assert record is not None
        return record

    def check_batch(self, batch: PreparedBatchHandle) -> Batch | tuple[Any, tuple[int, ...]]:
        """The prepared batch's record, or a finished batch's `(state, slots)` outcome."""
        if not isinstance(batch, PreparedBatchHandle):
            raise UnknownHandle(f"expected a PreparedBatchHandle, got {type(batch).__name__}")
        self.check_origin("batch handle", batch.runtime_id, batch.epoch)
        st = self.state
        record = st.batches.get(batch.batch_id)
        if record is not None:
            return record
        finished = st.finished.get(batch.batch_id)
        if finished is None:
            if self.numbering.issued_batch(batch.batch_id, st.next_batch):
                raise StaleHandle(f"batch {batch.batch_id} finished longer ago than the last {FINISHED_BATCHES_KEPT} batches; its outcome is forgotten")
            raise UnknownHandle(f"batch {batch.batch_id} was never prepared")
        return finished

    def check_intent_handles(self, intent: Intent) -> None:
        """The handles an intent names; NoL2 for a tier intent on a runtime without L2."""
        if isinstance(intent, (Publish, Close)):
            self.check_slot(intent.request)
        elif isinstance(intent, (Backup, Restore, Demote, Drop, Release)):
            extent_fields(intent.extent)
            self.check_extent(intent.extent)
            if not isinstance(intent, Release) and not self.has_l2:
                raise NoL2("this runtime has no L2 tier" + (" (its host pages are staging only: buffer_only)" if self.l2_pages else ""))
        elif isinstance(intent, (Persist, Fetch)):
            if isinstance(intent, Persist):
                self.check_extent(intent.extent)
            else:
                self.check_slot(intent.request)
            if not self.l3:
                raise NoL3("this runtime has no L3 store: give LocalGPURuntime an l3 store")
        else:
            raise InvalidPlan(f"unknown intent {type(intent).__name__}")

    def close_slot(self, slot: Slot) -> None:
        """A closing slot stops being live and its generation grows, so every old handle is stale (H2)."""
        self.txn.undo(functools.partial(_reopen, slot, slot.live, slot.generation))
        slot.live = False
        slot.generation += 1
        self.slot_changes += 1


def _reopen(slot: Slot, live: bool, generation: int) -> None:
    slot.live, slot.generation = live, generation
