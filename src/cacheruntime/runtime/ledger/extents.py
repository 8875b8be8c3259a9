"""Extents and intents: publish, split, retain, release, close, and the tier intents (R3, R4, E1).

An extent is a run of page names control holds by reference; its pages keep one holder
for the extent while it lives. The tier intents (Backup, Demote, Drop) act on an
extent's pages; Restore is started by `transfers`, Close and Publish act on a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheruntime import pageruns
from cacheruntime.protocol import (
    Backup,
    BatchState,
    CacheExtentRef,
    Close,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    Fetch,
    Intent,
    InvalidPageRun,
    InvalidPlan,
    NotBackedUp,
    Persist,
    Publish,
    Release,
    RequestBusy,
    RequestRuntimeHandle,
    Restore,
    Tier,
    TierIntent,
    TransferKind,
    TransferTicket,
    WouldLoseData,
)
from cacheruntime.runtime.ledger.arguments import extent_fields, int_argument, intents_fields, request_fields
from cacheruntime.runtime.ledger.records import Extent, Slot, State

if TYPE_CHECKING:
    from cacheruntime.runtime.ledger.ledger import LedgerBase

    _Base = LedgerBase
else:
    _Base = object


class Extents(_Base):
    """Extents, their references, and the intents that act on them."""

    def new_extent(self, pages: tuple[int, ...]) -> CacheExtentRef:
        """Issue a ref with one reference over `pages` (whose holders the caller counted)."""
        st = self.state
        generation = st.next_extent
        st.next_extent = generation + self.numbering.stride
        runs = pageruns.coalesce(pages)
        st.extents[generation] = Extent(tuple(pages), 1, runs)
        self.txn.undo(lambda: _forget_extent(st, generation))
        return CacheExtentRef(self.runtime_id, st.epoch, generation, runs)

    def publish_pages(self, intent: Publish) -> CacheExtentRef:
        """Make full, computed pages of a row an extent with one reference."""
        request_fields(intent.request)
        int_argument("first_page", intent.first_page)
        int_argument("page_count", intent.page_count)
        slot = self.check_slot(intent.request)
        full = slot.num_tokens // self.page_size
        if intent.page_count < 1 or intent.first_page < 0 or intent.first_page + intent.page_count > full:
            raise InvalidPageRun(
                f"row pages [{intent.first_page}, {intent.first_page + intent.page_count}) are not inside the {full} full pages written so far"
            )
        pages = tuple(slot.pages[intent.first_page : intent.first_page + intent.page_count])
        for page in pages:
            self.add_holder(page)
        return self.new_extent(pages)

    def split_extent(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        """Retire the extent's only ref; issue refs for its first `at_page` pages and the rest."""
        extent_fields(extent)
        int_argument("at_page", at_page)
        record = self.check_extent(extent)
        if record.refcount != 1:
            raise ExtentShared(f"extent {extent.generation} has {record.refcount} references")
        if not 0 < at_page < len(record.pages):
            raise InvalidPageRun(f"split point {at_page} is not inside 1..{len(record.pages) - 1}")
        extents, generation = self.state.extents, extent.generation
        del extents[generation]
        self.txn.undo(lambda: extents.__setitem__(generation, record))
        return self.new_extent(record.pages[:at_page]), self.new_extent(record.pages[at_page:])

    def retain_extent(self, extent: CacheExtentRef) -> None:
        """Add a reference to a live extent."""
        extent_fields(extent)
        record = self.check_extent(extent)
        record.refcount += 1
        self.txn.undo(lambda: _add_refs(record, -1))

    def release_ref(self, generation: int) -> None:
        """An extent's reference count goes down; with the last, it ends and its pages lose a holder (R3, R4)."""
        extents = self.state.extents
        record = extents[generation]
        record.refcount -= 1
        self.txn.undo(lambda: _add_refs(record, 1))
        if record.refcount == 0:
            del extents[generation]
            self.txn.undo(lambda: extents.__setitem__(generation, record))
            for page in record.pages:
                self.drop_holder(page)

    def check_not_busy(self, request: RequestRuntimeHandle) -> None:
        """RequestBusy: a request in a prepared batch cannot close."""
        for b, rec in self.state.batches.items():
            if rec.state is BatchState.PREPARED and request.slot_id in rec.slot_set:
                raise RequestBusy(f"request in slot {request.slot_id} is in prepared batch {b}")

    def close_row(self, request: RequestRuntimeHandle) -> None:
        """Close the request's slot now; the row's pages go with their last holder (deferred if in flight)."""
        request_fields(request)
        slot = self.check_slot(request)
        self.check_not_busy(request)
        self.close_slot(slot)
        self.drop_row(slot, 0)
        lengths = (slot.num_tokens, slot.reserved_tokens)
        self.txn.undo(lambda: _set_lengths(slot, *lengths))
        slot.num_tokens = slot.reserved_tokens = 0

    def check_demote_unmapped(self, record: Extent) -> None:
        """ExtentInUse: Demote may not drop device copies a live row maps (E1, scenario 9)."""
        mine = set(record.pages)
        held = {p for slot in self.state.slots if slot.live and not mine.isdisjoint(slot.pages) for p in slot.pages} & mine
        if held:
            raise ExtentInUse(f"pages {sorted(held)} are mapped into live request rows")

    def apply_intent(self, intent: Intent) -> CacheExtentRef | TransferTicket | None:
        """Apply one non-restore intent now; Backup returns its ticket, Publish its ref."""
        st = self.state
        if isinstance(intent, Publish):
            return self.publish_pages(intent)
        if isinstance(intent, Close):
            self.close_row(intent.request)
            return None
        assert not isinstance(intent, Fetch), "a Fetch starts at prepare_batch (Batches.apply_plan), as a Restore does"
        self.check_intent_handles(intent)
        record = st.extents[intent.extent.generation]
        if isinstance(intent, Release):
            self.release_ref(intent.extent.generation)
            return None
        if isinstance(intent, Persist):
            return self.start_persist(intent, record.pages)
        if isinstance(intent, Backup):
            todo = [p for p in record.pages if Tier.L2 not in st.pages[p].copies]
            self.require_free(Tier.L2, len(todo))
            self.keep_dropping(record.pages, Tier.L2)
            return self.start_transfer(TransferKind.BACKUP, intent.extent.generation, todo)
        if isinstance(intent, Demote):
            for page in record.pages:
                if not self.has_copy(page, Tier.L2):
                    raise NotBackedUp(f"page {page} has no host copy and no backup in flight")
            self.check_demote_unmapped(record)
            for page in record.pages:
                self.drop_or_keep_until_landed(page, Tier.L1)
            return None
        if isinstance(intent, Drop):
            for page in record.pages:
                if not self.has_copy(page, Tier.L1):
                    raise WouldLoseData(f"page {page} has no device copy; dropping its host copy loses it")
            for page in record.pages:
                self.drop_or_keep_until_landed(page, Tier.L2)
            return None
        raise InvalidPlan(f"unknown intent {type(intent).__name__}")

    def submit(self, intents: tuple[TierIntent | Persist, ...]) -> tuple[TransferTicket, ...]:
        """Standalone tier intents: every handle first, then each intent in order; a ticket per Backup, Restore and Persist."""
        intents_fields("submit's intents", intents)
        for intent in intents:
            if isinstance(intent, Fetch):
                raise InvalidPlan("a Fetch fills a request's row: send it in the plan of that request's item")
            if not isinstance(intent, (Backup, Restore, Demote, Drop, Persist)):
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
            self.check_intent_handles(intent)
        tickets = []
        for intent in intents:
            if isinstance(intent, Restore):
                pages = self.restore_pages(intent.extent)
                self.require_free(Tier.L1, len(pages))
                tickets.append(self.start_restore(intent.extent, pages))
            else:
                outcome = self.apply_intent(intent)
                if isinstance(outcome, TransferTicket):
                    tickets.append(outcome)
        return tuple(tickets)


def _forget_extent(state: State, generation: int) -> None:
    del state.extents[generation]
    state.next_extent = generation


def _add_refs(record: Extent, count: int) -> None:
    record.refcount += count


def _set_lengths(slot: Slot, num_tokens: int, reserved_tokens: int) -> None:
    slot.num_tokens, slot.reserved_tokens = num_tokens, reserved_tokens
