"""INTROSPECTION: the ledger and memory seen as the contract's `AbstractState` (test-only).

Control never calls this; the conformance suite does, after every call, to judge the
invariants (R1-R4, O1-O3, D1, H1-H3) on it and to compare it with the reference model.
It reads, never changes, and it completes nothing: a transfer whose bytes have landed
stays listed until a call completes it in the ledger.
"""

from __future__ import annotations

from cacheruntime.protocol import (
    AbstractState,
    BatchState,
    BatchView,
    CopyState,
    ExtentView,
    PageView,
    PoolView,
    SlotView,
    Tier,
    TransferView,
)

from .ledger import Ledger, Page
from .memory import Memory


def _copy(memory: Memory, page: Page, tier: Tier) -> tuple[CopyState, tuple[int, ...]]:
    copy = page.copies.get(tier)
    return (CopyState.ABSENT, ()) if copy is None else (copy.state, memory.read(tier, copy.phys))


def probe(ledger: Ledger, memory: Memory) -> AbstractState:
    """The abstract state: slots, page names, pools, extents, batches, transfers and boundary calls."""
    ps = ledger.page_size
    pages = []
    for name, page in sorted(ledger.pages.items()):
        (l1, l1_tags), (l2, l2_tags) = _copy(memory, page, Tier.L1), _copy(memory, page, Tier.L2)
        pages.append(PageView(name, page.holders, l1, l2, tuple(page.versions), l1_tags, l2_tags))
    pools = tuple(
        PoolView(
            tier,
            pool.total,
            tuple(pool.free),
            tuple(sorted((page.copies[tier].phys, name) for name, page in ledger.pages.items() if tier in page.copies)),
            tuple(pool.deferred),
        )
        for tier, pool in ledger.pools.items()
    )
    batches = []
    for batch_id, batch in sorted(ledger.batches.items()):
        held: tuple[int, ...] = ()
        if batch.state is BatchState.PREPARED:
            rows = zip(batch.slots, batch.start_pages, batch.ends)
            held = tuple(name for slot_id, first, end in rows for name in ledger.slots[slot_id].pages[first : -(-end // ps)])
        # Slots sorted, not in plan order: protocol.py leaves the order open; the suite compares the model's.
        batches.append(BatchView(batch_id, batch.state, tuple(sorted(batch.slots)), held))
    return AbstractState(
        epoch=ledger.epoch,
        page_size=ps,
        slots=tuple(SlotView(i, s.generation, s.live, tuple(s.pages), s.num_tokens, s.reserved_tokens) for i, s in enumerate(ledger.slots)),
        pages=tuple(pages),
        pools=pools,
        extents=tuple(ExtentView(generation, extent.pages, extent.refcount) for generation, extent in sorted(ledger.extents.items())),
        batches=tuple(batches),
        transfers=tuple(
            TransferView(
                transfer_id,
                transfer.ticket.kind,
                tuple(name for name, _, _ in transfer.moves),
                tuple(src for _, src, _ in transfer.moves),
                tuple(dst for _, _, dst in transfer.moves),
            )
            for transfer_id, transfer in sorted(ledger.transfers.items())
        ),
        boundary_calls=tuple(sorted(ledger.calls.items())),
    )
