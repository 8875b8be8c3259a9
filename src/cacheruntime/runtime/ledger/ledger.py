"""The ledger: the runtime's bookkeeping of one epoch, composed of the model's sections.

`Ledger` says *what* is where (slots, page names, free lists, extents, batches,
transfers); the device layer says *how* (tensors, streams, events). It has no torch, so it
can never hand a device object to control (B2), and it reads section for section like the
reference model (`cacheruntime.model`): handle checks, pages, extents and intents,
batches (with the decode fast path), transfers. A mutant or a legal variant is a subclass
that overrides one public method, passed to `LocalGPURuntime(ledger_class=...)`.
"""

from __future__ import annotations

import collections.abc
from array import array
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cacheruntime.protocol import (
    AbstractState,
    BatchItem,
    BatchPlan,
    BatchState,
    BatchView,
    CacheExtentRef,
    CopyState,
    ExtentView,
    FaultKind,
    HostMode,
    Intent,
    ObjectView,
    PageView,
    Persist,
    PoolView,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    SlotView,
    Tier,
    TransferCompletion,
    TransferFailure,
    TransferKind,
    TransferTicket,
    TransferView,
)
from cacheruntime.runtime.ledger.batches import Batches, CheckedPlan
from cacheruntime.runtime.ledger.choices import MODEL_NUMBERING, Allocator, FreeOrder, Numbering, Reporting
from cacheruntime.runtime.ledger.decode import Decode, ItemHandles, Mapping
from cacheruntime.runtime.ledger.extents import Extents
from cacheruntime.runtime.ledger.handles import HandleChecks
from cacheruntime.runtime.ledger.pages import Pages
from cacheruntime.runtime.ledger.records import Batch, Copy, Extent, Page, Pool, Slot, State
from cacheruntime.runtime.ledger.transaction import Transaction
from cacheruntime.runtime.ledger.transfers import Transfers


class LedgerBase:
    """What every section reads: sizes, the choices, the state, the open transaction.

    The `TYPE_CHECKING` block names what one section asks of another, for the type
    checker only: at run time `Ledger` inherits each from its section.
    """

    transaction_class: type[Transaction] = Transaction
    #: Whether plans take the decode fast path (`decode`); a subclass that sets it False
    #: is the general route the fast path is tested against.
    fast_path = True

    if TYPE_CHECKING:

        def check_slot(self, request: RequestRuntimeHandle) -> Slot: ...
        def check_extent(self, extent: CacheExtentRef) -> Extent: ...
        def check_batch(self, batch: PreparedBatchHandle) -> Batch | tuple[BatchState, tuple[int, ...]]: ...
        def check_item_handles(self, items: tuple[BatchItem, ...]) -> tuple[list[int], list[Slot], bool]: ...
        def check_intent_handles(self, intent: Intent) -> None: ...
        def close_slot(self, slot: Slot) -> None: ...
        def require_free(self, tier: Tier, needed: int) -> None: ...
        def take_phys(self, tier: Tier, count: int) -> list[int]: ...
        def new_pages(self, count: int) -> tuple[range, list[int]]: ...
        def transfers_on(self, tier: Tier, phys: int) -> set[int]: ...
        def drop_copy(self, name: int, tier: Tier) -> None: ...
        def drop_holder(self, name: int) -> None: ...
        def add_holder(self, name: int) -> None: ...
        def drop_row(self, slot: Slot, keep: int) -> None: ...
        def apply_intent(self, intent: Intent) -> CacheExtentRef | TransferTicket | None: ...
        def item_handles(self, items: tuple[BatchItem, ...], intents: tuple[Intent, ...]) -> ItemHandles: ...
        def decode_route(
            self, handles: ItemHandles, start_tokens: list[int], ends: list[int], restoring: int
        ) -> tuple[list[int], bool, list[int] | None, int, int] | None: ...
        def apply_decode(self, checked: CheckedPlan) -> Mapping: ...
        def write_decode_tags(self, rows: list[Slot], starts: list[int], ends: list[int]) -> range: ...
        def sorted_slots(self, slot_set: frozenset[int]) -> tuple[int, ...]: ...
        def restore_pages(self, extent: CacheExtentRef) -> list[int]: ...
        def start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket: ...
        def complete_transfer(self, transfer_id: int) -> None: ...
        def restoring_pages(self) -> set[int]: ...
        def unreserve(self, record: Batch) -> None: ...
        def await_restores(self, pages: set[int]) -> list[int]: ...
        def has_copy(self, name: int, tier: Tier) -> bool: ...
        def drop_or_keep_until_landed(self, name: int, tier: Tier) -> None: ...
        def keep_dropping(self, names: tuple[int, ...], tier: Tier) -> None: ...
        def set_copy_state(self, copies: dict[Tier, Copy], tier: Tier, state: CopyState) -> None: ...
        def start_restore(self, extent: CacheExtentRef, todo: list[int]) -> TransferTicket: ...
        def fail_transfer(self, transfer_id: int) -> None: ...
        def count_toward_fault(self, kind: FaultKind) -> bool: ...
        def _run_deferred(self, pool: Pool, transfer_id: int) -> None: ...
        def fetch_into_row(self, keys: tuple[str, ...]) -> list[int]: ...
        def check_fetches(self, plan: BatchPlan, slots: frozenset[int]) -> dict[int, tuple[str, ...]]: ...
        def start_persist(self, intent: Persist, pages: tuple[int, ...]) -> TransferTicket: ...
        def complete_l3(self, transfer_id: int) -> None: ...
        def fail_l3(self, transfer_id: int, failure: TransferFailure) -> None: ...

    def __init__(
        self,
        *,
        runtime_id: str,
        page_size: int,
        max_requests: int,
        max_request_tokens: int,
        l1_pages: int,
        l2_pages: int,
        numbering: Numbering = MODEL_NUMBERING,
        free_order: FreeOrder = FreeOrder.FIFO,
        reporting: Reporting = Reporting.EAGER,
        seed: int = 0,
        vocab_size: int = 1 << 20,
        host_mode: HostMode = HostMode.RESIDENT,
        l3: bool = False,
    ):
        self.runtime_id = runtime_id
        self.vocab_size = vocab_size  # token ids a plan may carry: 0 .. vocab_size-1
        self.page_size = page_size
        self.max_request_tokens = max_request_tokens
        self.l2_pages = l2_pages
        self.resident = host_mode is HostMode.RESIDENT  # host pages are a tier (L2), not staging only
        self.has_l2 = bool(l2_pages) and self.resident
        self.l3 = l3  # a store is there (the L3 capability)
        self.numbering = numbering
        self.allocator = Allocator(free_order, seed)
        self.reporting = reporting
        self.txn = self.transaction_class()
        self.no_versions = array("q", [0] * page_size)  # a new page's versions (copied)
        tags = {Tier.L1: [0] * (l1_pages * page_size), Tier.L2: [0] * (l2_pages * page_size)}
        self.state = self.fresh_state(0, [0] * max_requests, tags, 1)
        self.held: list[TransferCompletion] = []  # completed, reported later (Reporting.NEXT_POLL)
        self.slot_changes = 0  # grows whenever a slot's generation or liveness changes
        self.validated: ItemHandles | None = None  # the last immutable plan's checked handles (decode.py)
        self.interned_slots: dict[frozenset[int], tuple[int, ...]] = {}

    def fresh_state(self, epoch: int, generations: list[int], tags: dict[Tier, list[int]], next_version: int) -> State:
        """The state an epoch starts in: every slot free, every physical page on its free list."""
        ps, numbering = self.page_size, self.numbering
        return State(
            epoch=epoch,
            slots=[Slot(generation=g) for g in generations],
            pages={},
            pools={tier: Pool(len(content) // ps, deque(range(len(content) // ps)), content) for tier, content in tags.items()},
            next_page=numbering.first_page,
            next_extent=numbering.first_extent,
            next_batch=numbering.first_batch,
            next_transfer=numbering.first_transfer,
            next_version=next_version,
        )


class Ledger(HandleChecks, Pages, Extents, Batches, Decode, Transfers, LedgerBase):
    """The bookkeeping of `LocalGPURuntime`, section by section as in the model."""

    def open_slot(self) -> tuple[int, Slot] | None:
        """Take the lowest free slot, at its current generation, with an empty row (None: all live)."""
        for slot_id, slot in enumerate(self.state.slots):
            if not slot.live:
                slot.live = True
                self.slot_changes += 1
                slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0
                slot.produced = slot.appended = 0
                slot.last_output = None
                return slot_id, slot
        return None

    def lose(self) -> None:
        """RuntimeLost: the machinery is gone; every call but info and restart raises RuntimeFault until restart."""
        self.state.lost = True

    def restart(self, failed: Iterable[int] = (), abandoned: bool = False, failures: collections.abc.Mapping[int, TransferFailure] | None = None) -> None:
        """A new epoch: every slot's generation moves past its live handle, everything else is forgotten.

        Version tags and memory contents carry over (as memory does). Every transfer in
        flight was drained by the device layer first: its copy landed (or failed: those of
        `failed`), so it completes here (its tags reach the destination's memory, as in the
        model), and is then forgotten with its epoch, unreported. After RuntimeLost
        (`abandoned`) nothing drained: the transfers in flight are forgotten as they are.
        """
        if not abandoned:
            self.complete_all(failed, failures)
        st = self.state
        generations = [slot.generation + int(slot.live) for slot in st.slots]
        tags = {tier: pool.tags for tier, pool in st.pools.items()}
        self.state = self.fresh_state(st.epoch + 1, generations, tags, st.next_version)
        self.state.faults = st.faults  # injections are the harness's, not the epoch's
        self.state.objects = st.objects  # the store outlives the runtime's epochs
        self.held = []

    def continue_lost(self, epoch: int, generations: list[int]) -> None:
        """Start at `epoch` with slot generations `generations`: the ledger of a new runtime process that
        replaces a lost one (`ProcessGPURuntime`), where control last saw the old one after its
        RuntimeLost and restart, so that no handle of an earlier epoch is valid again (H1, H2)."""
        if len(generations) != len(self.state.slots) or min(generations, default=0) < 0 or epoch < 0:
            raise ValueError(f"continue_lost needs an epoch >= 0 and {len(self.state.slots)} generations >= 0")
        st = self.state
        self.state = self.fresh_state(epoch, list(generations), {tier: pool.tags for tier, pool in st.pools.items()}, st.next_version)

    def abstract_state(self, tags: dict[Tier, list[int]], objects: dict[str, tuple[int, ...]] | None = None) -> AbstractState:
        """The state `probe()` shows, with `tags` as what each physical page holds and `objects` as
        what the store holds (the ledger's record of the objects when None)."""
        st, ps = self.state, self.page_size
        empty = (0,) * ps

        def copy_tags(page: Page, tier: Tier) -> tuple[int, ...]:
            if tier not in page.copies:
                return empty
            phys = page.copies[tier].phys
            return tuple(tags[tier][phys * ps : (phys + 1) * ps])

        def copy_state(page: Page, tier: Tier) -> CopyState:
            return page.copies[tier].state if tier in page.copies else CopyState.ABSENT

        pools = []
        for tier, pool in st.pools.items():
            mapped = tuple(sorted((c.phys, name) for name, page in st.pages.items() for t, c in page.copies.items() if t is tier))
            pools.append(PoolView(tier, pool.total, tuple(pool.free), mapped, tuple(sorted(pool.deferred))))
        prepared = [
            BatchView(b, rec.state, tuple(sorted(rec.slot_set)), tuple(p for s in sorted(rec.slot_set) for p in st.slots[s].pages))
            for b, rec in st.batches.items()
        ]
        finished = [BatchView(b, state, slots, ()) for b, (state, slots) in st.finished.items()]
        return AbstractState(
            epoch=st.epoch,
            page_size=ps,
            slots=tuple(SlotView(i, s.generation, s.live, tuple(s.pages), s.num_tokens, s.reserved_tokens) for i, s in enumerate(st.slots)),
            pages=tuple(
                PageView(
                    name,
                    page.holders,
                    copy_state(page, Tier.L1),
                    copy_state(page, Tier.L2),
                    tuple(page.versions),
                    copy_tags(page, Tier.L1),
                    copy_tags(page, Tier.L2),
                )
                for name, page in sorted(st.pages.items())
            ),
            pools=tuple(pools),
            extents=tuple(ExtentView(g, e.pages, e.refcount) for g, e in sorted(st.extents.items())),
            batches=tuple(sorted(prepared + finished, key=lambda view: view.batch_id)),
            transfers=tuple(
                TransferView(t, tr.kind, tuple(p for p, _, _ in tr.pages), tuple(s for _, s, _ in tr.pages), tuple(d for _, _, d in tr.pages if d >= 0))
                for t, tr in sorted(st.transfers.items())
            ),
            boundary_calls=tuple(sorted(st.calls.items())),
            objects=tuple(ObjectView(key, tags) for key, tags in sorted((st.objects if objects is None else objects).items())),
            page_keys=tuple(sorted(st.keys.items())),
        )
