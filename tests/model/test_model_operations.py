"""Unit tests: each operation of the reference model and each typed error it raises.

Every failing call goes through `modelkit.fails`, which checks the exact error type and
that the model state (deep copy) and the abstract state (`probe()`) are unchanged.
References: spec/protocol.md §3 (handle checks and their order) and §4 (operations).
"""

from __future__ import annotations

import attrs
import pytest
from modelkit import PS, compute, extent, fails, foreign, free, item, new_model, page_view, plan

from cacheruntime.invariants import B2_plain_values
from cacheruntime.pageruns import expand
from cacheruntime.protocol import (
    AlreadyExecuted,
    Backup,
    BatchDependency,
    BatchItem,
    BatchPlan,
    BatchState,
    Capability,
    Close,
    ComputeFailed,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    FaultKind,
    ForeignRuntime,
    InvalidArgument,
    InvalidPageRun,
    InvalidPlan,
    NoL2,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfOrder,
    OutOfPages,
    OutOfSlots,
    PageRun,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestBusy,
    RequestRuntimeHandle,
    Restore,
    RowFull,
    RuntimeFault,
    StaleHandle,
    Tier,
    TransferFailure,
    TransferKind,
    UnknownHandle,
    WouldLoseData,
    tag_digest,
)

# --------------------------------------------------------------------------------------
# 4.1 info
# --------------------------------------------------------------------------------------


def test_info_reports_identity_sizes_and_claims():
    m = new_model(runtime_id="rt", max_requests=3, max_request_tokens=32, l1_pages=9, l2_pages=5)
    info = m.info()
    assert (info.runtime_id, info.epoch, info.page_size, info.max_requests, info.max_request_tokens) == ("rt", 0, PS, 3, 32)
    assert (info.l1_pages, info.l2_pages) == (9, 5)
    assert {Capability.L2, Capability.RESTART, Capability.INTROSPECTION, Capability.ASYNC_TRANSFERS} <= info.capabilities
    assert not B2_plain_values(info)


def test_info_without_l2_does_not_claim_l2():
    assert Capability.L2 not in new_model(l2_pages=0).info().capabilities


# --------------------------------------------------------------------------------------
# 4.2 open_request / 4.3 close_request
# --------------------------------------------------------------------------------------


def test_open_takes_lowest_free_slot_at_current_generation():
    m = new_model(max_requests=3)
    hs = [m.open_request() for _ in range(3)]
    assert [(h.slot_id, h.generation, h.epoch, h.runtime_id) for h in hs] == [(i, 0, 0, "model") for i in range(3)]
    m.close_request(hs[1])
    h = m.open_request()
    assert (h.slot_id, h.generation) == (1, 1)


def test_open_out_of_slots_changes_nothing():
    m = new_model(max_requests=2)
    m.open_request(), m.open_request()
    fails(m, OutOfSlots, m.open_request)


def test_close_bumps_generation_and_frees_row_pages():
    m = new_model()
    h = m.open_request()
    compute(m, h, 5)  # 2 pages
    assert free(m, Tier.L1) == 14
    m.close_request(h)
    view = m.probe().slots[0]
    assert (view.live, view.generation, view.pages) == (False, 1, ())
    assert free(m, Tier.L1) == 16 and m.probe().pages == ()
    m.check_invariants()


def test_close_keeps_pages_an_extent_holds():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    assert [p.holders for p in m.probe().pages] == [1, 1]
    m.release(x)
    assert free(m, Tier.L1) == 16


def test_close_request_in_prepared_batch_is_busy():
    m = new_model()
    h = m.open_request()
    m.prepare_batch(plan(item(h, 3)))
    fails(m, RequestBusy, m.close_request, h)


def test_close_twice_is_stale():
    m = new_model()
    h = m.open_request()
    m.close_request(h)
    fails(m, StaleHandle, m.close_request, h)


# --------------------------------------------------------------------------------------
# §3 handle checks, in order
# --------------------------------------------------------------------------------------


def _request_ops(m):
    """Every way a request handle reaches the model, as callables of the handle."""
    other = m.open_request()  # a valid request for plan-based calls
    compute(m, other, 4)
    return {
        "close_request": lambda h: m.close_request(h),
        "publish": lambda h: m.publish(h, 0, 1),
        "prepare_item": lambda h: m.prepare_batch(plan(item(h, 1))),
        "prepare_publish_intent": lambda h: m.prepare_batch(plan(item(other, 1), intents=[Publish(h, 0, 1)])),
        "prepare_close_intent": lambda h: m.prepare_batch(plan(item(other, 1), intents=[Close(h)])),
    }


def _bad_requests(m):
    """Request handles for each row of §3 rule 3 and the expected error."""
    h = m.open_request()  # slot 1 in these tests (slot 0 is the plan's helper request)
    m.close_request(h)  # slot 1 now at generation 1, not live
    live = m.open_request()  # slot 1 again, generation 1
    return [
        ("foreign", foreign(live), ForeignRuntime),
        ("foreign beats stale generation", foreign(h), ForeignRuntime),
        ("newer epoch", attrs.evolve(live, epoch=1), UnknownHandle),
        ("slot out of range", attrs.evolve(live, slot_id=m.max_requests), UnknownHandle),
        ("negative slot", attrs.evolve(live, slot_id=-1), UnknownHandle),
        ("older generation", h, StaleHandle),
        ("newer generation", attrs.evolve(live, generation=2), UnknownHandle),
        ("current generation, slot not live", RequestRuntimeHandle("model", 0, 3, 0), UnknownHandle),
    ]


@pytest.mark.parametrize("op", list(_request_ops(new_model())))
@pytest.mark.parametrize("case", range(8))
def test_request_handle_checks(op, case):
    m = new_model()
    call = _request_ops(m)[op]
    name, handle, exc = _bad_requests(m)[case]
    fails(m, exc, call, handle)


def test_epoch_checked_before_slot_and_generation():
    m = new_model()
    old = m.open_request()
    m.restart()
    fails(m, StaleHandle, m.close_request, old)
    fails(m, StaleHandle, m.close_request, attrs.evolve(old, slot_id=99))  # epoch before slot range
    fails(m, StaleHandle, m.close_request, attrs.evolve(old, generation=99))  # epoch before generation
    fails(m, ForeignRuntime, m.close_request, foreign(attrs.evolve(old, slot_id=99)))  # runtime first


def _extent_ops(m):
    holder = m.open_request()
    return {
        "retain": lambda x: m.retain(x),
        "release": lambda x: m.release(x),
        "split": lambda x: m.split(x, 1),
        "submit_backup": lambda x: m.submit((Backup(x),)),
        "submit_drop": lambda x: m.submit((Drop(x),)),
        "prepare_attach": lambda x: m.prepare_batch(plan(item(holder, 1, attach=[x]))),
        "prepare_release_intent": lambda x: m.prepare_batch(plan(item(holder, 1), intents=[Release(x)])),
        "prepare_restore_intent": lambda x: m.prepare_batch(plan(item(holder, 1), intents=[Restore(x)])),
    }


def _bad_extents(m):
    _, x = extent(m, 2)
    _, y = extent(m, 2)
    _, z = extent(m, 2)
    m.release(y)
    m.split(z, 1)
    return [
        ("foreign", foreign(x), ForeignRuntime),
        ("newer epoch", attrs.evolve(x, epoch=1), UnknownHandle),
        ("released", y, StaleHandle),
        ("split", z, StaleHandle),
        ("released, runs altered: generation checked first", attrs.evolve(y, page_runs=(PageRun(0, 9),)), StaleHandle),
        ("never issued", attrs.evolve(x, generation=999), UnknownHandle),
        ("generation 0", attrs.evolve(x, generation=0), UnknownHandle),
        ("page runs differ", attrs.evolve(x, page_runs=(PageRun(x.page_runs[0].first_page, 1),)), UnknownHandle),
    ]


@pytest.mark.parametrize("op", list(_extent_ops(new_model())))
@pytest.mark.parametrize("case", range(8))
def test_extent_ref_checks(op, case):
    m = new_model()
    call = _extent_ops(m)[op]
    name, ref, exc = _bad_extents(m)[case]
    fails(m, exc, call, ref)


def test_extent_ref_from_old_epoch_is_stale():
    m = new_model()
    _, x = extent(m, 2)
    m.restart()
    _, y = extent(m, 2)  # same generation number in the new epoch
    assert y.generation == x.generation
    fails(m, StaleHandle, m.release, x)
    fails(m, ForeignRuntime, m.release, foreign(x))


@pytest.mark.parametrize("op", ["execute_batch", "cancel_batch"])
def test_batch_handle_checks(op):
    m = new_model()
    h = m.open_request()
    b = m.prepare_batch(plan(item(h, 1)))
    call = getattr(m, op)
    fails(m, ForeignRuntime, call, foreign(b))
    fails(m, UnknownHandle, call, attrs.evolve(b, epoch=1))
    fails(m, UnknownHandle, call, attrs.evolve(b, batch_id=7))
    fails(m, UnknownHandle, call, PreparedBatchHandle("model", 0, -1))
    m.restart()
    fails(m, StaleHandle, call, b)
    fails(m, StaleHandle, call, attrs.evolve(b, batch_id=7))


# Plan handle order: items (request, then attached extents), then intents.


def test_plan_items_checked_in_order():
    m = new_model()
    a = m.open_request()
    m.close_request(a)
    fails(m, ForeignRuntime, m.prepare_batch, plan(item(foreign(a), 1), item(a, 1)))
    fails(m, StaleHandle, m.prepare_batch, plan(item(a, 1), item(foreign(a), 1)))


def test_plan_request_before_attach_before_intents():
    m = new_model()
    h, x = extent(m, 1)
    stale = m.open_request()
    m.close_request(stale)
    fresh = m.open_request()
    y_h, y = extent(m, 1)
    m.release(y)  # y is stale now
    fails(m, StaleHandle, m.prepare_batch, plan(item(stale, 1, attach=[foreign(x)]), intents=[Release(foreign(x))]))
    fails(m, StaleHandle, m.prepare_batch, plan(item(fresh, 1, attach=[y]), intents=[Release(foreign(x))]))
    fails(m, ForeignRuntime, m.prepare_batch, plan(item(fresh, 1, attach=[foreign(x)]), intents=[Release(y)]))
    fails(m, StaleHandle, m.prepare_batch, plan(item(fresh, 1), intents=[Release(y), Release(foreign(x))]))


def test_plan_handle_checks_come_before_duplicate_request():
    m = new_model()
    h, x = extent(m, 1)
    m.release(x)
    fails(m, StaleHandle, m.prepare_batch, plan(item(h, 1), item(h, 1), intents=[Release(x)]))
    fails(m, InvalidPlan, m.prepare_batch, plan(item(h, 1), item(h, 1)))


def test_empty_plan_is_invalid_before_handle_checks():
    m = new_model()
    h, x = extent(m, 1)
    m.release(x)
    fails(m, InvalidPlan, m.prepare_batch, BatchPlan((), (Release(x),)))
    fails(m, InvalidPlan, m.prepare_batch, "not a plan")


# --------------------------------------------------------------------------------------
# 4.4 prepare_batch
# --------------------------------------------------------------------------------------


def test_prepare_allocates_names_in_plan_order_and_reserves():
    m = new_model()
    a, b = m.open_request(), m.open_request()
    m.prepare_batch(plan(item(a, 5), item(b, 4)))
    slots = m.probe().slots
    assert slots[0].pages == (0, 1) and slots[1].pages == (2,)
    assert (slots[0].num_tokens, slots[0].reserved_tokens) == (0, 5)
    m.prepare_batch(plan(item(a, 4)))  # N+1 before N executes: its pages follow N's
    assert m.probe().slots[0].pages == (0, 1, 3) and m.probe().slots[0].reserved_tokens == 9
    assert free(m, Tier.L1) == 12
    m.check_invariants()


def test_prepare_zero_tokens_is_invalid():
    m = new_model()
    h = m.open_request()
    fails(m, InvalidPlan, m.prepare_batch, plan(BatchItem(h)))


def test_prepare_attach_on_nonempty_row_is_invalid():
    m = new_model()
    _, x = extent(m, 1)
    h = m.open_request()
    m.prepare_batch(plan(item(h, 1)))  # reserved, not executed
    fails(m, InvalidPlan, m.prepare_batch, plan(item(h, 1, attach=[x])))


def test_prepare_append_needs_an_unappended_output():
    m = new_model()
    h = m.open_request()
    fails(m, RequestBusy, m.prepare_batch, plan(item(h, 0, append=True)))
    first = m.prepare_batch(plan(item(h, 2)))
    second = m.prepare_batch(plan(item(h, 0, append=True)))  # output of the prepared batch before it
    m.prepare_batch(plan(item(h, 0, append=True)))  # each batch produces an output of its own
    assert m.probe().slots[0].reserved_tokens == 4
    for b in m.probe().batches[::-1]:
        m.cancel_batch(attrs.evolve(first, batch_id=b.batch_id))
    fails(m, RequestBusy, m.prepare_batch, plan(item(h, 0, append=True)))  # cancelled outputs are gone
    assert second.batch_id == 1


def test_prepare_attach_needs_resident_pages():
    m = new_model()
    owner, x = extent(m, 2)
    m.close_request(owner)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    h = m.open_request()
    fails(m, NotResident, m.prepare_batch, plan(item(h, 1, attach=[x])))
    m.prepare_batch(plan(item(h, 1, attach=[x]), intents=[Restore(x)]))  # restored by the plan
    m.check_invariants()


def test_prepare_row_full():
    m = new_model(max_request_tokens=16)
    h = m.open_request()
    fails(m, RowFull, m.prepare_batch, plan(item(h, 17)))
    m.prepare_batch(plan(item(h, 10)))
    fails(m, RowFull, m.prepare_batch, plan(item(h, 7)))  # reserved length counts
    _, x = extent(m, 3)
    g = m.open_request()
    fails(m, RowFull, m.prepare_batch, plan(item(g, 5, attach=[x])))  # attached tokens count


def test_prepare_out_of_pages_reports_tier_needed_free():
    m = new_model(l1_pages=8)
    a, b = m.open_request(), m.open_request()
    compute(m, a, 8)  # 2 pages taken, 6 free
    err = fails(m, OutOfPages, m.prepare_batch, plan(item(b, 20), item(a, 12)))  # 5 + 3 pages
    assert (err.tier, err.needed, err.free) == (Tier.L1, 8, 6)
    m.prepare_batch(plan(item(b, 20)))


def test_prepare_out_of_pages_counts_restored_pages():
    m = new_model(l1_pages=6)
    h, x = extent(m, 2)
    m.close_request(h)
    m.submit((Backup(x),))
    m.submit((Demote(x),))  # demoted while the backup is in flight: L1 pages deferred
    m.wait_completions()
    g = m.open_request()
    compute(m, g, 12)  # 3 pages; 3 free
    f = m.open_request()
    err = fails(m, OutOfPages, m.prepare_batch, plan(item(f, 5, attach=[x]), intents=[Restore(x)]))
    assert (err.tier, err.needed, err.free) == (Tier.L1, 4, 3)  # 2 restored + 2 new


def test_prepare_precedence_within_items():
    m = new_model(max_request_tokens=16)
    a, b = m.open_request(), m.open_request()
    # item order: the first failing item's error wins
    fails(m, RequestBusy, m.prepare_batch, plan(item(a, 0, append=True), BatchItem(b)))
    fails(m, InvalidPlan, m.prepare_batch, plan(BatchItem(b), item(a, 0, append=True)))
    # within an item: zero tokens, attach, append, resident, row length, then pages
    owner, x = extent(m, 1)
    m.close_request(owner)
    m.submit((Backup(x),))
    m.submit((Demote(x),))
    fails(m, NotResident, m.prepare_batch, plan(item(a, 99, attach=[x])))
    fails(m, RowFull, m.prepare_batch, plan(item(a, 99)))


def test_prepare_restore_intent_starts_h2d_at_prepare():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    g = m.open_request()
    m.prepare_batch(plan(item(g, 1), intents=[Restore(x)]))
    (t,) = m.probe().transfers
    assert t.kind is TransferKind.RESTORE and t.pages == expand(x.page_runs)
    assert all(page_view(m, p).l1 is CopyState.FILLING for p in t.pages)


def test_prepare_without_l2_rejects_tier_intents():
    m = new_model(l2_pages=0)
    h, x = extent(m, 1)
    fails(m, NoL2, m.prepare_batch, plan(item(h, 1), intents=[Backup(x)]))
    m.prepare_batch(plan(item(h, 1), intents=[Release(x)]))  # Release needs no L2


# --------------------------------------------------------------------------------------
# 4.5 execute_batch
# --------------------------------------------------------------------------------------


def test_execute_writes_tags_and_returns_results():
    m = new_model()
    a, b = m.open_request(), m.open_request()
    batch = m.prepare_batch(plan(item(a, 3), item(b, 2)))
    done = m.execute_batch(batch)
    assert done.batch == batch and done.published == () and done.tickets == ()
    assert [(r.request, r.num_tokens) for r in done.items] == [(a, 3), (b, 2)]
    assert [r.next_token for r in done.items] == [tag_digest((1, 2, 3)), tag_digest((4, 5))]
    done = compute(m, a, 0, append=True)
    assert done.items[0].num_tokens == 4 and done.items[0].next_token == tag_digest((1, 2, 3, 6))
    assert m.probe().slots[0].num_tokens == 4


def test_batch_records_in_plan_order_then_only_the_outcome():
    m = new_model()
    a, b = m.open_request(), m.open_request()
    compute(m, b, 3)
    batch = m.prepare_batch(plan(item(b, 2), item(a, 1)))
    record = m.state.batches[batch.batch_id]
    assert (record.state, record.slots, record.slot_set) == (BatchState.PREPARED, (1, 0), frozenset({0, 1}))
    assert (record.starts, record.ends, record.start_tokens, record.requests) == ((3, 0), (5, 1), (3, 0), (b, a))
    assert not record.one_token
    done = m.execute_batch(batch)
    assert batch.batch_id not in m.state.batches
    assert m.state.finished[batch.batch_id] == (BatchState.EXECUTED, (0, 1))
    assert [m.state.slots[s].last_output for s in (1, 0)] == [r.next_token for r in done.items]


def test_execute_twice_is_already_executed():
    m = new_model()
    h = m.open_request()
    b = m.prepare_batch(plan(item(h, 1)))
    m.execute_batch(b)
    fails(m, AlreadyExecuted, m.execute_batch, b)


def test_execute_cancelled_is_not_prepared():
    m = new_model()
    h = m.open_request()
    b = m.prepare_batch(plan(item(h, 1)))
    m.cancel_batch(b)
    fails(m, NotPrepared, m.execute_batch, b)


def test_execute_out_of_order():
    m = new_model()
    a, c = m.open_request(), m.open_request()
    n = m.prepare_batch(plan(item(a, 2)))
    unrelated = m.prepare_batch(plan(item(c, 2)))
    n1 = m.prepare_batch(plan(item(a, 0, append=True)))
    fails(m, OutOfOrder, m.execute_batch, n1)
    m.execute_batch(unrelated)  # no shared request: any order
    m.execute_batch(n)
    assert m.execute_batch(n1).items[0].num_tokens == 3


def test_execute_applies_intents_in_plan_order():
    m = new_model()
    h = m.open_request()
    compute(m, h, 8)
    done = compute(m, h, 1, intents=[Publish(h, 0, 2), Publish(h, 1, 1), Close(h)])
    x, y = done.published
    assert expand(x.page_runs) == (0, 1) and expand(y.page_runs) == (1,)
    assert not m.probe().slots[0].live
    assert [p.holders for p in m.probe().pages] == [1, 2]  # the row's third page was freed


def test_execute_backup_intent_returns_ticket():
    m = new_model()
    h, x = extent(m, 2)
    done = compute(m, h, 1, intents=[Backup(x)])
    (t,) = done.tickets
    assert (t.kind, t.extent_generation, t.page_count) == (TransferKind.BACKUP, x.generation, 2)


@pytest.mark.parametrize("case", ["backup_l2_full", "publish_partial_page", "demote_in_use", "demote_no_host", "drop_no_device", "release_stale", "close_busy"])
def test_execute_intent_errors_change_nothing(case):
    m = new_model(l2_pages=1)
    h, x = extent(m, 2)
    intents, exc = {
        "backup_l2_full": ([Backup(x)], OutOfPages),
        "publish_partial_page": ([Publish(h, 0, 3)], InvalidPageRun),  # 8 + 1 tokens: 2 full pages
        "demote_in_use": (None, ExtentInUse),
        "demote_no_host": ([Demote(x)], NotBackedUp),
        "drop_no_device": (None, WouldLoseData),
        "release_stale": (None, StaleHandle),
        "close_busy": ([Close(h)], RequestBusy),
    }[case]
    if case == "demote_in_use":
        m2 = new_model()
        h, x = extent(m2, 1)
        m2.submit((Backup(x),))
        m, intents = m2, [Demote(x)]
    if case == "drop_no_device":
        m2 = new_model()
        h, x = extent(m2, 1)
        _, keep = extent(m2, 1)
        m2.close_request(h)
        m2.submit((Backup(x),))
        m2.submit((Demote(x),))
        h = m2.open_request()
        m, intents = m2, [Drop(x)]
    b = m.prepare_batch(plan(item(h, 1), intents=intents or [Release(x)]))
    if case == "release_stale":
        m.release(x)
    if case == "close_busy":
        m.prepare_batch(plan(item(h, 1)))  # a later batch holds the request
    err = fails(m, exc, m.execute_batch, b)
    if case == "backup_l2_full":
        assert (err.tier, err.needed, err.free) == (Tier.L2, 2, 1)
    assert next(v for v in m.probe().batches if v.batch_id == b.batch_id).state is BatchState.PREPARED


def test_execute_waits_for_restores_it_reads():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    g = m.open_request()
    b = m.prepare_batch(plan(item(g, 1, attach=[x]), intents=[Restore(x)]))
    assert m.probe().transfers
    done = m.execute_batch(b)
    assert not m.probe().transfers
    assert done.items[0].next_token == tag_digest(tuple(range(1, 9)) + (9,))
    assert [c.ticket.kind for c in m.poll_completions()] == [TransferKind.RESTORE]
    m.check_invariants()


# --------------------------------------------------------------------------------------
# 4.6 cancel_batch
# --------------------------------------------------------------------------------------


def test_cancel_undoes_allocation_and_mapping():
    m = new_model()
    h, x = extent(m, 2)
    g = m.open_request()
    before = m.probe()
    b = m.prepare_batch(plan(item(g, 5, attach=[x]), item(h, 3)))
    m.cancel_batch(b)
    after = m.probe()
    assert after.slots == before.slots and after.pages == before.pages and after.extents == before.extents
    assert free(m, Tier.L1) == 16 - 2
    assert after.batches[-1].state is BatchState.CANCELLED
    fails(m, RequestBusy, m.prepare_batch, plan(item(g, 0, append=True)))  # the cancelled output is gone


def test_cancel_twice_is_not_prepared_and_executed_is_already_executed():
    m = new_model()
    h = m.open_request()
    b = m.prepare_batch(plan(item(h, 1)))
    m.cancel_batch(b)
    fails(m, NotPrepared, m.cancel_batch, b)
    e = m.prepare_batch(plan(item(h, 1)))
    m.execute_batch(e)
    fails(m, AlreadyExecuted, m.cancel_batch, e)


def test_cancel_with_dependent_batch():
    m = new_model()
    h = m.open_request()
    n = m.prepare_batch(plan(item(h, 1)))
    n1 = m.prepare_batch(plan(item(h, 1)))
    fails(m, BatchDependency, m.cancel_batch, n)
    m.cancel_batch(n1)
    m.cancel_batch(n)
    assert m.probe().slots[0].reserved_tokens == 0 and free(m, Tier.L1) == 16


# --------------------------------------------------------------------------------------
# 4.7 publish / 4.8 split / 4.9 retain / 4.10 release
# --------------------------------------------------------------------------------------


def test_publish_coalesces_runs_and_adds_holders():
    m = new_model()
    a, b = m.open_request(), m.open_request()
    m.execute_batch(m.prepare_batch(plan(item(a, 8), item(b, 4))))  # a: 0,1  b: 2
    compute(m, a, 8)  # a: 4,5 -> wait: 3,4
    x = m.publish(a, 0, 4)
    assert x.page_runs == (PageRun(0, 2), PageRun(3, 2)) and x.page_count == 4
    assert m.state.extents[x.generation].runs == x.page_runs  # computed once, when the extent is made
    assert m.probe().extents[-1].refcount == 1
    assert [page_view(m, p).holders for p in (0, 1, 3, 4)] == [2, 2, 2, 2]
    assert not B2_plain_values(x)


@pytest.mark.parametrize("first,count", [(0, 0), (-1, 1), (0, 3), (2, 1), (1, -1)])
def test_publish_outside_full_pages_is_invalid(first, count):
    m = new_model()
    h = m.open_request()
    compute(m, h, 9)  # 2 full pages, one partial
    m.prepare_batch(plan(item(h, 7)))  # reserved up to 16 tokens, not computed
    fails(m, InvalidPageRun, m.publish, h, first, count)


def test_split_retires_ref_and_keeps_holders():
    m = new_model()
    _, x = extent(m, 3)
    holders = [p.holders for p in m.probe().pages]
    head, tail = m.split(x, 1)
    assert expand(head.page_runs) == (0,) and expand(tail.page_runs) == (1, 2)
    assert len({x.generation, head.generation, tail.generation}) == 3
    assert [p.holders for p in m.probe().pages] == holders
    fails(m, StaleHandle, m.split, x, 1)
    fails(m, StaleHandle, m.release, x)


@pytest.mark.parametrize("at", [0, 3, -1, 4])
def test_split_point_must_be_inside(at):
    m = new_model()
    _, x = extent(m, 3)
    fails(m, InvalidPageRun, m.split, x, at)


def test_split_shared_extent():
    m = new_model()
    _, x = extent(m, 2)
    m.retain(x)
    fails(m, ExtentShared, m.split, x, 5)  # shared is checked before the split point
    m.release(x)
    m.split(x, 1)


def test_retain_release_counts_and_double_release_is_stale():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    m.retain(x)
    m.release(x)
    assert free(m, Tier.L1) == 14 and m.probe().extents[0].refcount == 1
    m.release(x)
    assert free(m, Tier.L1) == 16 and m.probe().pages == ()
    fails(m, StaleHandle, m.release, x)
    fails(m, StaleHandle, m.retain, x)


# --------------------------------------------------------------------------------------
# 4.11 submit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["release", "publish", "close", "str"])
def test_submit_takes_tier_intents_only(bad):
    m = new_model()
    h, x = extent(m, 1)
    intent = {"release": Release(x), "publish": Publish(h, 0, 1), "close": Close(h), "str": "backup"}[bad]
    fails(m, InvalidPlan, m.submit, (intent,))
    fails(m, InvalidPlan, m.submit, (Backup(x), intent))


def test_submit_without_l2():
    m = new_model(l2_pages=0)
    _, x = extent(m, 1)
    for intent in (Backup(x), Restore(x), Demote(x), Drop(x)):
        fails(m, NoL2, m.submit, (intent,))


def test_submit_backup_out_of_host_pages():
    m = new_model(l2_pages=3)
    _, x = extent(m, 2)
    _, y = extent(m, 2)
    m.submit((Backup(x),))
    err = fails(m, OutOfPages, m.submit, (Backup(y),))
    assert (err.tier, err.needed, err.free) == (Tier.L2, 2, 1)


def test_submit_backup_then_restore_and_drop():
    m = new_model()
    h, x = extent(m, 2)
    (t,) = m.submit((Backup(x),))
    assert (t.kind, t.page_count, t.extent_generation) == (TransferKind.BACKUP, 2, x.generation)
    assert [(p.l1, p.l2) for p in m.probe().pages[:2]] == [(CopyState.VALID, CopyState.FILLING)] * 2
    moves = m.state.transfers[t.transfer_id].pages
    assert m.state.transfers[t.transfer_id].touched == {(Tier.L1, src) for _, src, _ in moves} | {(Tier.L2, dst) for _, _, dst in moves}
    (again,) = m.submit((Backup(x),))  # nothing left to move: completes at once
    assert again.page_count == 0
    (r,) = m.submit((Restore(x),))
    assert r.page_count == 0
    m.wait_completions()
    assert [(p.l1, p.l2) for p in m.probe().pages[:2]] == [(CopyState.VALID, CopyState.VALID)] * 2
    m.submit((Drop(x),))
    assert [(p.l1, p.l2) for p in m.probe().pages[:2]] == [(CopyState.VALID, CopyState.ABSENT)] * 2
    assert free(m, Tier.L2) == 32


def test_submit_restore_out_of_device_pages():
    m = new_model(l1_pages=4)
    h, x = extent(m, 2)
    m.close_request(h)
    m.submit((Backup(x),))
    m.submit((Demote(x),))
    m.wait_completions()
    g = m.open_request()
    compute(m, g, 12)  # 3 of 4 device pages
    err = fails(m, OutOfPages, m.submit, (Restore(x),))
    assert (err.tier, err.needed, err.free) == (Tier.L1, 2, 1)


def test_submit_demote_needs_host_copy_and_no_live_row():
    m = new_model()
    h, x = extent(m, 2)
    fails(m, NotBackedUp, m.submit, (Demote(x),))
    m.submit((Backup(x),))  # filling counts as a host copy
    fails(m, ExtentInUse, m.submit, (Demote(x),))
    m.close_request(h)
    m.submit((Demote(x),))
    assert [p.l1 for p in m.probe().pages] == [CopyState.DROPPING] * 2  # write-back: kept until the backup lands
    m.wait_completions()
    assert [p.l1 for p in m.probe().pages] == [CopyState.ABSENT] * 2


def test_submit_drop_would_lose_data():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    fails(m, WouldLoseData, m.submit, (Drop(x),))


def test_submit_is_atomic_as_a_whole():
    m = new_model()
    h, x = extent(m, 2)
    fails(m, ExtentInUse, m.submit, (Backup(x), Demote(x)))  # the backup is not started either
    assert m.probe().transfers == ()
    m.close_request(h)
    tickets = m.submit((Backup(x), Demote(x)))
    assert [t.kind for t in tickets] == [TransferKind.BACKUP]


def test_submit_restore_keeps_a_dropping_copy_and_skips_present_pages():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    m.submit((Backup(x),))
    m.submit((Demote(x),))  # the backup is in flight: the device copies are kept, dropping
    free_l1 = len(m.probe().pools[0].free)
    (ticket,) = m.submit((Restore(x),))  # scenario 1: the restore keeps them; nothing moves
    assert ticket.page_count == 0
    assert [p.l1 for p in m.probe().pages] == [CopyState.VALID] * 2
    assert len(m.probe().pools[0].free) == free_l1
    (backup,) = (t.transfer_id for t in m.probe().transfers)
    m.complete_transfer(backup)
    assert [(p.l1, p.l2) for p in m.probe().pages] == [(CopyState.VALID, CopyState.VALID)] * 2


def test_a_failed_backup_leaves_the_demoted_device_copy_valid():
    m = new_model()
    h, x = extent(m, 2)
    m.close_request(h)
    (backup,) = m.submit((Backup(x), Demote(x)))
    m.fail_transfer(backup.transfer_id)
    assert [(p.l1, p.l2) for p in m.probe().pages] == [(CopyState.VALID, CopyState.ABSENT)] * 2
    (done,) = m.poll_completions()
    assert done.ticket == backup and done.failure is TransferFailure.COPY
    m.check_invariants()


def test_a_failed_restore_fails_the_batch_that_reads_it():
    m = new_model()
    h, x = extent(m, 1)
    m.close_request(h)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    r = m.open_request()
    b = m.prepare_batch(BatchPlan((BatchItem(r, (1,), (x,)),), (Restore(x),)))
    before = m.probe()
    (restore,) = (t.transfer_id for t in before.transfers)
    m.fail_transfer(restore)
    with pytest.raises(ComputeFailed) as failure:
        m.execute_batch(b)
    assert failure.value.batches == (b.batch_id,)
    after = m.probe()
    assert after.slots[r.slot_id].num_tokens == 0 and after.slots[r.slot_id].pages == ()
    assert [(p.l1, p.l2) for p in after.pages] == [(CopyState.ABSENT, CopyState.VALID)]
    m.check_invariants()


def test_injected_faults_pick_the_nth_transfer_and_compute():
    m = new_model()
    h, x = extent(m, 1)
    m.close_request(h)
    m.inject_fault(FaultKind.BACKUP, 1)
    m.submit((Backup(x),))
    (done,) = m.wait_completions()
    assert done.failure is TransferFailure.COPY
    r = m.open_request()
    m.inject_fault(FaultKind.COMPUTE, 2)
    m.execute_batch(m.prepare_batch(BatchPlan((BatchItem(r, (1,)),))))
    b = m.prepare_batch(BatchPlan((BatchItem(r, (2,)),)))
    with pytest.raises(ComputeFailed):
        m.execute_batch(b)
    assert m.probe().slots[r.slot_id].num_tokens == 1
    for bad in (0, -1, 1.5):
        fails(m, InvalidArgument, m.inject_fault, FaultKind.COMPUTE, bad)


def test_a_lost_runtime_raises_runtime_fault_until_restart():
    m = new_model()
    _, x = extent(m, 1)
    m.submit((Backup(x),))
    m.lose()
    fails(m, RuntimeFault, m.open_request)
    fails(m, RuntimeFault, m.wait_completions)
    info = m.restart()
    assert info.epoch == 1 and m.probe().transfers == ()
    m.open_request()


# --------------------------------------------------------------------------------------
# 4.12 poll / 4.13 wait / environment
# --------------------------------------------------------------------------------------


def test_poll_and_wait_report_each_completion_once_in_order():
    m = new_model()
    _, x = extent(m, 1)
    _, y = extent(m, 1)
    tx, ty = m.submit((Backup(x), Backup(y)))
    assert m.poll_completions() == ()
    m.complete_transfer(ty.transfer_id)
    assert [c.ticket for c in m.poll_completions()] == [ty]
    assert m.poll_completions() == ()
    done = m.wait_completions()
    assert [c.ticket for c in done] == [tx] and not B2_plain_values(done)
    assert m.wait_completions() == () and m.poll_completions() == ()


def test_complete_transfer_rejects_unknown_and_blocked_transfers():
    import copy

    m = new_model()
    state = copy.deepcopy(m.state)
    with pytest.raises(ValueError):
        m.complete_transfer(0)
    assert m.state == state


# --------------------------------------------------------------------------------------
# 4.14 restart
# --------------------------------------------------------------------------------------


def test_restart_makes_everything_stale_and_tags_continue():
    m = new_model()
    h, x = extent(m, 1)
    idle = m.open_request()
    m.close_request(idle)
    b = m.prepare_batch(plan(item(h, 1)))
    m.submit((Backup(x),))
    info = m.restart()
    assert info.epoch == 1 and not B2_plain_values(info)
    view = m.probe()
    assert view.pages == view.extents == view.batches == view.transfers == ()
    assert [s.generation for s in view.slots] == [1, 1, 0, 0] and not any(s.live for s in view.slots)
    assert m.poll_completions() == ()
    fails(m, StaleHandle, m.close_request, h)
    fails(m, StaleHandle, m.release, x)
    fails(m, StaleHandle, m.execute_batch, b)
    g = m.open_request()
    assert (g.slot_id, g.generation, g.epoch) == (0, 1, 1)
    done = compute(m, g, 1)
    assert done.items[0].next_token == tag_digest((5,))  # tags 1..4 were written before the restart
    m.check_invariants()
