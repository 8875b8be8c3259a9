"""Page-run algebra on concrete values: coalesce page names into runs, split, membership.

Extents name their pages as sorted, disjoint, maximal runs (`PageRun`). Splitting an
extent at a page boundary splits its run list. The Z3 checks prove these properties
for all inputs up to a bound on the same functions (see `cacheruntime.z3check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cacheruntime.protocol import PageRun


def coalesce(pages: Iterable[int]) -> tuple[PageRun, ...]:
    """Runs covering `pages` in their given order, merging each page that continues a run."""
    runs: list[PageRun] = []
    for page in pages:
        if runs and runs[-1].end == page:
            runs[-1] = PageRun(runs[-1].first_page, runs[-1].page_count + 1)
        else:
            runs.append(PageRun(page, 1))
    return tuple(runs)


def expand(runs: Sequence[PageRun]) -> tuple[int, ...]:
    """The page names the runs cover, in order."""
    return tuple(page for run in runs for page in range(run.first_page, run.end))


def split_runs(runs: Sequence[PageRun], at_page: int) -> tuple[tuple[PageRun, ...], tuple[PageRun, ...]]:
    """The runs of the first `at_page` pages and of the rest; the run containing the boundary is cut."""
    head: list[PageRun] = []
    tail: list[PageRun] = []
    seen = 0
    for run in runs:
        if seen + run.page_count <= at_page:
            head.append(run)
        elif seen >= at_page:
            tail.append(run)
        else:
            cut = at_page - seen
            head.append(PageRun(run.first_page, cut))
            tail.append(PageRun(run.first_page + cut, run.page_count - cut))
        seen += run.page_count
    return tuple(head), tuple(tail)


def contains(runs: Sequence[PageRun], page: int) -> bool:
    """Whether `page` lies in one of the runs."""
    return any(run.first_page <= page < run.end for run in runs)
