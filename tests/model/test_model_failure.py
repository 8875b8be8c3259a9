"""The model's failure outcomes: bad arguments, a failed compute, and the finished-batch window.

spec/protocol.md §3 (arguments first), §4.5 (a failed batch; finished batches kept).
"""

from __future__ import annotations

import attrs
import pytest
from modelkit import PS, compute, extent, fails, free, item, new_model, plan

from cacheruntime.protocol import (
    FINISHED_BATCHES_KEPT,
    AlreadyExecuted,
    BatchItem,
    BatchPlan,
    BatchState,
    ComputeFailed,
    InvalidArgument,
    InvalidPlan,
    NotPrepared,
    PageRun,
    Publish,
    StaleHandle,
    Tier,
    UnknownHandle,
)

# --------------------------------------------------------------------------------------
# Arguments first
# --------------------------------------------------------------------------------------


def test_ill_typed_arguments_are_invalid_argument_and_change_nothing():
    m = new_model(vocab_size=50)
    h, x = extent(m, 2)
    fresh = m.open_request()
    cases = [
        (m.split, x, 1.5),
        (m.split, x, True),
        (m.publish, h, 0.0, 1),
        (m.publish, h, 0, "1"),
        (m.close_request, attrs.evolve(h, slot_id="0")),
        (m.close_request, attrs.evolve(h, generation=None)),
        (m.close_request, attrs.evolve(h, runtime_id=0)),
        (m.retain, attrs.evolve(x, page_runs=None)),
        (m.retain, attrs.evolve(x, page_runs=(PageRun(0, -2),))),
        (m.release, attrs.evolve(x, epoch=0.0)),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, (1,), None),))),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, None),))),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, (-1,)),))),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, (50,)),))),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, (1.0,)),))),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, (1,), (), 1),))),
        (m.prepare_batch, BatchPlan(None)),
        (m.prepare_batch, BatchPlan((None,))),
        (m.prepare_batch, BatchPlan((BatchItem(fresh, (1,)),), None)),
        (m.prepare_batch, plan(item(fresh, 1), intents=[Publish(h, 0.5, 1)])),
        (m.submit, None),
        (m.submit, attrs.evolve(x)),
    ]
    for fn, *args in cases:
        fails(m, InvalidArgument, fn, *args)
    assert m.info().vocab_size == 50


def test_arguments_are_checked_before_handles():
    m = new_model()
    _, x = extent(m, 2)
    m.release(x)
    fails(m, StaleHandle, m.split, x, 1)
    fails(m, InvalidArgument, m.split, x, 1.0)  # a stale ref and a float: the float is reported


def test_a_wrong_class_keeps_its_handle_or_plan_error():
    m = new_model()
    fails(m, UnknownHandle, m.close_request, "slot 0")
    fails(m, InvalidPlan, m.prepare_batch, "not a plan")
    fails(m, InvalidPlan, m.submit, ("backup",))


# --------------------------------------------------------------------------------------
# A failed compute
# --------------------------------------------------------------------------------------


def test_a_failed_batch_has_no_visible_effect_and_counts_as_a_call():
    m = new_model()
    h = m.open_request()
    compute(m, h, PS + 1)
    l1_free = free(m, Tier.L1)
    batch = m.prepare_batch(plan(item(h, PS), intents=[Publish(h, 0, 1)]))
    later = m.prepare_batch(plan(item(h, 1)))
    calls = dict(m.probe().boundary_calls)
    with pytest.raises(ComputeFailed) as error:
        m.fail_compute(batch)
    assert error.value.batches == (batch.batch_id, later.batch_id)
    view = m.probe()
    slot = view.slots[h.slot_id]
    assert (slot.num_tokens, slot.reserved_tokens) == (PS + 1, PS + 1)
    assert free(m, Tier.L1) == l1_free, "the failed batches' new pages were freed"
    assert not view.extents, "the Publish intent did not apply"
    assert {b.batch_id: b.state for b in view.batches}[batch.batch_id] is BatchState.FAILED
    assert dict(view.boundary_calls)["execute_batch"] == calls["execute_batch"] + 1
    fails(m, NotPrepared, m.execute_batch, batch)
    fails(m, NotPrepared, m.cancel_batch, later)
    m.check_invariants()
    done = compute(m, h, 1)
    assert done.items[0].num_tokens == PS + 2


def test_fail_compute_checks_execute_first():
    m = new_model()
    h = m.open_request()
    batch = m.prepare_batch(plan(item(h, 1)))
    m.execute_batch(batch)
    fails(m, AlreadyExecuted, m.fail_compute, batch)


# --------------------------------------------------------------------------------------
# The finished-batch window
# --------------------------------------------------------------------------------------


def test_the_oldest_finished_outcome_is_forgotten():
    m = new_model()
    h = m.open_request()
    batches = [m.prepare_batch(plan(item(h, 1))) for _ in range(2)]
    m.execute_batch(batches[0])
    m.cancel_batch(batches[1])
    for _ in range(FINISHED_BATCHES_KEPT - 1):
        m.cancel_batch(m.prepare_batch(plan(item(h, 1))))
    finished = [b for b in m.probe().batches if b.state is not BatchState.PREPARED]
    assert len(finished) == FINISHED_BATCHES_KEPT and finished[0].batch_id == batches[1].batch_id
    fails(m, StaleHandle, m.execute_batch, batches[0])
    fails(m, NotPrepared, m.cancel_batch, batches[1])
    fails(m, UnknownHandle, m.execute_batch, attrs.evolve(batches[0], batch_id=10**6))
