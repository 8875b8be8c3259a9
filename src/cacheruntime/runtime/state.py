"""The runtime's bookkeeping: slots, page names, free lists, extents, batches, transfers.

This is the part of `LocalGPURuntime` that says *what* is where; tensors, streams and
events (the *how*) are kept apart from it, so that nothing here can ever leak a device
object. It mirrors the reference model's state record for record, because the model's
behaviour is the contract, with two differences of representation that keep a call's cost
proportional to what it touches:

- free lists are deques (the allocator takes from the front, frees go to the back, as in
  the model's lists);
- only *prepared* batches keep a full record (`State.batches`); an executed or cancelled
  batch leaves a compact outcome, `(state, slots)`, in `State.finished`, which is all
  that `AlreadyExecuted`/`NotPrepared` and `probe()` need.

Nothing here is ever copied wholesale: a call checks its preconditions before it
mutates, and the mutations that can be followed by a failed check (intents applied in
order) are undone from the call's journal (`cacheruntime.runtime.local`).
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cacheruntime.protocol import BatchPlan, CopyState, Tier, TransferCompletion, TransferKind, TransferTicket


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
    """One tier's copy of a page name: its physical page and whether a transfer still fills it.

    Immutable, replaced when the transfer filling it retires. Made of an int and a bool,
    the garbage collector stops tracking it after its first pass: a long-running server holds
    one per page and tier, and every tracked object is work for each full collection.
    """

    phys: int
    filling: bool

    @property
    def state(self) -> CopyState:
        return CopyState.FILLING if self.filling else CopyState.VALID


@dataclass(slots=True)
class Page:
    """A page name: holders (rows and extents), last-written version tags, its copies.

    `versions` is an `array('q')`, which the garbage collector does not track (see Copy).
    """

    holders: int
    versions: array
    copies: dict[Tier, Copy] = field(default_factory=dict)


@dataclass
class Pool:
    """A physical pool's free list, deferred frees and the tags the runtime believes it holds.

    `believed` is what each physical page should hold after the writes and transfers the
    runtime has issued: it survives frees and restarts, as memory does. A runner that
    claims TAGGED_COMPUTE reports the real bytes instead, which is how D1 catches a race.
    One flat list, `page_size` tags per physical page (page p's tags are
    `believed[p * page_size : (p + 1) * page_size]`): a decode step sets one element, and
    the pool is one object for the garbage collector, not one per page.
    """

    total: int
    free: deque[int]
    believed: list[int]
    deferred: dict[int, set[int]] = field(default_factory=dict)  # phys -> transfers it waits for


@dataclass
class Extent:
    """A live extent: its page names in order, its reference count, and the runs its ref names.

    `runs` is `pageruns.coalesce(pages)`, computed once when the ref is issued: every use
    of the ref checks it against the ref's runs, and coalescing per use cost more than the
    call it guarded.
    """

    pages: tuple[int, ...]
    refcount: int
    runs: tuple = ()


@dataclass
class Batch:
    """A prepared batch's record: plan, state, and per item (plan order) its slot and row lengths.

    For an executed or cancelled batch (`State.finished`) only `state` and `slot_set` are
    meaningful; `plan` is None. Lists in plan order, not dicts keyed by slot: the hot path
    reads them by position.
    """

    plan: BatchPlan | None
    state: str  # prepared | executed | cancelled
    slot_set: frozenset[int]  # the slots of its items
    slots: list[int] = field(default_factory=list)  # item i's slot
    starts: list[int] = field(default_factory=list)  # first position item i computes
    ends: list[int] = field(default_factory=list)  # reserved length after this batch
    start_tokens: list[int] = field(default_factory=list)  # reserved length before it (for cancel)
    requests: list[Any] = field(default_factory=list)  # item i's request handle (for its result)
    rows: list[Slot] = field(default_factory=list)  # item i's slot record (slots live as long as the epoch)
    one_token: bool = False  # every item computes exactly one token (a decode step)


@dataclass
class Transfer:
    """A transfer not yet retired: per page (name, source phys, destination phys)."""

    kind: TransferKind
    extent_generation: int
    pages: list[tuple[int, int, int]]
    waits_for: set[int]
    ticket: TransferTicket
    touched: set[int] = field(default_factory=set)  # 2 * phys + (tier is L2) of each page it reads or writes

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
    finished: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # batch -> (state, sorted slots)
    transfers: dict[int, Transfer] = field(default_factory=dict)
    unreported: list[TransferCompletion] = field(default_factory=list)
    next_page: int = 0
    next_extent: int = 1
    next_batch: int = 0
    next_transfer: int = 0
    next_version: int = 1
    calls: Counter = field(default_factory=Counter)


def fresh_state(epoch: int, generations: list[int], believed: dict[Tier, list[int]], page_size: int, next_version: int) -> State:
    """The state an epoch starts in: every slot free, every physical page on its free list."""
    return State(
        epoch=epoch,
        slots=[Slot(generation=g) for g in generations],
        pages={},
        pools={tier: Pool(len(content) // page_size, deque(range(len(content) // page_size)), content) for tier, content in believed.items()},
        next_version=next_version,
    )
