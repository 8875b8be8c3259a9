"""Page-run algebra: coalesce page names into runs, split a run list, membership.

Extents name their pages as runs (`PageRun`); splitting an extent at a page boundary
splits its run list. The algebra is written once over the `cacheruntime.ops` namespace, in
a fixed-shape form (`RunSlot`: one slot per input position, `valid` when it holds a run),
so that `cacheruntime.z3check` proves its properties for all inputs up to a bound on the
same code that `coalesce`, `split_runs` and `contains` run on values:

- `coalesce_slots(ops, pages)`: slot j starts a run iff page j does not continue page
  j-1; for distinct pages the runs cover exactly the pages, disjointly, and for sorted
  pages they are sorted and maximal.
- `split_slots(ops, slots, at_page)`: the slots of the first `at_page` pages and of the
  rest, the run holding the boundary cut in two.
- `contains_slots(ops, slots, page)`: whether a valid slot covers `page`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from cacheruntime.ops import CONCRETE
from cacheruntime.protocol import PageRun


@attrs.frozen
class RunSlot:
    """A run in fixed-shape form: `page_count` pages from `first_page`, if `valid`."""

    valid: Any
    first_page: Any
    page_count: Any


def coalesce_slots(ops: Any, pages: Sequence[Any]) -> tuple[RunSlot, ...]:
    """One slot per page: valid where the page starts a run, holding that run's length."""
    starts = [ops.BoolVal(True)] + [pages[j] != pages[j - 1] + 1 for j in range(1, len(pages))]
    length = [ops.IntVal(1)] * len(pages)  # pages from j to the end of j's run
    for j in range(len(pages) - 2, -1, -1):
        length[j] = 1 + ops.If(starts[j + 1], 0, length[j + 1])
    return tuple(RunSlot(starts[j], pages[j], length[j]) for j in range(len(pages)))


def split_slots(ops: Any, slots: Sequence[RunSlot], at_page: Any) -> tuple[tuple[RunSlot, ...], tuple[RunSlot, ...]]:
    """The slots of the first `at_page` pages and of the rest; the slot holding the boundary is cut."""
    head: list[RunSlot] = []
    tail: list[RunSlot] = []
    seen = ops.IntVal(0)
    for slot in slots:
        whole_head = seen + slot.page_count <= at_page
        whole_tail = ops.And(ops.Not(whole_head), seen >= at_page)
        cut = at_page - seen
        head.append(
            RunSlot(
                ops.And(slot.valid, ops.Not(whole_tail)),
                slot.first_page,
                ops.If(whole_head, slot.page_count, cut),
            )
        )
        tail.append(
            RunSlot(
                ops.And(slot.valid, ops.Not(whole_head)),
                ops.If(whole_tail, slot.first_page, slot.first_page + cut),
                ops.If(whole_tail, slot.page_count, slot.page_count - cut),
            )
        )
        seen = seen + ops.If(slot.valid, slot.page_count, 0)
    return tuple(head), tuple(tail)


def contains_slots(ops: Any, slots: Sequence[RunSlot], page: Any) -> Any:
    """Whether a valid slot covers `page`."""
    return ops.Or(*(ops.And(s.valid, s.first_page <= page, page < s.first_page + s.page_count) for s in slots))


def _runs(slots: Sequence[RunSlot]) -> tuple[PageRun, ...]:
    return tuple(PageRun(s.first_page, s.page_count) for s in slots if s.valid)


def _slots(runs: Sequence[PageRun]) -> tuple[RunSlot, ...]:
    return tuple(RunSlot(True, run.first_page, run.page_count) for run in runs)


def coalesce(pages: Iterable[int]) -> tuple[PageRun, ...]:
    """Runs covering `pages` in their given order, merging each page that continues a run."""
    return _runs(coalesce_slots(CONCRETE, tuple(pages)))


def expand(runs: Sequence[PageRun]) -> tuple[int, ...]:
    """The page names the runs cover, in order."""
    return tuple(page for run in runs for page in range(run.first_page, run.end))


def split_runs(runs: Sequence[PageRun], at_page: int) -> tuple[tuple[PageRun, ...], tuple[PageRun, ...]]:
    """The runs of the first `at_page` pages and of the rest; the run containing the boundary is cut."""
    head, tail = split_slots(CONCRETE, _slots(runs), at_page)
    return _runs(head), _runs(tail)


def contains(runs: Sequence[PageRun], page: int) -> bool:
    """Whether `page` lies in one of the runs."""
    return contains_slots(CONCRETE, _slots(runs), page)
