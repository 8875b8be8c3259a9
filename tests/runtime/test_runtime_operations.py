"""Each operation of `LocalGPURuntime` on its own, and each error leaving the runtime unchanged."""

from __future__ import annotations

import attrs
import pytest
from runtimekit import PS, comparable, fails, item, plan

from cacheruntime.invariants import B2_plain_values, check_state
from cacheruntime.protocol import (
    AlreadyExecuted,
    Backup,
    BatchDependency,
    Capability,
    Close,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    ForeignRuntime,
    InvalidPageRun,
    InvalidPlan,
    NoL2,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfOrder,
    OutOfPages,
    OutOfSlots,
    Publish,
    Release,
    RequestBusy,
    Restore,
    RowFull,
    RuntimeInterface,
    StaleHandle,
    Tier,
    TransferKind,
    UnknownHandle,
    WouldLoseData,
)
from cacheruntime.runtime.device.layer import Launched
from cacheruntime.runtime.factories import conformance, local


@pytest.fixture
def rt(device):
    runtime = conformance(device)
    yield runtime
    runtime.close()


def compute(rt, request, n=1, **kw):
    done = rt.execute_batch(rt.prepare_batch(plan(item(request, n, **kw))))
    assert not B2_plain_values(done)
    return done


def published(rt, pages=2):
    h = rt.open_request()
    compute(rt, h, pages * PS)
    return h, rt.publish(h, 0, pages)


def pool(rt, tier):
    return next(p for p in rt.probe().pools if p.tier is tier)


def page(rt, name):
    return next(p for p in rt.probe().pages if p.page == name)


def test_info_and_capabilities(device):
    rt = conformance(device)
    info = rt.info()
    assert isinstance(rt, RuntimeInterface)
    assert (info.page_size, info.max_requests, info.max_request_tokens, info.l1_pages, info.l2_pages) == (PS, 4, 32, 12, 24)
    assert info.capabilities == {
        Capability.L2,
        Capability.ASYNC_TRANSFERS,
        Capability.INTROSPECTION,
        Capability.RESTART,
        Capability.DELAY_KNOB,
        Capability.TAGGED_COMPUTE,
        Capability.FAULT_INJECTION,
    } | ({Capability.SCHEDULE_SEED} if device == "cpu" else set())  # the suite's CPU runtime runs on simulated streams
    # default decoder: 2 layers, K and V, 2 heads of 16 float32 values per token
    assert info.page_bytes == 2 * 2 * PS * 2 * 16 * 4
    assert not B2_plain_values(info)
    tiny = local(device, l2_pages=0)
    assert Capability.L2 not in tiny.info().capabilities
    assert Capability.TAGGED_COMPUTE not in tiny.info().capabilities


def test_open_close_and_generations(rt):
    handles = [rt.open_request() for _ in range(4)]
    assert [h.slot_id for h in handles] == [0, 1, 2, 3]
    fails(rt, OutOfSlots, rt.open_request)
    rt.close_request(handles[2])
    again = rt.open_request()
    assert (again.slot_id, again.generation) == (2, handles[2].generation + 1)
    fails(rt, StaleHandle, rt.close_request, handles[2])
    fails(rt, UnknownHandle, rt.close_request, attrs.evolve(again, generation=again.generation + 1))
    fails(rt, UnknownHandle, rt.close_request, attrs.evolve(again, slot_id=9))
    fails(rt, ForeignRuntime, rt.close_request, attrs.evolve(again, runtime_id="elsewhere"))
    fails(rt, UnknownHandle, rt.close_request, attrs.evolve(again, epoch=1))


def test_prepare_execute_writes_tags_and_reads_them_back(rt):
    h = rt.open_request()
    done = compute(rt, h, 3)
    assert done.items[0].num_tokens == 3
    state = rt.probe()
    slot = state.slots[0]
    assert (slot.pages, slot.num_tokens, slot.reserved_tokens) == ((0, 1), 3, 3)
    assert [p.versions for p in state.pages] == [(1, 2), (3, 0)]
    assert [p.l1_tags[: 2 if p.page == 0 else 1] for p in state.pages] == [(1, 2), (3,)]
    done = compute(rt, h, 1, append=True)
    assert done.items[0].num_tokens == 5
    check_state(rt.probe())


def test_prepare_preconditions(rt):
    h = rt.open_request()
    other = rt.open_request()
    fails(rt, InvalidPlan, rt.prepare_batch, plan())
    fails(rt, InvalidPlan, rt.prepare_batch, "not a plan")
    fails(rt, InvalidPlan, rt.prepare_batch, plan(item(h), item(h)))
    fails(rt, InvalidPlan, rt.prepare_batch, plan(item(h, 0)))
    fails(rt, RequestBusy, rt.prepare_batch, plan(item(h, 0, append=True)))
    fails(rt, RowFull, rt.prepare_batch, plan(item(h, 33)))
    fails(rt, OutOfPages, rt.prepare_batch, plan(item(h, 20), item(other, 10)))
    _, e = published(rt)
    compute(rt, h, 1)
    fails(rt, InvalidPlan, rt.prepare_batch, plan(item(h, 1, attach=(e,))))


def test_out_of_pages_reports_needed_and_free(rt):
    h = rt.open_request()
    compute(rt, h, 18)  # 9 of 12 pages
    g = rt.open_request()
    error = fails(rt, OutOfPages, rt.prepare_batch, plan(item(g, 8)))
    assert (error.tier, error.needed, error.free) == (Tier.L1, 4, 3)


def test_execute_once_order_and_cancel(rt):
    h = rt.open_request()
    first = rt.prepare_batch(plan(item(h, 2)))
    second = rt.prepare_batch(plan(item(h, 0, append=True)))
    fails(rt, OutOfOrder, rt.execute_batch, second)
    fails(rt, BatchDependency, rt.cancel_batch, first)
    fails(rt, RequestBusy, rt.close_request, h)
    rt.execute_batch(first)
    fails(rt, AlreadyExecuted, rt.execute_batch, first)
    fails(rt, AlreadyExecuted, rt.cancel_batch, first)
    rt.cancel_batch(second)
    fails(rt, NotPrepared, rt.execute_batch, second)
    fails(rt, NotPrepared, rt.cancel_batch, second)
    fails(rt, UnknownHandle, rt.execute_batch, attrs.evolve(second, batch_id=99))
    assert rt.probe().slots[0].reserved_tokens == 2
    assert len(pool(rt, Tier.L1).free) == 11


def test_publish_split_retain_release(rt):
    h, e = published(rt, 3)
    fails(rt, InvalidPageRun, rt.publish, h, 2, 2)
    fails(rt, InvalidPageRun, rt.publish, h, 0, 0)
    rt.retain(e)
    fails(rt, ExtentShared, rt.split, e, 1)
    rt.release(e)
    fails(rt, InvalidPageRun, rt.split, e, 3)
    head, tail = rt.split(e, 1)
    assert (head.page_count, tail.page_count) == (1, 2)
    fails(rt, StaleHandle, rt.release, e)
    fails(rt, UnknownHandle, rt.release, attrs.evolve(head, generation=99))
    fails(rt, UnknownHandle, rt.release, attrs.evolve(head, page_runs=tail.page_runs))
    rt.close_request(h)
    rt.release(head)
    rt.release(tail)
    fails(rt, StaleHandle, rt.release, tail)
    assert sorted(pool(rt, Tier.L1).free) == list(range(12))


def test_tier_moves_and_completions(rt):
    h, e = published(rt)
    fails(rt, NotBackedUp, rt.submit, (Demote(e),))
    fails(rt, InvalidPlan, rt.submit, (Release(e),))
    (ticket,) = rt.submit((Backup(e),))
    assert (ticket.kind, ticket.page_count) == (TransferKind.BACKUP, 2)
    done = rt.wait_completions()
    assert [c.ticket for c in done] == [ticket]
    assert rt.poll_completions() == ()
    fails(rt, ExtentInUse, rt.submit, (Demote(e),))
    rt.close_request(h)
    rt.submit((Demote(e),))
    assert {page(rt, p).l1 for p in (0, 1)} == {CopyState.ABSENT}
    fails(rt, WouldLoseData, rt.submit, (Drop(e),))
    g = rt.open_request()
    fails(rt, NotResident, rt.prepare_batch, plan(item(g, 1, attach=(e,))))
    (restore,) = rt.submit((Restore(e),))
    assert restore.page_count == 2
    while not rt.poll_completions():
        pass
    assert {page(rt, p).l1 for p in (0, 1)} == {CopyState.VALID}
    rt.submit((Drop(e),))
    assert {page(rt, p).l2 for p in (0, 1)} == {CopyState.ABSENT}
    (nothing,) = rt.submit((Restore(e),))
    assert nothing.page_count == 0
    assert [c.ticket for c in rt.poll_completions()] == [nothing]
    check_state(rt.probe())


def test_plan_intents_apply_after_compute(rt):
    h = rt.open_request()
    rt.execute_batch(rt.prepare_batch(plan(item(h, 4))))
    batch = rt.prepare_batch(plan(item(h, 1), intents=(Publish(h, 0, 2),)))
    done = rt.execute_batch(batch)
    (e,) = done.published
    done = rt.execute_batch(rt.prepare_batch(plan(item(h, 1), intents=(Backup(e), Close(h)))))
    (ticket,) = done.tickets
    assert not rt.probe().slots[0].live
    rt.wait_completions()
    rt.submit((Demote(e),))
    rt.release(e)
    assert sorted(pool(rt, Tier.L1).free) == list(range(12))
    assert sorted(pool(rt, Tier.L2).free) == list(range(24))


def test_no_l2_runtime_rejects_tier_moves(device):
    rt = local(device, page_size=2, max_request_tokens=32, l1_pages=12, l2_pages=0, runner="tagging")
    h, e = published(rt)
    fails(rt, NoL2, rt.submit, (Backup(e),))
    rt.release(e)


def test_restart_makes_everything_stale(rt):
    h, e = published(rt)
    batch = rt.prepare_batch(plan(item(h, 1)))
    rt.submit((Backup(e),))
    info = rt.restart()
    assert info.epoch == 1
    for call, arg in ((rt.close_request, h), (rt.release, e), (rt.execute_batch, batch)):
        fails(rt, StaleHandle, call, arg)
    state = rt.probe()
    assert state.boundary_calls == (("restart", 1),)
    assert state.slots[0].generation == 1 and not state.pages and not state.transfers
    g = rt.open_request()
    done = compute(rt, g, 2)
    assert rt.probe().pages[0].versions == (5, 6)  # tags go on across the restart (4 before it)
    assert done.items[0].num_tokens == 2


def test_boundary_calls_are_counted_on_success_only(rt):
    h = rt.open_request()
    fails(rt, InvalidPlan, rt.prepare_batch, plan())
    compute(rt, h, 2)
    rt.poll_completions()
    assert dict(rt.probe().boundary_calls) == {"open_request": 1, "prepare_batch": 1, "execute_batch": 1, "poll_completions": 1}


def test_failing_intent_at_execute_runs_no_compute(rt):
    """Intents are checked against the state after compute; one failing undoes the whole call."""
    _, e = published(rt)
    g = rt.open_request()
    batch = rt.prepare_batch(plan(item(g, 3), intents=(Release(e), Backup(e))))
    error = fails(rt, StaleHandle, rt.execute_batch, batch)  # the Release ended e: Backup names a dead ref
    assert "extent" in error.what
    state = rt.probe()
    assert state.slots[g.slot_id].num_tokens == 0
    assert all(v == 0 for p in state.pages if p.page in state.slots[g.slot_id].pages for v in p.versions)
    rt.cancel_batch(batch)
    check_state(rt.probe())


class _EventThatFails:
    """A copy's event whose wait fails: a CUDA copy error surfaces there, as does an interrupt."""

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        raise KeyboardInterrupt("interrupted while blocking on a copy")


def test_wait_completions_failing_while_blocking_retires_nothing(rt):
    """wait_completions retires before it blocks; if blocking fails, the retires are undone."""
    _, e = published(rt)
    (ticket,) = rt.submit((Backup(e),))
    rt.device_layer.pump()  # issue the whole backup now, so that it has its event
    launched = rt.device_layer.launched[ticket.transfer_id]
    rt.device_layer.launched[ticket.transfer_id] = Launched(_EventThatFails(), launched.result)
    before = rt.probe()
    with pytest.raises(KeyboardInterrupt):
        rt.wait_completions()
    after = rt.probe()
    assert comparable(after) == comparable(before)
    assert [t.transfer_id for t in after.transfers] == [ticket.transfer_id]
    rt.device_layer.launched[ticket.transfer_id] = launched
    assert [c.ticket for c in rt.wait_completions()] == [ticket]
    check_state(rt.probe())
