"""The ledger's records: what is where, with the reference model's record names and fields.

The records mirror `cacheruntime.model.records` name for name and field for field (a test
holds them equal), because the model's behaviour is the contract. Representations differ
where a call's cost must stay proportional to what it touches:

- free lists are deques (the allocator takes from the front, frees go to the back);
- a pool's `tags` is one flat list, `page_size` tags per physical page;
- copies are immutable tuples, replaced when the transfer filling them completes;
- only *prepared* batches keep a full record; an executed or cancelled batch leaves
  `(state, slots)` in `State.finished`, which is all that `AlreadyExecuted`, `NotPrepared`
  and `probe()` need.

Nothing here is torch: the ledger can never leak a device object to control (B2).
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import NamedTuple

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


@dataclass(slots=True)
class Slot:
    """A request slot: its row's page names, lengths, and the outputs made and fed back.

    Slotted, as `Page`: a decode step reads and writes a few fields of every item's slot
    and page, and slot attributes are cheaper to reach than instance dictionaries.
    """

    generation: int = 0
    live: bool = False
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0
    reserved_tokens: int = 0
    produced: int = 0  # batches prepared for the request (each makes one output)
    appended: int = 0  # of those outputs, how many a later item feeds back
    last_output: int | None = None  # the token the latest executed batch sampled


class Copy(NamedTuple):
    """One tier's copy of a page name: its physical page and whether it is readable yet.

    Immutable, replaced when the transfer filling it completes. Made of an int and an
    enum member, the garbage collector stops tracking it after its first pass: a server
    holds one per page and tier, and every tracked object is work for each collection.
    """

    phys: int
    state: CopyState


#: The copy states a page's copy can be in (shared: a `Copy` is immutable).
FILLING, VALID, DROPPING = CopyState.FILLING, CopyState.VALID, CopyState.DROPPING


@dataclass(slots=True)
class Page:
    """A page name: holders (rows and extents), last-written version tags, its copies.

    `versions` is an `array('q')`, which the garbage collector does not track.
    """

    holders: int
    versions: array[int]
    copies: dict[Tier, Copy] = field(default_factory=dict)


@dataclass
class Pool:
    """A physical pool: its free list, the tags its pages hold, and frees waiting on transfers.

    `tags` is what each physical page holds after the writes and transfers the runtime has
    issued; it survives frees and restarts, as memory does. One flat list, `page_size` tags
    per physical page (page p's are `tags[p * page_size : (p + 1) * page_size]`): a decode
    step sets one element. A runner that claims TAGGED_COMPUTE reports the real bytes
    instead, which is how D1 catches a race.
    """

    total: int
    free: deque[int]
    tags: list[int]
    deferred: dict[int, set[int]] = field(default_factory=dict)  # phys -> transfers it waits for


@dataclass
class Extent:
    """A live extent: its page names in order, its reference count, and the runs its ref names.

    `runs` is `pageruns.coalesce(pages)`, computed once when the ref is issued: every use
    of the ref checks it against the ref's runs.
    """

    pages: tuple[int, ...]
    refcount: int
    runs: tuple[PageRun, ...] = ()


@dataclass
class Batch:
    """A prepared batch: plan, state, and per item (plan order) its slot and row lengths.

    Lists in plan order, not dicts keyed by slot: the hot path reads them by position.
    """

    plan: BatchPlan
    state: BatchState
    slots: list[int]  # item i's slot
    slot_set: frozenset[int]  # the slots of its items
    starts: list[int]  # first position item i computes
    ends: list[int]  # reserved length after this batch
    start_tokens: list[int]  # reserved length before it (for cancel)
    requests: list[RequestRuntimeHandle]  # item i's request handle (for its result)
    one_token: bool  # every item computes exactly one token (a decode step)


@dataclass
class Transfer:
    """A transfer not yet completed: per page (name, source phys, destination phys)."""

    kind: TransferKind
    extent_generation: int
    pages: list[tuple[int, int, int]]
    waits_for: set[int]
    ticket: TransferTicket
    touched: set[int] = field(default_factory=set)  # `touch_key` of each page it reads or writes
    keys: tuple[str, ...] = ()  # an L3 transfer's key per page (`l3.py`)

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
    batches: dict[int, Batch] = field(default_factory=dict)  # prepared batches only
    finished: dict[int, tuple[BatchState, tuple[int, ...]]] = field(default_factory=dict)  # batch -> (state, sorted slots)
    transfers: dict[int, Transfer] = field(default_factory=dict)
    unreported: list[TransferCompletion] = field(default_factory=list)
    next_page: int = 0
    next_extent: int = 1
    next_batch: int = 0
    next_transfer: int = 0
    next_version: int = 1
    calls: Counter[str] = field(default_factory=Counter)
    lost: bool = False  # RuntimeLost: the machinery is gone; every call but info and restart raises RuntimeFault
    faults: list[tuple[FaultKind, int]] = field(default_factory=list)  # pending injections: (kind, how many more to count)
    doomed: set[int] = field(default_factory=set)  # transfers an injection picked: the device layer fails their copy
    objects: dict[str, tuple[int, ...]] = field(default_factory=dict)  # L3: the tags of the objects this runtime wrote or read
    keys: dict[int, str] = field(default_factory=dict)  # L3: the key a Persist or Fetch gave each page name


def touch_key(tier: Tier, phys: int) -> int:
    """`(tier, phys)` as one int, so that a transfer's touched pages are a set of ints."""
    return 2 * phys + (tier is Tier.L2)


def touch_keys(tier: Tier, phys: list[int]) -> set[int]:
    """`touch_key(tier, p)` of every `p` in `phys`, in one comprehension (a transfer moves hundreds)."""
    bit = int(tier is Tier.L2)
    return {2 * p + bit for p in phys}
