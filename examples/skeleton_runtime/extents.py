"""Extents: immutable runs of full pages that control keeps as refs (spec §4.7-4.10).

An extent holds each of its pages once (a holder, R3); a split hands those holders to
the two halves unchanged, so releasing both halves frees the original pages exactly once.
A generation is never reused within an epoch, which is how an ended ref stays stale.
"""

from __future__ import annotations

from cacheruntime.protocol import CacheExtentRef, ExtentShared, InvalidPageRun, RequestRuntimeHandle

from .handles import check_extent, check_request
from .ledger import Extent, Ledger
from .pages import drop_holder, runs_of


def ref_for(ledger: Ledger, generation: int) -> CacheExtentRef:
    """The ref control holds for a live extent."""
    return CacheExtentRef(ledger.runtime_id, ledger.epoch, generation, runs_of(ledger.extents[generation].pages))


def new_extent(ledger: Ledger, pages: tuple[int, ...]) -> CacheExtentRef:
    """A new extent with one reference over `pages` (holders are the caller's business)."""
    generation = ledger.next_extent
    ledger.next_extent += 1
    ledger.extents[generation] = Extent(pages, refcount=1)
    return ref_for(ledger, generation)


def publish(ledger: Ledger, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
    """Full, computed pages of a row become an extent; each page gains a holder."""
    slot = check_request(ledger, request)
    full = slot.num_tokens // ledger.page_size
    if page_count < 1 or first_page < 0 or first_page + page_count > full:
        raise InvalidPageRun(f"pages [{first_page}, {first_page + page_count}) are not inside the row's {full} full computed pages")
    pages = tuple(slot.pages[first_page : first_page + page_count])
    for page in pages:
        ledger.pages[page].holders += 1
    return new_extent(ledger, pages)


def split(ledger: Ledger, ref: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
    """The extent ends and two new ones cover its first `at_page` pages and the rest."""
    extent = check_extent(ledger, ref)
    if extent.refcount != 1:
        raise ExtentShared(f"extent {ref.generation} has {extent.refcount} references")
    if not 0 < at_page < len(extent.pages):
        raise InvalidPageRun(f"split point {at_page} is not inside the extent's {len(extent.pages)} pages")
    del ledger.extents[ref.generation]
    return new_extent(ledger, extent.pages[:at_page]), new_extent(ledger, extent.pages[at_page:])


def retain(ledger: Ledger, ref: CacheExtentRef) -> None:
    """One more reference."""
    check_extent(ledger, ref).refcount += 1


def release(ledger: Ledger, ref: CacheExtentRef) -> None:
    """One reference less; the last one ends the extent and each page loses a holder."""
    extent = check_extent(ledger, ref)
    extent.refcount -= 1
    if extent.refcount == 0:
        del ledger.extents[ref.generation]
        for page in extent.pages:
            drop_holder(ledger, page)
