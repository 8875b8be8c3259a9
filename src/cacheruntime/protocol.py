"""The shared vocabulary of the boundary between control and the GPU cache runtime.

Everything that crosses the boundary is defined here and nothing else does: opaque
handles, plans, intents, completions, the typed errors and the `RuntimeInterface`.
The values are frozen attrs classes made of ints, strings and tuples only, so that
control can hold, hash, log and compare them, and so that nothing physical (a tensor,
a pointer, a stream, an event, a graph) can ride along (invariant B2).

`spec/protocol.md` is the prose contract; names here are the names used there, in
`tla/CacheRuntime.tla`, in the reference model and in every runtime.

This module imports neither torch nor anything else heavy: control, the model and the
checkers depend on it alone.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

import attrs

# --------------------------------------------------------------------------------------
# Identity and capabilities
# --------------------------------------------------------------------------------------


class Tier(enum.Enum):
    """Where a copy of a KV page lives: L1 is device memory, L2 is pinned host memory."""

    L1 = "L1"
    L2 = "L2"

    # Members are singletons compared by identity, so the identity hash is correct, and it
    # is C code: the runtime keys its per-page copies and pools by tier on the hot path,
    # where Enum's own `__hash__` (Python, hashing the name) cost more than the lookup.
    __hash__ = object.__hash__


class Capability(enum.Enum):
    """What a runtime claims to support; the conformance suite skips what is not claimed."""

    L2 = "l2"  # a host tier: backup, restore, demote, drop
    ASYNC_TRANSFERS = "async_transfers"  # transfers complete after the call that started them
    INTROSPECTION = "introspection"  # probe() returns the abstract state
    RESTART = "restart"  # restart() bumps the epoch
    DELAY_KNOB = "delay_knob"  # set_transfer_delay() makes races deterministic
    TAGGED_COMPUTE = "tagged_compute"  # compute writes version tags; next_token = tag_digest
    SCHEDULE_SEED = "schedule_seed"  # set_schedule_seed() picks the interleaving of copies, compute, completions
    FAULT_INJECTION = "fault_injection"  # inject_fault() makes the Nth transfer of a kind, or compute, fail
    L3 = "l3"  # a store of page objects keyed by control: persist, fetch, l3_exists (spec/protocol.md §9)


class HostMode(enum.Enum):
    """What the pinned host pool is for (spec/protocol.md §9.1).

    `RESIDENT`: host pages are a cache tier (L2, the `L2` capability) and L3 persists from
    host copies. `BUFFER_ONLY`: host pages are staging only, between the device and L3; no
    host page holds a copy outside a transfer in flight (S1), so the L2 tier intents are
    `NoL2`. SGLang's `--hicache-host-memory-mode`.
    """

    RESIDENT = "resident"
    BUFFER_ONLY = "buffer_only"


@attrs.frozen
class RuntimeInfo:
    """What control may know about a runtime: its identity, epoch, sizes and claims."""

    runtime_id: str
    epoch: int
    page_size: int  # tokens per KV page
    max_requests: int  # request slots
    max_request_tokens: int  # tokens one request row can hold
    l1_pages: int  # device pool capacity in pages
    l2_pages: int  # host pool capacity in pages (0 without an L2)
    capabilities: frozenset[Capability]
    page_bytes: int = 0  # KV bytes one page occupies in one tier (all layers, K and V); 0 if none
    #: Token ids a plan may carry are 0 .. vocab_size-1 (`InvalidArgument` otherwise). No
    #: default: every runtime knows the vocabulary of the model it runs, and says so.
    vocab_size: int = attrs.field(kw_only=True)


# --------------------------------------------------------------------------------------
# Handles: opaque to control, generation-checked by the runtime
# --------------------------------------------------------------------------------------


@attrs.frozen
class RequestRuntimeHandle:
    """A request's claim on one runtime slot; stale once the slot's generation moves on."""

    runtime_id: str
    epoch: int
    slot_id: int
    generation: int


@attrs.frozen(order=True)
class PageRun:
    """`page_count` consecutive runtime page names starting at `first_page`.

    Page names are logical: the runtime maps each to a device and/or host location that
    control never sees, so a restore to other device pages does not change the name.
    """

    first_page: int
    page_count: int

    @property
    def end(self) -> int:
        """One past the last page of the run."""
        return self.first_page + self.page_count


@attrs.frozen
class CacheExtentRef:
    """A reference to an immutable run of full KV pages the runtime keeps for control.

    `generation` is unique per extent within an epoch: splitting an extent retires the
    old ref and issues two new ones, so a ref is never silently re-pointed.
    """

    runtime_id: str
    epoch: int
    generation: int
    page_runs: tuple[PageRun, ...]

    @property
    def page_count(self) -> int:
        """How many pages the extent covers."""
        return sum(run.page_count for run in self.page_runs)


@attrs.frozen
class PreparedBatchHandle:
    """A batch the runtime has validated and staged; executable once."""

    runtime_id: str
    epoch: int
    batch_id: int


@attrs.frozen
class TransferTicket:
    """A started tier move; its completion is reported once by poll or wait."""

    runtime_id: str
    epoch: int
    transfer_id: int
    kind: TransferKind
    extent_generation: int  # the extent moved; 0 for a fetch, which fills a row (spec/protocol.md §9.4)
    page_count: int  # pages the transfer actually moves (0 if nothing needed moving)


class TransferKind(enum.Enum):
    """The direction of a tier move."""

    BACKUP = "backup"  # L1 -> L2 (D2H)
    RESTORE = "restore"  # L2 -> L1 (H2D)
    PERSIST = "persist"  # a host copy (resident) or L1 through host staging (buffer_only) -> L3
    FETCH = "fetch"  # L3 -> host staging -> L1, into a plan's row

    __hash__ = object.__hash__  # as for Tier: tickets and the runtime's tables hash it often


# --------------------------------------------------------------------------------------
# Intents: what control wants to happen to extents; the runtime decides how and when
# --------------------------------------------------------------------------------------


@attrs.frozen
class Backup:
    """Copy the extent's device pages that have no host copy to L2 (D2H)."""

    extent: CacheExtentRef


@attrs.frozen
class Restore:
    """Copy the extent's pages that have no device copy back from L2 (H2D)."""

    extent: CacheExtentRef


@attrs.frozen
class Demote:
    """Drop the device copy of an extent whose every page has (or is getting) a host copy."""

    extent: CacheExtentRef


@attrs.frozen
class Drop:
    """Drop the host copy of an extent whose every page still has a device copy."""

    extent: CacheExtentRef


@attrs.frozen
class Release:
    """Give back one reference to an extent; its pages are freed with the last holder."""

    extent: CacheExtentRef


@attrs.frozen
class Publish:
    """Make `page_count` full pages of a request row, from row page `first_page`, an extent."""

    request: RequestRuntimeHandle
    first_page: int
    page_count: int


@attrs.frozen
class Close:
    """End a request: free its slot now and its row's pages once nothing uses them."""

    request: RequestRuntimeHandle


@attrs.frozen
class Persist:
    """Write each page of the extent to L3 as an object under control's key for it (`keys[i]` for
    the extent's i-th page, a hash of the token prefix up to that page): from its host copy
    (resident) or from its device copy through host staging (buffer_only). The runtime never
    invents a key; an object already under a key is replaced."""

    extent: CacheExtentRef
    keys: tuple[str, ...]


@attrs.frozen
class Fetch:
    """Read the objects under `keys` from L3 into new pages of `request`'s row, after the extents
    its item attaches and before its new tokens, through host staging; starts at
    `prepare_batch` as a Restore does, and the batch's compute waits for it (KV_READY)."""

    request: RequestRuntimeHandle
    keys: tuple[str, ...]


TierIntent = Backup | Restore | Demote | Drop
Intent = Backup | Restore | Demote | Drop | Release | Publish | Close | Persist | Fetch


# --------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------


@attrs.frozen
class BatchItem:
    """One request's share of a batch: prefix to attach and tokens to compute.

    `attach` maps extents (full pages, in order) to the front of an empty row; it is only
    allowed on a request that has no tokens yet. The tokens computed are, in order, the
    request's previous output (if `append_previous_output`) and then `input_ids`.
    """

    request: RequestRuntimeHandle
    input_ids: tuple[int, ...] = ()
    attach: tuple[CacheExtentRef, ...] = ()
    append_previous_output: bool = False

    @property
    def new_tokens(self) -> int:
        """Tokens this item writes into the request's row."""
        return len(self.input_ids) + int(self.append_previous_output)


@attrs.frozen
class BatchPlan:
    """One scheduling decision: every item and every intent, crossing the boundary once.

    Restore intents start at `prepare_batch` (so their H2D overlaps the batch before);
    all other intents apply at `execute_batch`, after the batch's compute, in order.
    """

    items: tuple[BatchItem, ...]
    intents: tuple[Intent, ...] = ()


@attrs.frozen
class ItemResult:
    """What one item produced: the row's length after the batch and the sampled token."""

    request: RequestRuntimeHandle
    num_tokens: int
    next_token: int | None  # None from runtimes without compute (the reference model)


@attrs.frozen
class BatchCompletion:
    """What `execute_batch` returns: per-item results and the results of its intents."""

    batch: PreparedBatchHandle
    items: tuple[ItemResult, ...]
    published: tuple[CacheExtentRef, ...]  # one per Publish intent, in plan order
    tickets: tuple[TransferTicket, ...]  # one per Backup and Persist intent, in plan order


class TransferFailure(enum.Enum):
    """Why a transfer failed (spec/protocol.md §5.3): its destination copies are not valid, its sources intact."""

    COPY = "copy"  # the copy itself failed (at issue or on its stream)
    STORE = "store"  # an L3 transfer's store write or read (or its staging copy) failed: nothing is lost
    MISS = "miss"  # a fetch found no object under one of its keys (existence is a hint, §9.4)


@attrs.frozen
class TransferCompletion:
    """A finished transfer, reported exactly once: landed (`failure` None) or failed, with why."""

    ticket: TransferTicket
    failure: TransferFailure | None = None


# --------------------------------------------------------------------------------------
# Errors: typed, saying what was wrong and how to fix it; state is unchanged after any
# --------------------------------------------------------------------------------------


class CacheRuntimeError(Exception):
    """Base of every error a runtime raises across the boundary.

    The runtime's state is identical before and after a call that raised one of these.
    """

    fix: str = ""

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        if fix is not None:
            self.fix = fix
        super().__init__(f"{what} (fix: {self.fix})" if self.fix else what)


class InvalidArgument(CacheRuntimeError):
    """An argument of the wrong type or out of its range: a float page index, a string slot,
    `None` for a tuple, a bool for an int, a negative count, a token id outside the vocabulary.

    Checked before everything else (handles included), so an ill-typed call never reaches
    code that would fail on it half-way; the message names the argument, what it was and
    what it must be.
    """

    fix = "pass the types `cacheruntime.protocol` declares: ints for ids, counts and tokens, tuples of its values"


class ForeignRuntime(CacheRuntimeError):
    """A handle, ref or plan issued by another runtime was given to this one."""

    fix = "send the handle to the runtime whose runtime_id it carries"


class StaleHandle(CacheRuntimeError):
    """A handle whose epoch or generation is no longer current (H1)."""

    fix = "drop the handle; reopen the request or look the extent up again"


class UnknownHandle(CacheRuntimeError):
    """A handle this runtime never issued in this epoch."""

    fix = "use only handles returned by this runtime"


class OutOfSlots(CacheRuntimeError):
    """Every request slot is taken."""

    fix = "close a request, then open again"


class OutOfPages(CacheRuntimeError):
    """A tier has fewer free pages than the call needs; nothing was allocated."""

    fix = "release, demote or drop extents to free pages, then retry"

    def __init__(self, tier: Tier, needed: int, free: int):
        self.tier, self.needed, self.free = tier, needed, free
        super().__init__(f"{tier.value} needs {needed} free pages, has {free}")


class RowFull(CacheRuntimeError):
    """A request row would exceed max_request_tokens."""

    fix = "finish the request or open a new one with a shorter context"


class InvalidPageRun(CacheRuntimeError):
    """A page range or split point is empty, out of range or not on a page boundary."""

    fix = "name whole pages inside the row or extent (0 < k < page_count for a split)"


class InvalidPlan(CacheRuntimeError):
    """A plan is malformed: empty, a request twice, attach on a non-empty row, ..."""

    fix = "build one item per request with attach only on a fresh request"


class NotPrepared(CacheRuntimeError):
    """A batch handle that is not (or no longer) prepared: cancelled or never issued."""

    fix = "prepare the plan again and execute the new handle"


class AlreadyExecuted(CacheRuntimeError):
    """A prepared batch was executed before; it executes at most once (O4)."""

    fix = "prepare a new batch"


class OutOfOrder(CacheRuntimeError):
    """A batch shares a request with an earlier prepared batch that has not executed."""

    fix = "execute (or cancel) the earlier batch first"


class BatchDependency(CacheRuntimeError):
    """Cancelling a batch that a later prepared batch depends on."""

    fix = "cancel the later batch first"


class RequestBusy(CacheRuntimeError):
    """A request is part of a prepared batch, or has no previous output to append."""

    fix = "execute or cancel the batch first"


class NotResident(CacheRuntimeError):
    """An extent attached to a row has pages with no device copy and no restore started."""

    fix = "add a Restore intent for the extent to the plan"


class NotBackedUp(CacheRuntimeError):
    """A restore or demote needs host copies that do not exist (or are not started)."""

    fix = "back the extent up first"


class ExtentInUse(CacheRuntimeError):
    """Demoting pages that a request row or a prepared batch still reads."""

    fix = "close the requests using the extent first"


class ExtentShared(CacheRuntimeError):
    """Splitting an extent that has more than one reference."""

    fix = "release the other references before splitting"


class WouldLoseData(CacheRuntimeError):
    """Dropping the last copy of a page: the host copy of a page with no device copy."""

    fix = "release the extent instead, or restore it first"


class NoL2(CacheRuntimeError):
    """A tier move on a runtime without the L2 capability."""

    fix = "check RuntimeInfo.capabilities before asking for tier moves"


class NoL3(CacheRuntimeError):
    """A Persist, Fetch or `l3_exists` on a runtime without the L3 capability."""

    fix = "check RuntimeInfo.capabilities for L3 before naming L3 objects"


class ComputeFailed(CacheRuntimeError):
    """The compute of an executing batch failed: the batch, and every later prepared batch that
    shares a request with it, are `failed` and have no visible effect (spec/protocol.md §4.5).

    `batches` are the failed batch ids, the executed one first; `cause` is what the runner raised.
    """

    fix = "prepare the failed items again as a new batch (their rows are as before the batch)"

    def __init__(self, what: str, batches: tuple[int, ...] = (), cause: str = ""):
        self.batches, self.cause = batches, cause
        super().__init__(what)


class RuntimeFault(CacheRuntimeError):
    """The runtime's machinery is gone (a stream worker died, the device broke): every call
    raises this at once, changing nothing, until `restart()` recovers (spec/protocol.md §4.15)."""

    fix = "restart() the runtime (every handle goes stale); rebuild control's state from the new epoch"


class Unsupported(CacheRuntimeError):
    """An optional operation the runtime does not claim in its capabilities."""

    fix = "check RuntimeInfo.capabilities first"


# --------------------------------------------------------------------------------------
# Introspection: the abstract state, for runtimes that claim INTROSPECTION
# --------------------------------------------------------------------------------------


class CopyState(enum.Enum):
    """The state of one tier's copy of a page."""

    ABSENT = "absent"
    FILLING = "filling"  # a transfer into this copy is in flight; not yet readable
    VALID = "valid"
    #: Readable, but control asked to drop it (Demote, Drop) while the page's other copy is
    #: still filling: it goes when that transfer lands and is valid again if it fails (§4.11).
    DROPPING = "dropping"

    @property
    def readable(self) -> bool:
        """Whether the copy holds the page's bytes (valid or dropping)."""
        return self is CopyState.VALID or self is CopyState.DROPPING


class BatchState(enum.StrEnum):
    """The state of a batch: prepared until it is executed or cancelled, then final.

    A `StrEnum`, so that a view compares equal to the spec's and TLA+'s state words.
    """

    PREPARED = "prepared"
    EXECUTED = "executed"
    CANCELLED = "cancelled"
    FAILED = "failed"  # its compute failed (or one it depended on did): no visible effect


#: How many finished (executed, cancelled or failed) batches a runtime remembers: the last
#: this many to finish. An older finished batch's handle is `StaleHandle`, not
#: `AlreadyExecuted` or `NotPrepared`; so the table of outcomes stays bounded in an epoch.
FINISHED_BATCHES_KEPT = 256


@attrs.frozen
class SlotView:
    """One request slot: its generation, and for a live request the row's pages and length."""

    slot_id: int
    generation: int
    live: bool
    pages: tuple[int, ...]  # page names of the row, in token order
    num_tokens: int  # tokens written by executed batches
    reserved_tokens: int  # tokens including prepared, not yet executed batches


@attrs.frozen
class PageView:
    """One page name: its holders and, per tier, copy state and the tags the copy holds.

    `versions` are the version tags last written for the page's token positions (0 for a
    position never written); `l1_tags`/`l2_tags` are the tags in the copies' bytes, read
    from memory by runtimes that claim TAGGED_COMPUTE, else equal to what the runtime
    believes it holds.
    """

    page: int
    holders: int
    l1: CopyState
    l2: CopyState
    versions: tuple[int, ...]
    l1_tags: tuple[int, ...]
    l2_tags: tuple[int, ...]


@attrs.frozen
class PoolView:
    """One physical pool: the free list (duplicates shown), pages mapped, pages deferred.

    Physical page numbers appear only here, in test-only introspection; control never
    sees them.
    """

    tier: Tier
    total: int
    free: tuple[int, ...]
    mapped: tuple[tuple[int, int], ...]  # (physical page, page name)
    deferred: tuple[int, ...]  # released, waiting for in-flight transfers or compute


@attrs.frozen
class ExtentView:
    """A live extent: its generation, its page names in order, and its reference count."""

    generation: int
    pages: tuple[int, ...]
    refcount: int


@attrs.frozen
class BatchView:
    """A batch handle the runtime remembers, with its state and the requests it names."""

    batch_id: int
    state: BatchState
    slots: tuple[int, ...]
    pages: tuple[int, ...]  # pages the batch holds until it executes or is cancelled


@attrs.frozen
class TransferView:
    """An in-flight transfer: its direction, the page names it moves, and where from and to."""

    transfer_id: int
    kind: TransferKind
    pages: tuple[int, ...]
    #: Physical pages read and written: a backup L1 -> L2, a restore L2 -> L1; a persist reads
    #: host copies (L2, no destinations) in resident mode, or device copies into host staging
    #: (L1 -> L2) in buffer_only mode; a fetch writes host staging and then device pages (L2 -> L1).
    sources: tuple[int, ...]
    destinations: tuple[int, ...]


@attrs.frozen
class ObjectView:
    """An object of the L3 store: control's key and the version tags its bytes hold."""

    key: str
    tags: tuple[int, ...]


@attrs.frozen
class AbstractState:
    """The runtime's state at the level of the contract; the invariants are predicates on it."""

    epoch: int
    page_size: int
    slots: tuple[SlotView, ...]
    pages: tuple[PageView, ...]
    pools: tuple[PoolView, ...]
    extents: tuple[ExtentView, ...]
    batches: tuple[BatchView, ...]
    transfers: tuple[TransferView, ...]
    boundary_calls: tuple[tuple[str, int], ...]  # (operation, count) since the epoch began
    #: L3 (a runtime that claims it): the objects of the store, and per page name the key control
    #: gave it in a Persist or Fetch (both empty without L3, so earlier states compare as before)
    objects: tuple[ObjectView, ...] = ()
    page_keys: tuple[tuple[int, str], ...] = ()


#: Every `tag_digest` is below this (a Mersenne prime): a TAGGED_COMPUTE runtime's tokens are.
TAG_DIGEST_MODULUS = 2_147_483_647


def tag_digest(tags: tuple[int, ...]) -> int:
    """The token a TAGGED_COMPUTE runtime returns: a digest of the tags compute read.

    A polynomial hash modulo a Mersenne prime: any changed, missing or reordered tag
    changes it with overwhelming probability, so a stale read shows up as a mismatch.
    """
    acc = 0
    for tag in tags:
        acc = (acc * 1_000_003 + tag + 1) % TAG_DIGEST_MODULUS
    return acc


# --------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------


@runtime_checkable
class RuntimeInterface(Protocol):
    """The boundary: every call control can make on a GPU cache runtime.

    Each call is atomic: it either does all it says or raises a `CacheRuntimeError`
    and changes nothing. `spec/protocol.md` gives preconditions, effects, errors and
    whether the call may block.
    """

    def info(self) -> RuntimeInfo: ...

    def open_request(self) -> RequestRuntimeHandle: ...

    def close_request(self, request: RequestRuntimeHandle) -> None: ...

    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle: ...

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion: ...

    def cancel_batch(self, batch: PreparedBatchHandle) -> None: ...

    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef: ...

    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]: ...

    def retain(self, extent: CacheExtentRef) -> None: ...

    def release(self, extent: CacheExtentRef) -> None: ...

    def submit(self, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]: ...

    def poll_completions(self) -> tuple[TransferCompletion, ...]: ...

    def wait_completions(self) -> tuple[TransferCompletion, ...]: ...

    def restart(self) -> RuntimeInfo: ...


@runtime_checkable
class L3Interface(Protocol):
    """The operation a runtime that claims L3 adds to `RuntimeInterface` (Persist and Fetch ride
    in plans and `submit`)."""

    def l3_exists(self, keys: tuple[str, ...]) -> tuple[bool, ...]: ...


@runtime_checkable
class Introspectable(Protocol):
    """Optional test-only surface of a runtime that claims INTROSPECTION (and DELAY_KNOB)."""

    def probe(self) -> AbstractState: ...


@runtime_checkable
class DelayKnob(Protocol):
    """Optional test-only surface: slow transfers so that a missing wait is a sure race.

    `kind` None sets both directions; a backup delay longer than the restore delay exposes
    a restore that does not wait for the backup filling its host copy.
    """

    def set_transfer_delay(self, seconds: float, kind: TransferKind | None = None) -> None: ...


@runtime_checkable
class ScheduleSeed(Protocol):
    """Optional test-only surface: the seed of the interleaving of copies, compute and completions.

    A runtime that runs its streams under a seeded schedule (SCHEDULE_SEED) meets the same
    interleaving for the same calls and seed on any machine, so a verdict and its reach
    do not depend on load; the suite draws one seed per case and prints it in the
    reproduction.
    """

    def set_schedule_seed(self, seed: int) -> None: ...


class FaultKind(enum.Enum):
    """What `inject_fault` makes fail (FAULT_INJECTION, spec/faults.md)."""

    BACKUP = "backup"  # the Nth backup that moves a page fails (a failed completion)
    RESTORE = "restore"  # the Nth restore that moves a page fails (a failed completion)
    COMPUTE = "compute"  # the Nth execute_batch that reaches compute fails (ComputeFailed)
    LOST = "lost"  # the stream worker running the Nth transfer dies (RuntimeFault until restart)


@runtime_checkable
class FaultInjection(Protocol):
    """Optional test-only surface: make a chosen transfer or compute fail (FAULT_INJECTION).

    `nth` (>= 1) counts from this call: transfers of the kind that move at least one page,
    or `execute_batch` calls that reach compute. Several injections may be pending.
    """

    def inject_fault(self, kind: FaultKind, nth: int) -> None: ...


#: The operations that cross the boundary once per scheduling step (B1).
PER_BATCH_CALLS = ("prepare_batch", "execute_batch", "poll_completions")
