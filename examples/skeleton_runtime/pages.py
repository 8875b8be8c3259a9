"""Page names and the physical pages behind them (spec §1 "Page names", §3 "Holders").

A page name is logical: it keeps its identity while its copies come and go in the two
pools. It lives while something holds it (a row that maps it, an extent that contains
it) and ends with its last holder; its copies' physical pages then go back to their
free lists, unless an in-flight transfer still reads or writes them: those wait, as
deferred frees, for the completion of the last transfer touching them (O3).
"""

from __future__ import annotations

from cacheruntime.protocol import CopyState, PageRun, Tier

from .ledger import DIRECTION, Copy, Ledger, Page


def runs_of(pages: tuple[int, ...]) -> tuple[PageRun, ...]:
    """Page names as runs, in their given (row) order: a name that continues the run before it joins it."""
    runs: list[PageRun] = []
    for page in pages:
        if runs and runs[-1].end == page:
            runs[-1] = PageRun(runs[-1].first_page, runs[-1].page_count + 1)
        else:
            runs.append(PageRun(page, 1))
    return tuple(runs)


def take_phys(ledger: Ledger, tier: Tier, count: int) -> list[int]:
    """Physical pages from the front of a free list; the caller has checked there are enough."""
    free = ledger.pools[tier].free
    return [free.popleft() for _ in range(count)]


def touched(ledger: Ledger, tier: Tier, phys: int) -> bool:
    """Whether an in-flight transfer reads or writes this physical page."""
    for transfer in ledger.transfers.values():
        source, destination = DIRECTION[transfer.ticket.kind]
        for _, src, dst in transfer.moves:
            if (source, src) == (tier, phys) or (destination, dst) == (tier, phys):
                return True
    return False


def free_phys(ledger: Ledger, tier: Tier, phys: int) -> None:
    """Give a physical page back, or defer it while a transfer touches it."""
    pool = ledger.pools[tier]
    if touched(ledger, tier, phys):
        pool.deferred.append(phys)
    else:
        pool.free.append(phys)


def new_pages(ledger: Ledger, count: int) -> list[int]:
    """Name `count` new pages, each with a valid device copy and one holder (the row they are for)."""
    names = []
    for phys in take_phys(ledger, Tier.L1, count):
        name = ledger.next_page
        ledger.next_page += 1
        ledger.pages[name] = Page(holders=1, versions=[0] * ledger.page_size, copies={Tier.L1: Copy(phys, CopyState.VALID)})
        names.append(name)
    return names


def drop_copy(ledger: Ledger, name: int, tier: Tier) -> None:
    """A page name stops having a copy in `tier` (if it had one)."""
    copy = ledger.pages[name].copies.pop(tier, None)
    if copy is not None:
        free_phys(ledger, tier, copy.phys)


def drop_holder(ledger: Ledger, name: int) -> None:
    """A page name loses a holder; with the last one it ends and its copies are freed."""
    page = ledger.pages[name]
    page.holders -= 1
    if page.holders == 0:
        for tier in Tier:
            drop_copy(ledger, name, tier)
        del ledger.pages[name]
