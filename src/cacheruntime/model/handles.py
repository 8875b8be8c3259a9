"""Handle checks, in the order of spec/protocol.md §3: ForeignRuntime, then StaleHandle
(epoch, generation), then UnknownHandle.

Every operation runs these before its own preconditions, so a bad handle is reported
the same way whatever it is passed to. Each check is a method of its own, so that a
mutant breaks exactly one.
"""

from __future__ import annotations

from cacheruntime.model.records import Extent, Slot, State
from cacheruntime.protocol import (
    FINISHED_BATCHES_KEPT,
    Backup,
    BatchState,
    CacheExtentRef,
    Close,
    Demote,
    Drop,
    Fetch,
    ForeignRuntime,
    HostMode,
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


class HandleChecks:
    """The section that turns a handle into the record it names, or raises."""

    state: State
    runtime_id: str
    l2_pages: int
    host_mode: HostMode
    l3: bool

    @property
    def has_l2(self) -> bool:
        """Whether host pages are a tier (the L2 capability): a host pool, in resident mode."""
        return bool(self.l2_pages) and self.host_mode is HostMode.RESIDENT

    def check_origin(self, what: str, runtime_id: str, epoch: int) -> None:
        """The handle is this runtime's and of the current epoch."""
        if runtime_id != self.runtime_id:
            raise ForeignRuntime(f"{what} belongs to runtime {runtime_id!r}, not {self.runtime_id!r}")
        if epoch < self.state.epoch:
            raise StaleHandle(f"{what} is from epoch {epoch}; the runtime restarted into epoch {self.state.epoch}")
        if epoch > self.state.epoch:
            raise UnknownHandle(f"{what} names epoch {epoch}, which has not begun")

    def check_generation(self, request: RequestRuntimeHandle, slot: Slot) -> None:
        """The request handle names the slot's current, live generation (H1, H3)."""
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

    def check_extent(self, extent: CacheExtentRef) -> Extent:
        """The live extent a ref names; released or split refs are stale, and the runs must be the issued ones."""
        if not isinstance(extent, CacheExtentRef):
            raise UnknownHandle(f"expected a CacheExtentRef, got {type(extent).__name__}")
        self.check_origin("extent ref", extent.runtime_id, extent.epoch)
        record = self.state.extents.get(extent.generation)
        if record is None:
            if 0 < extent.generation < self.state.next_extent:
                raise StaleHandle(f"extent {extent.generation} was released or split")
            raise UnknownHandle(f"extent {extent.generation} was never published")
        if record.runs != tuple(extent.page_runs):
            raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")
        return record

    def check_batch(self, batch: PreparedBatchHandle) -> BatchState:
        """The state of the batch a handle names: prepared, or finished as executed or cancelled."""
        if not isinstance(batch, PreparedBatchHandle):
            raise UnknownHandle(f"expected a PreparedBatchHandle, got {type(batch).__name__}")
        self.check_origin("batch handle", batch.runtime_id, batch.epoch)
        if batch.batch_id in self.state.batches:
            return BatchState.PREPARED
        finished = self.state.finished.get(batch.batch_id)
        if finished is None:
            if 0 <= batch.batch_id < self.state.next_batch:
                raise StaleHandle(f"batch {batch.batch_id} finished longer ago than the last {FINISHED_BATCHES_KEPT} batches; its outcome is forgotten")
            raise UnknownHandle(f"batch {batch.batch_id} was never prepared")
        return finished[0]

    def check_intent_handles(self, intent: Intent) -> None:
        """The handles an intent names; tier intents also need an L2 tier, L3 intents an L3."""
        if isinstance(intent, (Publish, Close)):
            self.check_slot(intent.request)
        elif isinstance(intent, (Backup, Restore, Demote, Drop, Release)):
            self.check_extent(intent.extent)
            if not isinstance(intent, Release) and not self.has_l2:
                raise NoL2("this runtime has no L2 tier" + (" (its host pages are staging only: buffer_only)" if self.l2_pages else ""))
        elif isinstance(intent, (Persist, Fetch)):
            if isinstance(intent, Persist):
                self.check_extent(intent.extent)
            else:
                self.check_slot(intent.request)
            if not self.l3:
                raise NoL3("this runtime has no L3 store")
        else:
            raise InvalidPlan(f"unknown intent {type(intent).__name__}")
