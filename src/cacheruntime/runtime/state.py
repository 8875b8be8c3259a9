"""The runtime's bookkeeping: slots, page names, free lists, extents, batches, transfers.

This is the part of `LocalGPURuntime` that says *what* is where; tensors, streams and
events (the *how*) are kept apart from it, so that a call can run its bookkeeping on a
copy and commit it only when every precondition held (atomicity), and so that nothing
here can ever leak a device object. It mirrors the reference model's state record for
record, because the model's behaviour is the contract.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cacheruntime.protocol import BatchPlan, CopyState, Tier, TransferCompletion, TransferKind, TransferTicket


@dataclass
class Slot:
    """A request slot: its row's page names, lengths, and the outputs made and fed back."""

    generation: int = 0
    live: bool = False
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0
    reserved_tokens: int = 0
    produced: int = 0  # batches prepared for the request (each makes one output)
    appended: int = 0  # of those outputs, how many a later item feeds back
    last_output: int | None = None  # the token the latest executed batch sampled


@dataclass
class Copy:
    """One tier's copy of a page name: its physical page and whether it is readable yet."""

    phys: int
    state: CopyState


@dataclass
class Page:
    """A page name: holders (rows and extents), last-written version tags, its copies."""

    holders: int
    versions: list[int]
    copies: dict[Tier, Copy] = field(default_factory=dict)


@dataclass
class Pool:
    """A physical pool's free list, deferred frees and the tags the runtime believes it holds.

    `believed` is what each physical page should hold after the writes and transfers the
    runtime has issued: it survives frees and restarts, as memory does. A runner that
    claims TAGGED_COMPUTE reports the real bytes instead, which is how D1 catches a race.
    """

    total: int
    free: list[int]
    believed: list[tuple[int, ...]]
    deferred: dict[int, set[int]] = field(default_factory=dict)  # phys -> transfers it waits for

    def clone(self) -> Pool:
        # `believed` holds immutable tuples: a shallow copy of the list is a deep copy.
        return Pool(self.total, list(self.free), list(self.believed), {p: set(t) for p, t in self.deferred.items()})


@dataclass
class Extent:
    """A live extent: its page names in order and its reference count."""

    pages: tuple[int, ...]
    refcount: int


@dataclass
class Batch:
    """A batch handle's record: plan, state, and the row lengths and page counts it spans."""

    plan: BatchPlan
    state: str  # prepared | executed | cancelled
    end_tokens: dict[int, int]  # slot -> reserved length after this batch
    start_tokens: dict[int, int]  # slot -> reserved length before it (for cancel)
    start_pages: dict[int, int]  # slot -> row pages before it (for cancel)


@dataclass
class Transfer:
    """A transfer not yet retired: per page (name, source phys, destination phys)."""

    kind: TransferKind
    extent_generation: int
    pages: list[tuple[int, int, int]]
    waits_for: set[int]
    ticket: TransferTicket

    @property
    def tiers(self) -> tuple[Tier, Tier]:
        """(source tier, destination tier)."""
        return (Tier.L1, Tier.L2) if self.kind is TransferKind.BACKUP else (Tier.L2, Tier.L1)


@dataclass
class State:
    """All bookkeeping of one epoch (version tags and memory contents carry over restarts)."""

    epoch: int
    slots: list[Slot]
    pages: dict[int, Page]
    pools: dict[Tier, Pool]
    extents: dict[int, Extent] = field(default_factory=dict)
    batches: dict[int, Batch] = field(default_factory=dict)
    transfers: dict[int, Transfer] = field(default_factory=dict)
    unreported: list[TransferCompletion] = field(default_factory=list)
    next_page: int = 0
    next_extent: int = 1
    next_batch: int = 0
    next_transfer: int = 0
    next_version: int = 1
    calls: Counter = field(default_factory=Counter)

    def clone(self) -> State:
        """A copy that shares nothing mutable: what a call runs its bookkeeping on.

        Written out rather than `copy.deepcopy` because it runs on every boundary call:
        plans, tickets and completions are frozen values and are shared, not copied.
        """
        return State(
            epoch=self.epoch,
            slots=[Slot(s.generation, s.live, list(s.pages), s.num_tokens, s.reserved_tokens, s.produced, s.appended, s.last_output) for s in self.slots],
            pages={n: Page(p.holders, list(p.versions), {t: Copy(c.phys, c.state) for t, c in p.copies.items()}) for n, p in self.pages.items()},
            pools={tier: pool.clone() for tier, pool in self.pools.items()},
            extents={g: Extent(e.pages, e.refcount) for g, e in self.extents.items()},
            batches={b: Batch(r.plan, r.state, dict(r.end_tokens), dict(r.start_tokens), dict(r.start_pages)) for b, r in self.batches.items()},
            transfers={t: Transfer(r.kind, r.extent_generation, list(r.pages), set(r.waits_for), r.ticket) for t, r in self.transfers.items()},
            unreported=list(self.unreported),
            next_page=self.next_page,
            next_extent=self.next_extent,
            next_batch=self.next_batch,
            next_transfer=self.next_transfer,
            next_version=self.next_version,
            calls=Counter(self.calls),
        )


def fresh_state(epoch: int, generations: list[int], believed: dict[Tier, list[tuple[int, ...]]], next_version: int) -> State:
    """The state an epoch starts in: every slot free, every physical page on its free list."""
    return State(
        epoch=epoch,
        slots=[Slot(generation=g) for g in generations],
        pages={},
        pools={tier: Pool(len(content), list(range(len(content))), list(content)) for tier, content in believed.items()},
        next_version=next_version,
    )
