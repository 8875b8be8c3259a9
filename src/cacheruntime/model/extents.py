"""Extents and intents: publishing row pages, closing rows, references, and applying intents.

An extent is a run of page names with a reference count; each of its pages counts the
extent as one holder. Intents (Publish, Close, Backup, Demote, Drop, Release) apply
here, in a plan's order at execute or one by one in `submit`; Restore starts at
prepare (`cacheruntime.model.batches`).
"""

from __future__ import annotations

from cacheruntime import pageruns
from cacheruntime.model.handles import HandleChecks
from cacheruntime.model.records import Copy, Extent, Slot
from cacheruntime.model.transfers import Transfers
from cacheruntime.protocol import (
    Backup,
    CacheExtentRef,
    Close,
    CopyState,
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
    Tier,
    TransferKind,
    TransferTicket,
    WouldLoseData,
)


class Extents(Transfers, HandleChecks):
    """The section that makes, splits, references and ends extents, and applies intents."""

    def new_extent(self, pages: tuple[int, ...]) -> CacheExtentRef:
        """A new extent over `pages` with one reference, and its ref."""
        st = self.state
        generation, st.next_extent = st.next_extent, st.next_extent + 1
        runs = pageruns.coalesce(pages)
        st.extents[generation] = Extent(tuple(pages), 1, runs)
        return CacheExtentRef(self.runtime_id, st.epoch, generation, runs)

    def publish_pages(self, intent: Publish) -> CacheExtentRef:
        """Publish: full pages of a request's row become an extent; each page gains a holder."""
        slot = self.check_slot(intent.request)
        full = slot.num_tokens // self.page_size
        if intent.page_count < 1 or intent.first_page < 0 or intent.first_page + intent.page_count > full:
            raise InvalidPageRun(
                f"row pages [{intent.first_page}, {intent.first_page + intent.page_count}) are not inside the {full} full pages written so far"
            )
        pages = tuple(slot.pages[intent.first_page : intent.first_page + intent.page_count])
        for page in pages:
            self.state.pages[page].holders += 1
        return self.new_extent(pages)

    def check_not_busy(self, request: RequestRuntimeHandle) -> None:
        """RequestBusy while a prepared batch holds the request."""
        for b, rec in self.state.batches.items():
            if request.slot_id in rec.slot_set:
                raise RequestBusy(f"request in slot {request.slot_id} is in prepared batch {b}")

    def close_slot(self, slot: Slot) -> None:
        """The slot is closed: not live, and at a new generation, so every handle to it is stale (H2)."""
        slot.live = False
        slot.generation += 1

    def close_row(self, request: RequestRuntimeHandle) -> None:
        """CloseRequest and the Close intent: close the slot now; the row's pages lose it as a holder."""
        slot = self.check_slot(request)
        self.check_not_busy(request)
        self.close_slot(slot)
        for page in slot.pages:
            self.drop_holder(page)
        slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0

    def split_extent(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        """Split: end the extent's only ref and make extents of its first `at_page` pages and of the rest."""
        record = self.check_extent(extent)
        if record.refcount != 1:
            raise ExtentShared(f"extent {extent.generation} has {record.refcount} references")
        if not 0 < at_page < len(record.pages):
            raise InvalidPageRun(f"split point {at_page} is not inside 1..{len(record.pages) - 1}")
        del self.state.extents[extent.generation]
        head = self.new_extent(record.pages[:at_page])
        tail = self.new_extent(record.pages[at_page:])
        return head, tail

    def retain_extent(self, extent: CacheExtentRef) -> None:
        """Retain: one more reference to a live extent."""
        self.check_extent(extent).refcount += 1

    def release_ref(self, generation: int) -> None:
        """One reference fewer; with the last one the extent ends and its pages lose it as a holder (R3)."""
        record = self.state.extents[generation]
        record.refcount -= 1
        if record.refcount == 0:
            del self.state.extents[generation]
            for page in record.pages:
                self.drop_holder(page)

    def has_copy(self, page: int, tier: Tier) -> bool:
        """Whether the page has a copy in `tier` that control may count on: valid or filling, not dropping."""
        copy_ = self.state.pages[page].copies.get(tier)
        return copy_ is not None and copy_.state is not CopyState.DROPPING

    def drop_or_keep_until_landed(self, page: int, tier: Tier) -> None:
        """Demote (tier L1) or Drop (L2) of one page: drop its copy in `tier` now if the other
        tier's copy is valid, else (the other copy still filling) mark it DROPPING, kept until
        that transfer lands and VALID again if it fails (write-back loses nothing, F1)."""
        copies = self.state.pages[page].copies
        copy_ = copies.get(tier)
        if copy_ is None or copy_.state is CopyState.DROPPING:
            return
        other = copies[Tier.L2 if tier is Tier.L1 else Tier.L1]
        if other.state is CopyState.FILLING:
            copies[tier] = Copy(copy_.phys, CopyState.DROPPING)
        else:
            self.drop_copy(page, tier)

    def check_demote_unmapped(self, record: Extent) -> None:
        """ExtentInUse if a live request row maps a page of the extent (E1)."""
        held = {p for slot in self.state.slots if slot.live for p in slot.pages} & set(record.pages)
        if held:
            raise ExtentInUse(f"pages {sorted(held)} are mapped into live request rows")

    def apply_intent(self, intent: Intent) -> CacheExtentRef | TransferTicket | None:
        """Apply one intent that is neither Restore nor Fetch now; Backup and Persist return their ticket, Publish its ref."""
        st = self.state
        if isinstance(intent, Publish):
            return self.publish_pages(intent)
        if isinstance(intent, Close):
            self.close_row(intent.request)
            return None
        assert not isinstance(intent, Fetch), "a Fetch starts at prepare_batch (Batches.prepare), as a Restore does"
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
