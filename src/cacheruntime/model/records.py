"""The model's records: everything it knows, as plain data the sections read and write.

Record and field names (and their order) are the glossary's, shared with the runtime's
ledger, so that the two read side by side; representations may differ. Records that no
operation changes after they are made (`Copy`, `Batch`, `Transfer`) are frozen, so
that `State.clone` shares them instead of copying.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from cacheruntime.protocol import (
    BatchPlan,
    BatchState,
    CopyState,
    FaultKind,
    PageRun,
    RequestRuntimeHandle,
    Tier,
    TransferCompletion,
    TransferKind,
    TransferTicket,
)


@dataclass
class Slot:
    """A request slot: its row, its lengths, and the outputs made and fed back.

    `produced`/`appended` count outputs made and outputs fed back; `last_output` is the
    token the latest executed batch of the request produced (None before the first).
    """

    generation: int = 0
    live: bool = False
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0
    reserved_tokens: int = 0
    produced: int = 0
    appended: int = 0
    last_output: int | None = None


@dataclass(frozen=True)
class Copy:
    """One tier's copy of a page: its physical location and whether it is readable yet."""

    phys: int
    state: CopyState


@dataclass
class Page:
    """A page name: holders (rows and extents), last-written versions, and its copies."""

    holders: int
    versions: list[int]
    copies: dict[Tier, Copy] = field(default_factory=dict)


@dataclass
class Pool:
    """A physical pool: the version tags its pages hold, the free list, and deferred frees.

    `tags` survives frees and restarts, as memory does: a page taken from the free list
    holds whatever was there, so reading a position nobody wrote shows up.
    """

    total: int
    free: list[int]
    tags: list[list[int]]
    deferred: dict[int, set[int]] = field(default_factory=dict)  # phys -> blocking transfer ids


@dataclass
class Extent:
    """A live extent: its page names in order, its reference count, and the runs its ref names.

    `runs` is `pageruns.coalesce(pages)`, computed when the extent is made: every use of
    a ref is checked against it.
    """

    pages: tuple[int, ...]
    refcount: int
    runs: tuple[PageRun, ...]


@dataclass(frozen=True)
class Batch:
    """A prepared batch: its plan and, per item in plan order, its slot and row lengths.

    Only prepared batches have one (`State.batches`); an executed or cancelled batch
    leaves its outcome in `State.finished`. `starts[i]` is the first position item i
    computes, `ends[i]` its row's reserved length after the batch, `start_tokens[i]` that
    length before it (what cancel restores); `one_token` says every item computes exactly
    one token (a decode step).
    """

    plan: BatchPlan
    state: BatchState
    slots: tuple[int, ...]
    slot_set: frozenset[int]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    start_tokens: tuple[int, ...]
    requests: tuple[RequestRuntimeHandle, ...]
    one_token: bool


@dataclass(frozen=True)
class Transfer:
    """An in-flight tier move: per page (name, source phys, destination phys).

    `touched` holds the `(tier, phys)` keys it reads or writes, computed when it starts:
    the deferred-free rule (O3) asks which transfers touch a physical page. An L3 transfer
    (`cacheruntime.model.l3`) has control's key per page in `keys`; its moves are (name, source,
    host staging page) for a persist and (name, host staging page, device page) for a fetch.
    """

    kind: TransferKind
    extent_generation: int
    pages: tuple[tuple[int, int, int], ...]
    waits_for: frozenset[int]
    ticket: TransferTicket
    touched: frozenset[tuple[Tier, int]]
    keys: tuple[str, ...] = ()


@dataclass
class State:
    """Everything the model knows; compared for equality to prove atomicity.

    `batches` holds prepared batches only; `finished` maps an executed or cancelled
    batch to its state and sorted slots, all that `AlreadyExecuted`, `NotPrepared` and
    `probe()` need of it. `lost` is RuntimeLost's mark (every call but restart raises
    `RuntimeFault`); `faults` are the pending injections (kind, how many more to count)
    and `doomed` the transfers an injection picked, which fail when they would complete.
    `objects` is the L3 store (control's key -> the tags its object holds), which outlives the
    epoch as memory does; `keys` is the key control gave each page name in a Persist or Fetch.
    """

    epoch: int
    slots: list[Slot]
    pages: dict[int, Page]
    pools: dict[Tier, Pool]
    extents: dict[int, Extent]
    batches: dict[int, Batch]
    finished: dict[int, tuple[BatchState, tuple[int, ...]]]
    transfers: dict[int, Transfer]
    unreported: list[TransferCompletion]
    next_page: int = 0
    next_extent: int = 1
    next_batch: int = 0
    next_transfer: int = 0
    next_version: int = 1
    calls: Counter[str] = field(default_factory=Counter)
    lost: bool = False
    faults: tuple[tuple[FaultKind, int], ...] = ()
    doomed: frozenset[int] = frozenset()
    objects: dict[str, tuple[int, ...]] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)

    def clone(self) -> State:
        """A copy deep enough for a transaction: every container an operation mutates is new.

        `copy.deepcopy` would do, but costs milliseconds per call; the conformance suite and
        the stateful tests make hundreds of thousands of calls. Frozen records, plans,
        tickets and page tuples are immutable and stay shared.
        """
        return State(
            epoch=self.epoch,
            slots=[dataclasses.replace(slot, pages=list(slot.pages)) for slot in self.slots],
            pages={name: Page(page.holders, list(page.versions), dict(page.copies)) for name, page in self.pages.items()},
            pools={
                tier: Pool(pool.total, list(pool.free), [list(row) for row in pool.tags], {p: set(b) for p, b in pool.deferred.items()})
                for tier, pool in self.pools.items()
            },
            extents={g: dataclasses.replace(e) for g, e in self.extents.items()},
            batches=dict(self.batches),
            finished=dict(self.finished),
            transfers=dict(self.transfers),
            unreported=list(self.unreported),
            next_page=self.next_page,
            next_extent=self.next_extent,
            next_batch=self.next_batch,
            next_transfer=self.next_transfer,
            next_version=self.next_version,
            calls=Counter(self.calls),
            lost=self.lost,
            faults=self.faults,
            doomed=self.doomed,
            objects=dict(self.objects),
            keys=dict(self.keys),
        )


def fresh_state(epoch: int, generations: list[int], tags: dict[Tier, list[list[int]]], next_version: int) -> State:
    """The state an epoch starts in: every slot free, every physical page on its free list.

    `tags` (what memory holds) and `next_version` carry over from the epoch before.
    """
    return State(
        epoch=epoch,
        slots=[Slot(generation=g) for g in generations],
        pages={},
        pools={tier: Pool(len(t), list(range(len(t))), t) for tier, t in tags.items()},
        extents={},
        batches={},
        finished={},
        transfers={},
        unreported=[],
        next_version=next_version,
    )
