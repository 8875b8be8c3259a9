"""probe() reads SGLang's own objects: an SGLang regression that aliases or leaks a page
breaks R1/R2/R4 at the call where it happens, not later when an allocation runs out.

Each test drives the adapter directly (no search) with a regression of `regressions.py`
injected into SGLang's live objects, and judges probe() with the catalogue's predicates
after every call, as the conformance suite does.
"""

from __future__ import annotations

import pytest
from _sglang_env import HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from cacheruntime import invariants
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Drop, Tier
from conformance.adapters.sglang import regressions

pytestmark = pytest.mark.needs_sglang


def _broken(rt) -> dict[str, list[str]]:
    state = rt.probe()
    found = {name: predicate(state) for name, predicate in invariants.STATE_INVARIANTS.items()}
    return {name: v for name, v in found.items() if v}


def _run(regression: str) -> list[tuple[str, dict[str, list[str]]]]:
    """A request computes two pages and publishes the first; the extent is backed up and its
    host copy dropped; the request finishes, the extent is released, a second request
    computes. Returns (call, invariants broken after it) for each call."""
    rt = regressions.make_runtime(regression, page_size=4, l1_pages=8, l2_pages=8)
    seen = []

    def step(call: str, thunk):
        value = thunk()
        seen.append((call, _broken(rt)))
        return value

    a = step("open_request", rt.open_request)
    step("execute_batch", lambda: rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),)))))
    ext = step("publish", lambda: rt.publish(a, 0, 1))
    step("submit backup", lambda: rt.submit((Backup(ext),)))
    step("submit drop", lambda: rt.submit((Drop(ext),)))
    step("close_request", lambda: rt.close_request(a))  # frees the row's second page (the first is the extent's)
    step("release", lambda: rt.release(ext))  # evicts the entry: free_segment of the first page
    b = step("open_request", rt.open_request)
    step("prepare_batch", lambda: rt.prepare_batch(BatchPlan((BatchItem(b, tuple(range(8))),))))
    return seen


def _first(seen) -> tuple[str, list[str]] | None:
    return next(((call, sorted(broken)) for call, broken in seen if broken), None)


def test_todays_sglang_keeps_every_state_invariant_on_probe():
    assert _first(_run(regressions.BASELINE)) is None


def test_probe_reads_the_allocators_free_list_and_the_rows():
    rt = regressions.make_runtime(regressions.BASELINE, page_size=4, l1_pages=8, l2_pages=8)
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),))))
    l1 = next(p for p in rt.probe().pools if p.tier is Tier.L1)
    assert len(l1.free) * rt.page_size == rt.sg.allocator.available_size()
    row = rt._request(a).row
    assert sorted(phys for phys, _ in l1.mapped) == sorted(
        p - 1 for p in rt.sg.req_to_token_pool.req_to_token[row, :8:4].div(4, rounding_mode="floor").tolist()
    )


@pytest.mark.parametrize(
    ("regression", "call", "ids"),
    [
        ("alloc_keeps_pages_free", "execute_batch", ["R1", "R2", "R4"]),  # the pages a row holds stay on the free list
        ("free_drops_pages", "close_request", ["R1"]),  # the row's pages are neither free nor held
        ("free_segment_drops_pages", "release", ["R1"]),  # the evicted entry's pages are lost
        ("host_free_twice", "submit drop", ["R1", "R4"]),  # a host page on the free list twice
    ],
)
def test_a_regression_breaks_the_invariant_at_the_call_where_it_happens(regression, call, ids):
    assert _first(_run(regression)) == (call, ids)
