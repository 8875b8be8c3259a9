"""Pages and pools: page names with their holders and copies, free lists, deferred frees (R1-R4, O3).

A page name lives while something holds it (a row or an extent); when its last holder
goes, each of its copies' physical pages is freed. A physical page that a transfer not
yet completed reads or writes is not freed at once: its free is deferred until that
transfer completes (O3), which `transfers.complete_transfer` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cacheruntime.protocol import CopyState, OutOfPages, Tier
from cacheruntime.runtime.ledger.records import DROPPING, FILLING, VALID, Copy, Page, Slot, State, touch_key

if TYPE_CHECKING:
    from cacheruntime.runtime.ledger.ledger import LedgerBase

    _Base = LedgerBase
else:
    _Base = object

#: `Copy(phys, state)` without the NamedTuple's Python `__new__` (a decode step makes many).
new_copy = tuple.__new__


class Pages(_Base):
    """Page names, holders, and the physical pages behind them."""

    def require_free(self, tier: Tier, needed: int) -> None:
        """OutOfPages before anything is allocated."""
        free = len(self.state.pools[tier].free)
        if needed > free:
            raise OutOfPages(tier, needed, free)

    def take_phys(self, tier: Tier, count: int) -> list[int]:
        """`count` physical pages of `tier` off its free list (the caller checked there are enough)."""
        taken, put_back = self.allocator.take(self.state.pools[tier].free, count)
        if self.txn.journal is not None:
            self.txn.journal.append(put_back)
        return taken

    def new_pages(self, count: int) -> tuple[range, list[int]]:
        """`count` new page names, each with one holder and a valid device copy: (names, their device pages).

        The device pages come off the free list in one take, in the order the names are
        given, so a step that opens many pages pays one allocator call.
        """
        st = self.state
        first, stride = st.next_page, self.numbering.stride
        phys = self.take_phys(Tier.L1, count)
        names = range(first, first + count * stride, stride)
        st.next_page = names.stop
        pages, no_versions, l1 = st.pages, self.no_versions, Tier.L1
        for name, location in zip(names, phys):
            pages[name] = Page(1, no_versions[:], {l1: new_copy(Copy, (location, VALID))})
        self.txn.undo(lambda: _forget_pages(st, names))
        return names, phys

    def transfers_on(self, tier: Tier, phys: int) -> set[int]:
        """Transfers not yet completed that read or write physical page `phys` of `tier`."""
        transfers = self.state.transfers
        if not transfers:
            return set()
        key = touch_key(tier, phys)
        return {t for t, tr in transfers.items() if key in tr.touched}

    def free_phys(self, tier: Tier, phys: int) -> None:
        """Free a physical page, or defer its free while a transfer touches it (O3)."""
        pool = self.state.pools[tier]
        blocking = self.transfers_on(tier, phys)
        journal = self.txn.journal
        if blocking:
            pool.deferred[phys] = blocking
            if journal is not None:
                journal.append(lambda: pool.deferred.pop(phys))
        else:
            pool.free.append(phys)
            if journal is not None:
                journal.append(pool.free.pop)

    def drop_copy(self, name: int, tier: Tier) -> None:
        """Page `name` loses its `tier` copy, whose physical page is freed."""
        copies = self.state.pages[name].copies
        copy = copies.pop(tier)
        self.txn.undo(lambda: copies.__setitem__(tier, copy))
        self.free_phys(tier, copy.phys)

    def drop_holder(self, name: int) -> None:
        """A page name loses a holder; with its last, its copies are freed and the name ends (R3, R4)."""
        pages = self.state.pages
        page = pages[name]
        page.holders -= 1
        self.txn.undo(lambda: _add_holders(page, 1))
        if page.holders == 0:
            for tier in list(page.copies):
                self.drop_copy(name, tier)
            del pages[name]
            self.txn.undo(lambda: pages.__setitem__(name, page))
            keys = self.state.keys
            if name in keys:
                key = keys.pop(name)
                self.txn.undo(lambda: keys.__setitem__(name, key))

    def add_holder(self, name: int) -> None:
        """A page name gains a holder (an extent published over it, a row attaching it)."""
        page = self.state.pages[name]
        page.holders += 1
        self.txn.undo(lambda: _add_holders(page, -1))

    def drop_row(self, slot: Slot, keep: int) -> None:
        """The row keeps its first `keep` pages; the rest lose the row as a holder."""
        for page in slot.pages[keep:]:
            self.drop_holder(page)
        dropped = slot.pages[keep:]
        self.txn.undo(lambda: slot.pages.extend(dropped))
        del slot.pages[keep:]

    def has_copy(self, name: int, tier: Tier) -> bool:
        """Whether page `name` has a `tier` copy control may count on: valid or filling, not dropping."""
        copy = self.state.pages[name].copies.get(tier)
        return copy is not None and copy.state is not DROPPING

    def drop_or_keep_until_landed(self, name: int, tier: Tier) -> None:
        """Demote (tier L1) or Drop (L2) of one page: its `tier` copy goes now if the other tier's
        copy is valid; while that one is still filling it is kept, DROPPING, until the transfer
        lands (and is VALID again if it fails), so write-back never leaves a page unreadable (F1)."""
        copies = self.state.pages[name].copies
        copy = copies.get(tier)
        if copy is None or copy.state is DROPPING:
            return
        if copies[Tier.L2 if tier is Tier.L1 else Tier.L1].state is FILLING:
            self.set_copy_state(copies, tier, DROPPING)
        else:
            self.drop_copy(name, tier)

    def keep_dropping(self, names: tuple[int, ...], tier: Tier) -> None:
        """A restore (tier L1) or backup (L2) keeps the pages' DROPPING copies: VALID again, nothing moves."""
        pages = self.state.pages
        for name in names:
            copies = pages[name].copies
            copy = copies.get(tier)
            if copy is not None and copy.state is DROPPING:
                self.set_copy_state(copies, tier, VALID)

    def set_copy_state(self, copies: dict[Tier, Copy], tier: Tier, state: CopyState) -> None:
        """Replace one copy by the same physical page in `state`; journaled."""
        old = copies[tier]
        copies[tier] = new_copy(Copy, (old.phys, state))
        self.txn.undo(lambda: copies.__setitem__(tier, old))


def _add_holders(page: Page, count: int) -> None:
    page.holders += count


def _forget_pages(state: State, names: range) -> None:
    for name in names:
        del state.pages[name]
    state.next_page = names.start
