"""The one-token fast paths of `prepare_batch` and `execute_batch` against the reference model.

A decode step takes its own path: every reservation grows by one token, only the rows
whose new token opens a page get one (found from the page offsets, all pages taken in one
allocator call), and execute writes each item's tag at its start position. Each test drives
the runtime and the model with the same calls (`Twin`), so a page handed out in another
order, a tag written to the wrong page or a check skipped shows as a divergence.
"""

from __future__ import annotations

import pytest
from runtimekit import PS, Twin, fails, item, plan, step

from cacheruntime.protocol import BatchPlan, OutOfPages, RowFull
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime


def test_rows_that_open_pages_in_one_step_get_them_in_plan_order(twin):
    a, b, c = twin.open_request(), twin.open_request(), twin.open_request()
    step(twin, plan(item(a, 1), item(b, 2), item(c, PS)))
    decode = plan(item(c, 1), item(a, 1), item(b, 1))  # plan order is not slot order
    for _ in range(2 * PS + 1):
        done = step(twin, decode)
    assert [r.request for r in done.items] == [c, a, b]
    # c and b opened their pages together in several steps: the model's allocator order holds
    rows = twin.runtime.probe().slots
    assert [rows[h.slot_id].num_tokens for h in (a, b, c)] == [1 + 2 * PS + 1, 2 + 2 * PS + 1, PS + 2 * PS + 1]


def test_a_decode_step_short_of_pages_for_its_opening_rows_changes_nothing(twin):
    a, b, c, d = (twin.open_request() for _ in range(4))
    step(twin, plan(item(a, 2 * PS), item(b, 2 * PS), item(c, 2 * PS)))  # full pages: the next token opens one
    free = twin.info().l1_pages - 6
    step(twin, plan(item(d, (free - 1) * PS)))  # one device page left for three opening rows
    decode = plan(item(a, 1), item(b, 1), item(c, 1))
    error = fails(twin.runtime, OutOfPages, twin.runtime.prepare_batch, decode)
    assert (error.needed, error.free) == (3, 1)
    with pytest.raises(OutOfPages):
        twin.prepare_batch(decode)
    twin.close_request(d)
    step(twin, decode)


def test_a_decode_step_past_the_row_size_is_refused(device):
    twin = Twin(LocalGPURuntime(device=device, **{**CONFORMANCE_OPTIONS, "l1_pages": 20}))  # pages for a full row
    try:
        a, b = twin.open_request(), twin.open_request()
        step(twin, plan(item(a, twin.info().max_request_tokens), item(b, 1)))
        with pytest.raises(RowFull):
            twin.prepare_batch(plan(item(b, 1), item(a, 1)))
        step(twin, plan(item(b, 1)))
    finally:
        twin.runtime.close()


def test_steps_prepared_ahead_write_their_tags_at_their_own_positions(twin):
    a, b = twin.open_request(), twin.open_request()
    step(twin, plan(item(a, 1), item(b, PS)))
    decode = plan(item(a, 1), item(b, 1))
    first = twin.prepare_batch(decode)
    second = twin.prepare_batch(decode)  # opens a's second page before the first step ran
    third = twin.prepare_batch(decode)
    for handle in (first, second, third):
        twin.execute_batch(handle)


def test_a_decode_step_of_a_list_plan_takes_the_same_path(twin):
    a, b = twin.open_request(), twin.open_request()
    step(twin, plan(item(a, PS), item(b, 1)))
    items = [item(b, 1), item(a, 1)]
    for _ in range(PS + 1):
        step(twin, BatchPlan(items))


def test_prefill_growing_several_pages_per_row_next_to_an_attach(twin):
    h = twin.open_request()
    step(twin, plan(item(h, 2 * PS)))
    extent = twin.publish(h, 0, 2)
    x, y = twin.open_request(), twin.open_request()
    step(twin, plan(item(x, 2 * PS + 1), item(y, PS + 1, attach=(extent,))))
    step(twin, plan(item(y, 1), item(x, 1)))


def test_finished_batches_report_their_slots_sorted_whatever_the_plan_order(twin):
    a, b = twin.open_request(), twin.open_request()
    step(twin, plan(item(b, 1), item(a, 1)))
    step(twin, plan(item(a, 1), item(b, 1)))
    twin.cancel_batch(twin.prepare_batch(plan(item(b, 1))))
    step(twin, plan(item(b, 1), item(a, 1)))
    views = twin.runtime.probe().batches
    assert [(v.state, v.slots) for v in views] == [("executed", (0, 1))] * 2 + [("cancelled", (1,)), ("executed", (0, 1))]
