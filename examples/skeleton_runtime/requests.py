"""Request slots (spec §4.2-4.3): a slot is live while its request is open, and its
generation grows at every close, so a handle to a closed request is stale at once (H2)."""

from __future__ import annotations

from cacheruntime.protocol import BatchState, OutOfSlots, RequestBusy, RequestRuntimeHandle

from .handles import check_request
from .ledger import Ledger, Slot
from .pages import drop_holder


def open_request(ledger: Ledger) -> RequestRuntimeHandle:
    """The lowest-numbered slot that is not live, with an empty row."""
    slot_id = next((i for i, slot in enumerate(ledger.slots) if not slot.live), None)
    if slot_id is None:
        raise OutOfSlots(f"all {len(ledger.slots)} slots are live")
    generation = ledger.slots[slot_id].generation
    ledger.slots[slot_id] = Slot(generation=generation, live=True)
    return RequestRuntimeHandle(ledger.runtime_id, ledger.epoch, slot_id, generation)


def close_request(ledger: Ledger, request: RequestRuntimeHandle, executing: int | None = None) -> None:
    """Close the slot now; its row's pages lose a holder (freed, or deferred behind a backup: scenario 3).

    `executing` is the batch whose `Close` intent this is: the only prepared batch the
    request may be in.
    """
    check_request(ledger, request)
    busy = [
        batch_id
        for batch_id, batch in ledger.batches.items()
        if batch.state is BatchState.PREPARED and batch_id != executing and request.slot_id in batch.slots
    ]
    if busy:
        raise RequestBusy(f"slot {request.slot_id} is in prepared batch {busy[0]}")
    slot = ledger.slots[request.slot_id]
    ledger.slots[request.slot_id] = Slot(generation=slot.generation + 1)
    for name in slot.pages:
        drop_holder(ledger, name)
