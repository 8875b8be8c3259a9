"""Handle checks (spec §3): every handle control sends is judged before anything else.

The order is the contract's, and the first check that fails is the error raised:
runtime id, then epoch, then what the handle names (slot generation, extent
generation and page runs, batch id). Each check returns the record the handle names,
so an operation never looks a record up without having checked the handle first.
"""

from __future__ import annotations

from cacheruntime.protocol import (
    Backup,
    BatchPlan,
    CacheExtentRef,
    Close,
    Demote,
    Drop,
    ForeignRuntime,
    InvalidPlan,
    NoL2,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
    StaleHandle,
    UnknownHandle,
)

from .ledger import FIRST_EXTENT, Batch, Extent, Ledger, Slot
from .pages import runs_of

TIER_INTENTS = (Backup, Restore, Demote, Drop)


def check_origin(ledger: Ledger, handle: RequestRuntimeHandle | CacheExtentRef | PreparedBatchHandle) -> None:
    """Runtime id, then epoch: an older epoch is stale (a restart happened), a newer one was never issued."""
    if handle.runtime_id != ledger.runtime_id:
        raise ForeignRuntime(f"{type(handle).__name__} of runtime {handle.runtime_id!r} sent to {ledger.runtime_id!r}")
    if handle.epoch < ledger.epoch:
        raise StaleHandle(f"{type(handle).__name__} of epoch {handle.epoch}; the runtime restarted into epoch {ledger.epoch}")
    if handle.epoch > ledger.epoch:
        raise UnknownHandle(f"{type(handle).__name__} of epoch {handle.epoch}, which has not begun")


def check_request(ledger: Ledger, request: RequestRuntimeHandle) -> Slot:
    """The live slot a request handle names: a lower generation is stale, a higher one never issued."""
    check_origin(ledger, request)
    if not 0 <= request.slot_id < len(ledger.slots):
        raise UnknownHandle(f"no slot {request.slot_id}")
    slot = ledger.slots[request.slot_id]
    if request.generation < slot.generation:
        raise StaleHandle(f"slot {request.slot_id} moved on to generation {slot.generation} (handle has {request.generation})")
    if request.generation > slot.generation or not slot.live:
        raise UnknownHandle(f"slot {request.slot_id} generation {request.generation} was never opened")
    return slot


def check_extent(ledger: Ledger, ref: CacheExtentRef) -> Extent:
    """The live extent a ref names: ended ones (released or split) are stale, others unknown."""
    check_origin(ledger, ref)
    extent = ledger.extents.get(ref.generation)
    if extent is None:
        if FIRST_EXTENT <= ref.generation < ledger.next_extent:
            raise StaleHandle(f"extent {ref.generation} ended (released or split)")
        raise UnknownHandle(f"extent {ref.generation} was never issued")
    if ref.page_runs != runs_of(extent.pages):
        raise UnknownHandle(f"extent {ref.generation} does not cover {ref.page_runs}")
    return extent


def check_batch(ledger: Ledger, handle: PreparedBatchHandle) -> Batch:
    """The batch a handle names, in whatever state it is."""
    check_origin(ledger, handle)
    batch = ledger.batches.get(handle.batch_id)
    if batch is None:
        raise UnknownHandle(f"batch {handle.batch_id} was never prepared in epoch {ledger.epoch}")
    return batch


def check_intent(ledger: Ledger, intent: object) -> None:
    """The handle an intent carries, then, for a tier move, NoL2 on a runtime without a host tier."""
    if isinstance(intent, (Publish, Close)):
        check_request(ledger, intent.request)
    elif isinstance(intent, (*TIER_INTENTS, Release)):
        check_extent(ledger, intent.extent)
        if isinstance(intent, TIER_INTENTS) and not ledger.has_l2:
            raise NoL2(f"{type(intent).__name__} needs a host tier; this runtime has none")
    else:
        raise InvalidPlan(f"{intent!r} is not an intent")


def check_plan(ledger: Ledger, plan: BatchPlan) -> list[Slot]:
    """A plan's shape (control may send anything) and every handle in it, in plan order; the slots of its items."""
    if not isinstance(plan, BatchPlan) or not plan.items:
        raise InvalidPlan("a plan needs at least one item")
    slots = []
    for item in plan.items:
        slots.append(check_request(ledger, item.request))
        for ref in item.attach:
            check_extent(ledger, ref)
    for intent in plan.intents:
        check_intent(ledger, intent)
    if len({item.request.slot_id for item in plan.items}) != len(plan.items):
        raise InvalidPlan("a request appears twice in the plan")
    return slots
