"""The same plan object prepared again: the runtime remembers its validated handles only while they hold.

`prepare_batch` skips re-checking the item handles of a plan whose items tuple it validated
last, as long as no slot opened or closed and the epoch is the same (a decode loop prepares
one tuple step after step). Each test drives the runtime and the reference model with the
same calls (`Twin`), so a remembered check that should have failed shows as a divergence.
"""

from __future__ import annotations

import pytest
from runtimekit import PS, item, plan, step

from cacheruntime.protocol import BatchItem, BatchPlan, InvalidPlan, OutOfPages, StaleHandle


def test_a_reused_plan_decodes_step_after_step(twin):
    a, b = twin.open_request(), twin.open_request()
    step(twin, plan(item(a, PS), item(b, PS)))
    decode = plan(item(a, 1), item(b, 1))
    for _ in range(3 * PS):
        step(twin, decode)
    assert [twin.runtime.probe().slots[h.slot_id].num_tokens for h in (a, b)] == [4 * PS, 4 * PS]


def test_a_reused_plan_after_one_of_its_requests_closed_is_stale(twin):
    a, b = twin.open_request(), twin.open_request()
    decode = plan(item(a, 1), item(b, 1))
    step(twin, decode)
    twin.close_request(b)
    with pytest.raises(StaleHandle):
        twin.prepare_batch(decode)
    twin.open_request()  # b's slot again, one generation on
    with pytest.raises(StaleHandle):
        twin.prepare_batch(decode)
    step(twin, plan(item(a, 1)))


def test_a_reused_items_tuple_after_restart_is_stale(twin):
    a = twin.open_request()
    decode = plan(item(a, 1))
    step(twin, decode)
    twin.restart()
    with pytest.raises(StaleHandle):  # before any slot opens again: only the epoch differs
        twin.prepare_batch(decode)
    twin.open_request()
    with pytest.raises(StaleHandle):
        twin.prepare_batch(decode)


def test_a_reused_plan_still_checks_what_changes_every_step(twin):
    a = twin.open_request()
    tokens = twin.info().l1_pages * PS  # the row can hold every device page, and no more
    step(twin, plan(item(a, tokens - 1)))
    decode = plan(item(a, 1))
    step(twin, decode)
    with pytest.raises(OutOfPages):
        twin.prepare_batch(decode)


def test_items_shared_by_two_plans_keep_each_plans_intents_checked(twin):
    a = twin.open_request()
    decode = plan(item(a, 1))
    step(twin, decode)
    with pytest.raises(InvalidPlan):  # the same items with a duplicate: a different tuple, checked again
        twin.prepare_batch(BatchPlan(decode.items + decode.items))
    step(twin, decode)


def test_a_reused_list_of_items_is_checked_again_after_it_changes(twin):
    a, b = twin.open_request(), twin.open_request()
    items = [item(a, 1)]
    step(twin, BatchPlan(items))
    items.append(item(b, 1))  # the same list object, one item more
    done = step(twin, BatchPlan(items))
    assert [r.request for r in done.items] == [a, b]
    twin.close_request(b)
    with pytest.raises(StaleHandle):
        twin.prepare_batch(BatchPlan(items))


def test_reused_input_ids_that_grow_in_place_are_counted_again(twin):
    a = twin.open_request()
    ids = [1]
    decode = BatchPlan((BatchItem(a, ids),))
    step(twin, decode)
    ids.extend([2, 3])
    step(twin, decode)
    assert twin.runtime.probe().slots[a.slot_id].num_tokens == 4
