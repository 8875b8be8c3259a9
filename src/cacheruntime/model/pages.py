"""Pages and pools: page names, their holders and copies, and the physical free lists.

A page name lives while something holds it (a request row or an extent); its copies
take physical pages from their tier's free list and give them back when the last
holder goes, or later, once no transfer reads or writes them (O3).
"""

from __future__ import annotations

from cacheruntime.model.records import Copy, Page, State
from cacheruntime.protocol import CopyState, OutOfPages, Tier


class Pages:
    """The section that allocates and frees page names and physical pages."""

    state: State
    page_size: int

    def require_free(self, tier: Tier, needed: int) -> None:
        """OutOfPages unless `needed` physical pages of `tier` are free; checked before anything is taken."""
        free = len(self.state.pools[tier].free)
        if needed > free:
            raise OutOfPages(tier, needed, free)

    def take_phys(self, tier: Tier) -> int:
        """The physical page at the front of the tier's free list."""
        return self.state.pools[tier].free.pop(0)

    def new_pages(self, count: int) -> list[int]:
        """`count` new page names, one holder each, each with a valid device copy."""
        st = self.state
        names = []
        for _ in range(count):
            name, st.next_page = st.next_page, st.next_page + 1
            st.pages[name] = Page(
                holders=1,
                versions=[0] * self.page_size,
                copies={Tier.L1: Copy(self.take_phys(Tier.L1), CopyState.VALID)},
            )
            names.append(name)
        return names

    def transfers_on(self, tier: Tier, phys: int) -> set[int]:
        """In-flight transfers that read or write physical page `phys` of `tier`."""
        key = (tier, phys)
        return {t for t, tr in self.state.transfers.items() if key in tr.touched}

    def free_phys(self, tier: Tier, phys: int) -> None:
        """Return a physical page to its free list, or defer it while a transfer touches it (O3)."""
        blocking = self.transfers_on(tier, phys)
        if blocking:
            self.state.pools[tier].deferred[phys] = blocking
        else:
            self.state.pools[tier].free.append(phys)

    def drop_copy(self, name: int, tier: Tier) -> None:
        """The page loses its copy in `tier`; the physical page is freed."""
        copy_ = self.state.pages[name].copies.pop(tier)
        self.free_phys(tier, copy_.phys)

    def drop_holder(self, name: int) -> None:
        """The page loses a holder; with the last one its copies are freed and the name ends (R3, R4)."""
        page = self.state.pages[name]
        page.holders -= 1
        if page.holders == 0:
            for tier in list(page.copies):
                self.drop_copy(name, tier)
            del self.state.pages[name]
            self.state.keys.pop(name, None)
