"""The contract's freedoms as constructor options: each one changes what it should, and nothing else.

A runtime built with another free-page order, another numbering or later completion
reports serves the same conversation: every next token equals a recomputation without
any cache (D1 on the real bytes of the tiny runner), every completion is reported exactly
once, and the values the option governs do differ from the defaults (so the option is
not ignored).
"""

from __future__ import annotations

import pytest

from cacheruntime.invariants import check_state
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Restore
from cacheruntime.runtime.ledger import FreeOrder, Numbering, Reporting
from cacheruntime.runtime.local import LocalGPURuntime

OPTIONS = {"page_size": 4, "max_requests": 4, "max_request_tokens": 64, "l1_pages": 24, "l2_pages": 24}
PROMPT = tuple(range(3, 19))  # four full pages


def serve(rt: LocalGPURuntime) -> dict:
    """A prefix computed, published, backed up, demoted, then restored under a second request's decode steps."""
    reported: list[int] = []
    polls: list[int] = []
    seen = {"phys": [], "pages": [], "extents": [], "batches": [], "transfers": []}

    def poll() -> None:
        done = rt.poll_completions()
        polls.append(len(done))
        reported.extend(c.ticket.transfer_id for c in done)

    def step(plan: BatchPlan, tokens: list[int]) -> int:
        batch = rt.prepare_batch(plan)
        seen["batches"].append(batch.batch_id)
        done = rt.execute_batch(batch)
        token = done.items[0].next_token
        assert token == rt.reference_next_token(tokens), f"D1: the served token differs from a recomputation of {tokens}"
        poll()
        return token

    first = rt.open_request()
    step(BatchPlan((BatchItem(first, PROMPT),)), list(PROMPT))
    prefix = rt.publish(first, 0, 4)
    seen["extents"].append(prefix.generation)
    seen["pages"] += [p for run in prefix.page_runs for p in range(run.first_page, run.first_page + run.page_count)]
    seen["phys"] += [slot_pages for slot_pages in rt.probe().pools[0].mapped]
    (backup,) = rt.submit((Backup(prefix),))
    seen["transfers"].append(backup.transfer_id)
    reported.extend(c.ticket.transfer_id for c in rt.wait_completions())
    rt.close_request(first)
    rt.submit((Demote(prefix),))
    second = rt.open_request()
    tokens = [*PROMPT, 7]
    plan = BatchPlan((BatchItem(second, (7,), (prefix,)),), (Restore(prefix),))
    batch = rt.prepare_batch(plan)
    seen["batches"].append(batch.batch_id)
    restore = rt.probe().transfers[0].transfer_id
    seen["transfers"].append(restore)
    token = rt.execute_batch(batch).items[0].next_token
    assert token == rt.reference_next_token(tokens)
    for _ in range(6):
        poll()
        tokens.append(token)
        token = step(BatchPlan((BatchItem(second, (token,)),)), tokens)
    reported.extend(c.ticket.transfer_id for c in rt.wait_completions())
    check_state(rt.probe())
    rt.close()
    return {"reported": reported, "polls": polls, **seen}


@pytest.fixture(scope="module")
def default() -> dict:
    return serve(LocalGPURuntime(**OPTIONS))


@pytest.mark.parametrize("order", [FreeOrder.LIFO, FreeOrder.RANDOM])
def test_another_free_page_order_serves_the_same_tokens_from_other_pages(order, default):
    served = serve(LocalGPURuntime(**OPTIONS, free_order=order, seed=3))
    assert sorted(served["reported"]) == sorted(default["reported"])
    assert served["phys"] != default["phys"]


def test_another_numbering_names_pages_and_ids_its_own_way(default):
    numbering = Numbering(first_page=100, first_extent=7, first_batch=40, first_transfer=9, stride=3)
    served = serve(LocalGPURuntime(**OPTIONS, numbering=numbering))
    assert served["pages"] == [100 + 3 * i for i in range(4)]
    assert served["extents"] == [7]
    assert served["batches"] == [40 + 3 * i for i in range(8)]
    assert served["transfers"] == [9, 12]
    assert sorted(served["reported"]) == [9, 12]


@pytest.mark.parametrize("reporting", [Reporting.NEXT_POLL, Reporting.AT_WAIT])
def test_later_reports_report_every_completion_once(reporting, default):
    served = serve(LocalGPURuntime(**OPTIONS, reporting=reporting))
    assert sorted(served["reported"]) == sorted(default["reported"]) == [0, 1]
    if reporting is Reporting.AT_WAIT:
        assert not any(served["polls"])


def test_a_bad_choice_is_refused():
    with pytest.raises(ValueError):
        LocalGPURuntime(**OPTIONS, free_order="sideways")
    with pytest.raises(ValueError):
        Numbering(stride=0)


def test_a_failed_call_under_random_placement_changes_nothing():
    """A random take puts each page back exactly where it was: a failed submit leaves the free lists as they were."""
    from runtimekit import PS, comparable, item, plan

    from cacheruntime.invariants import check_state
    from cacheruntime.protocol import Drop, ExtentInUse
    from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS

    rt = LocalGPURuntime(**{**CONFORMANCE_OPTIONS, "free_order": "random", "seed": 7})
    h = rt.open_request()
    rt.execute_batch(rt.prepare_batch(plan(item(h, 4 * PS))))
    x = rt.publish(h, 0, 4)
    rt.submit((Backup(x),))
    rt.wait_completions()
    before = rt.probe()
    with pytest.raises(ExtentInUse):
        rt.submit((Drop(x), Backup(x), Demote(x)))  # the Demote fails after the Drop freed and the Backup took host pages
    after = rt.probe()
    assert comparable(after) == comparable(before)
    check_state(after)
    rt.close()
