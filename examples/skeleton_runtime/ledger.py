"""The bookkeeping: every record the runtime keeps, as plain data.

Everything control's calls can change lives in one `Ledger`, and nothing else does: the
KV bytes live in `memory.Memory` and the copies in flight in `copier.Copier`. That split
is what makes each call atomic (`runtime.SkeletonRuntime` works on a copy of the ledger
and keeps it only when the call succeeds) and what keeps the worker threads away from
the bookkeeping: a worker only moves bytes; the ledger learns that a transfer completed
when the caller's thread completes it (poll, wait, compute's wait, restart).

The records follow `spec/glossary.md`'s concepts; their layout is this runtime's own.
"""

from __future__ import annotations

import copy
from collections import Counter, deque
from dataclasses import dataclass, field

from cacheruntime.protocol import BatchPlan, BatchState, CopyState, RuntimeInfo, Tier, TransferKind, TransferTicket

#: Where each counter of an epoch starts. Page names, batches and transfers start at 0
#: (spec §1 for page names). The spec fixes no start for extent generations; the
#: conformance suite compares them with the reference model's, which starts at 1.
FIRST_PAGE = FIRST_BATCH = FIRST_TRANSFER = 0
FIRST_EXTENT = 1

#: The tier a transfer reads and the tier it writes.
DIRECTION = {TransferKind.BACKUP: (Tier.L1, Tier.L2), TransferKind.RESTORE: (Tier.L2, Tier.L1)}


@dataclass
class Slot:
    """A request slot and its row (the ReqToToken row: page names in token order)."""

    generation: int = 0
    live: bool = False
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0  # written by executed batches
    reserved_tokens: int = 0  # including batches prepared and not yet executed
    produced: int = 0  # outputs the request's items produce (prepared or executed)
    appended: int = 0  # of those, how many an append_previous_output item consumed


@dataclass
class Copy:
    """One tier's copy of a page name: the physical page it occupies and whether it is readable."""

    phys: int
    state: CopyState


@dataclass
class Page:
    """A page name: its holders, the tags last written to its positions, its copies per tier."""

    holders: int
    versions: list[int]
    copies: dict[Tier, Copy]


@dataclass
class Pool:
    """One tier's physical pages: taken from the front of the free list, freed to its back."""

    total: int
    free: deque[int]
    deferred: list[int] = field(default_factory=list)  # freed while a transfer still touches them


@dataclass
class Extent:
    """An immutable run of full pages, shared by references."""

    pages: tuple[int, ...]
    refcount: int


@dataclass
class Batch:
    """A prepared plan and what cancelling it must undo, per item in plan order."""

    plan: BatchPlan
    state: BatchState
    slots: tuple[int, ...]
    starts: tuple[int, ...]  # first row position the item writes
    ends: tuple[int, ...]  # row length once the batch executes
    start_tokens: tuple[int, ...]  # reserved length before the batch
    start_pages: tuple[int, ...]  # row length in pages before the batch

    def __deepcopy__(self, memo: dict) -> Batch:
        """Only `state` ever changes; the plan and the tuples are immutable, so a draft shares them."""
        return copy.copy(self)


@dataclass(frozen=True)
class Transfer:
    """A backup or restore in flight: (page name, source phys, destination phys) per page moved."""

    ticket: TransferTicket
    moves: tuple[tuple[int, int, int], ...]
    waits_for: frozenset[int]  # transfers writing the copies this one reads

    def __deepcopy__(self, memo: dict) -> Transfer:
        """Immutable: a draft shares it."""
        return self


@dataclass
class Ledger:
    """All the runtime's bookkeeping for one epoch, plus the version-tag counter, which never restarts."""

    runtime_id: str
    page_size: int
    max_request_tokens: int
    has_l2: bool
    epoch: int
    slots: list[Slot]
    pools: dict[Tier, Pool]
    next_version: int = 1
    pages: dict[int, Page] = field(default_factory=dict)
    extents: dict[int, Extent] = field(default_factory=dict)
    batches: dict[int, Batch] = field(default_factory=dict)
    transfers: dict[int, Transfer] = field(default_factory=dict)
    unreported: list[TransferTicket] = field(default_factory=list)
    next_page: int = FIRST_PAGE
    next_extent: int = FIRST_EXTENT
    next_batch: int = FIRST_BATCH
    next_transfer: int = FIRST_TRANSFER
    calls: Counter[str] = field(default_factory=Counter)


def new_epoch(info: RuntimeInfo, generations: list[int], next_version: int) -> Ledger:
    """The bookkeeping of epoch `info.epoch` at its start: no request live, every physical page free, in order."""
    return Ledger(
        runtime_id=info.runtime_id,
        page_size=info.page_size,
        max_request_tokens=info.max_request_tokens,
        has_l2=info.l2_pages > 0,
        epoch=info.epoch,
        slots=[Slot(generation) for generation in generations],
        pools={tier: Pool(total, deque(range(total))) for tier, total in ((Tier.L1, info.l1_pages), (Tier.L2, info.l2_pages))},
        next_version=next_version,
    )
