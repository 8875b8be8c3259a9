"""Replays of the twelve hard scenarios of spec/scenarios.md on the reference model.

Each test asserts the answer spec/protocol.md §7 gives. Failing calls are checked to
raise exactly the named error and to change nothing (model state and probe()).
"""

from __future__ import annotations

import copy

import pytest

from cacheruntime.invariants import B1_calls_per_batch, B2_plain_values
from cacheruntime.model import ReferenceModel
from cacheruntime.pageruns import expand
from cacheruntime.protocol import (
    PER_BATCH_CALLS,
    Backup,
    BatchItem,
    BatchPlan,
    CacheRuntimeError,
    Capability,
    CopyState,
    Demote,
    ExtentInUse,
    Fetch,
    HostMode,
    OutOfOrder,
    OutOfPages,
    Persist,
    Restore,
    StaleHandle,
    Tier,
    TransferFailure,
    TransferKind,
    tag_digest,
)

PS = 4


def fails(m, exc, fn, *args):
    state, view = copy.deepcopy(m.state), m.probe()
    with pytest.raises(CacheRuntimeError) as info:
        fn(*args)
    assert type(info.value) is exc, repr(info.value)
    assert m.state == state and m.probe() == view
    return info.value


def run(m, request, n, *, attach=(), append=False, intents=()):
    plan = BatchPlan((BatchItem(request, tuple(range(n)), tuple(attach), append),), tuple(intents))
    return m.prepare_batch(plan)


def compute(m, request, n, **kw):
    done = m.execute_batch(run(m, request, n, **kw))
    assert not B2_plain_values(done)
    return done


def finished_extent(m, pages):
    """A request computed `pages` full pages, published them and closed: the tree holds the extent."""
    h = m.open_request()
    compute(m, h, pages * PS)
    x = m.publish(h, 0, pages)
    m.close_request(h)
    return x


def pool(m, tier):
    return next(p for p in m.probe().pools if p.tier is tier)


def phys(m, tier, names):
    mapped = dict((name, p) for p, name in pool(m, tier).mapped)
    return [mapped[n] for n in names]


def page(m, name):
    return next(p for p in m.probe().pages if p.page == name)


def test_scenario_01_prefix_hit_on_l2_while_backup_in_flight():
    m = ReferenceModel(page_size=PS)
    x = finished_extent(m, 2)
    names = expand(x.page_runs)
    device = phys(m, Tier.L1, names)
    (backup,) = m.submit((Backup(x),))
    m.submit((Demote(x),))  # allowed once a backup is started
    assert [page(m, n).l1 for n in names] == [CopyState.DROPPING] * 2  # write-back: kept until the D2H lands
    assert [page(m, n).l2 for n in names] == [CopyState.FILLING] * 2
    assert not set(device) & set(pool(m, Tier.L1).free) and not set(device) & set(pool(m, Tier.L1).deferred)  # held, not freed (O3)
    b = m.open_request()
    batch = run(m, b, 1, attach=[x], intents=[Restore(x)])  # the new request matches X: the restore keeps the device copies
    assert [t.kind for t in m.probe().transfers] == [TransferKind.BACKUP]  # nothing to move, nothing reads the filling host copy
    assert [page(m, n).l1 for n in names] == [CopyState.VALID] * 2
    m.complete_transfer(backup.transfer_id)
    assert phys(m, Tier.L1, names) == device  # the same device pages, never freed
    m.check_invariants()
    done = m.execute_batch(batch)
    assert done.items[0].next_token == tag_digest(tuple(range(1, 2 * PS + 1)) + (2 * PS + 1,))
    assert [(page(m, n).l1, page(m, n).l2) for n in names] == [(CopyState.VALID, CopyState.VALID)] * 2
    m.check_invariants()


def test_scenario_01_without_a_hit_the_landed_backup_frees_the_device_pages():
    m = ReferenceModel(page_size=PS)
    x = finished_extent(m, 2)
    names = expand(x.page_runs)
    device = phys(m, Tier.L1, names)
    (backup,) = m.submit((Backup(x), Demote(x)))
    m.complete_transfer(backup.transfer_id)
    assert [(page(m, n).l1, page(m, n).l2) for n in names] == [(CopyState.ABSENT, CopyState.VALID)] * 2
    assert set(device) <= set(pool(m, Tier.L1).free)
    m.check_invariants()


def test_scenario_02_split_during_restore():
    m = ReferenceModel(page_size=PS, l1_pages=16)
    x = finished_extent(m, 8)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    (restore,) = m.submit((Restore(x),))
    assert restore.page_count == 8
    head, tail = m.split(x, 3)
    assert expand(head.page_runs) + expand(tail.page_runs) == expand(x.page_runs)  # same page names
    assert [t.transfer_id for t in m.probe().transfers] == [restore.transfer_id]  # unaffected
    m.complete_transfer(restore.transfer_id)
    assert all(page(m, n).l1 is CopyState.VALID for n in expand(x.page_runs))
    assert [p.holders for p in m.probe().pages] == [1] * 8  # counted once
    m.check_invariants()
    m.release(head)
    m.release(tail)
    assert m.probe().pages == ()
    assert sorted(pool(m, Tier.L1).free) == list(range(16)) and sorted(pool(m, Tier.L2).free) == list(range(32))
    m.check_invariants()


def test_scenario_03_close_while_backing_up():
    m = ReferenceModel(page_size=PS)
    a = m.open_request()
    compute(m, a, 2 * PS)
    x = m.publish(a, 0, 2)
    names = expand(x.page_runs)
    m.submit((Backup(x),))
    m.release(x)  # the tree lets go; only the row holds the pages now
    device, host = phys(m, Tier.L1, names), phys(m, Tier.L2, names)
    m.close_request(a)
    b = m.open_request()  # the row is reusable at once, with a new generation
    assert (b.slot_id, b.generation) == (a.slot_id, a.generation + 1)
    assert set(device) <= set(pool(m, Tier.L1).deferred) and not set(device) & set(pool(m, Tier.L1).free)
    assert set(host) <= set(pool(m, Tier.L2).deferred)
    m.check_invariants()
    m.wait_completions()
    assert set(device) <= set(pool(m, Tier.L1).free) and set(host) <= set(pool(m, Tier.L2).free)
    assert pool(m, Tier.L1).deferred == pool(m, Tier.L2).deferred == ()
    m.check_invariants()


def test_scenario_04_stale_handle_after_slot_reuse():
    m = ReferenceModel(page_size=PS, max_requests=4)
    for _ in range(3):
        m.open_request()
    for _ in range(7):  # slot 3 reaches generation 7
        m.close_request(m.open_request())
    a = m.open_request()
    assert (a.slot_id, a.generation) == (3, 7)
    compute(m, a, 5)
    m.close_request(a)
    b = m.open_request()
    assert (b.slot_id, b.generation) == (3, 8)
    compute(m, b, 6)
    row = m.probe().slots[3]
    fails(m, StaleHandle, m.close_request, a)
    fails(m, StaleHandle, m.publish, a, 0, 1)
    fails(m, StaleHandle, run, m, a, 1)
    assert m.probe().slots[3] == row  # B's row untouched
    assert compute(m, b, 1).items[0].num_tokens == 7


def test_scenario_05_restart_with_work_in_flight():
    m = ReferenceModel(page_size=PS)
    x = finished_extent(m, 2)
    y = finished_extent(m, 1)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    m.submit((Backup(y),))  # a backup in flight
    a = m.open_request()
    batch = run(m, a, 3, attach=[x], intents=[Restore(x)])  # batch N prepared, its restore in flight
    assert len(m.probe().transfers) == 2
    old_tags = max(v for p in m.probe().pages for v in p.versions)
    m.restart()
    for call, arg in ((m.close_request, a), (m.release, x), (m.release, y), (m.execute_batch, batch), (m.cancel_batch, batch)):
        fails(m, StaleHandle, call, arg)
    fails(m, StaleHandle, m.submit, (Restore(x),))
    assert m.poll_completions() == ()  # nothing of the old epoch is reported
    view = m.probe()
    assert view.pages == view.extents == view.batches == view.transfers == ()
    b = m.open_request()
    done = compute(m, b, 2 * PS)
    # nothing the old epoch wrote is read: compute reads only the new tags
    assert done.items[0].next_token == tag_digest(tuple(range(old_tags + 1, old_tags + 1 + 2 * PS)))
    m.check_invariants()


def test_scenario_06_out_of_pages_in_prepare():
    m = ReferenceModel(page_size=PS, l1_pages=16, max_request_tokens=64)
    x = finished_extent(m, 10)  # the tree holds 10 pages: 6 free
    b = m.open_request()
    err = fails(m, OutOfPages, run, m, b, 10 * PS)
    assert (err.tier, err.needed, err.free) == (Tier.L1, 10, 6)
    assert m.probe().slots[b.slot_id].pages == () and m.probe().transfers == ()
    m.submit((Backup(x), Demote(x)))  # the scheduler evicts ...
    m.wait_completions()
    assert compute(m, b, 10 * PS).items[0].num_tokens == 10 * PS  # ... and retries
    m.check_invariants()


@pytest.mark.parametrize("tree_keeps_extent", [True, False])
def test_scenario_07_cancel_prepared_batch_with_restores_started(tree_keeps_extent):
    m = ReferenceModel(page_size=PS)
    x = finished_extent(m, 2)
    names = expand(x.page_runs)
    m.submit((Backup(x),))
    m.wait_completions()
    m.submit((Demote(x),))
    a = m.open_request()
    batch = run(m, a, 1, attach=[x], intents=[Restore(x)])
    (restore,) = m.probe().transfers
    target = restore.destinations
    m.cancel_batch(batch)
    assert m.probe().transfers == (restore,)  # the restore goes on
    if not tree_keeps_extent:
        m.release(x)  # nothing holds the pages now: freed after the H2D
        assert set(target) <= set(pool(m, Tier.L1).deferred)
    m.check_invariants()
    m.complete_transfer(restore.transfer_id)
    if tree_keeps_extent:
        assert [page(m, n).l1 for n in names] == [CopyState.VALID] * 2  # a valid L1 copy
        assert phys(m, Tier.L1, names) == list(target)
    else:
        assert m.probe().pages == () and set(target) <= set(pool(m, Tier.L1).free)
    assert len(pool(m, Tier.L1).free) + len(pool(m, Tier.L1).mapped) == 16  # nothing leaked
    m.check_invariants()


def test_scenario_08_execute_out_of_order():
    m = ReferenceModel(page_size=PS)
    a = m.open_request()
    n = run(m, a, 3)
    n1 = run(m, a, 2, append=True)  # N+1 continues the request and reads what N writes
    fails(m, OutOfOrder, m.execute_batch, n1)
    m.execute_batch(n)
    done = m.execute_batch(n1)
    assert done.items[0].num_tokens == 6
    assert done.items[0].next_token == tag_digest((1, 2, 3, 4, 5, 6))


def test_scenario_09_lock_during_eviction():
    m = ReferenceModel(page_size=PS)
    x = finished_extent(m, 2)
    m.submit((Backup(x),))  # the tree picked X as a victim and started its backup
    b = m.open_request()
    batch = run(m, b, 1, attach=[x])  # a new request matched and locked X
    fails(m, ExtentInUse, m.submit, (Demote(x),))  # the demote intent arrives late
    other = m.open_request()
    fails(m, ExtentInUse, m.execute_batch, run(m, other, 1, intents=[Demote(x)]))  # as an intent, too
    done = m.execute_batch(batch)
    assert done.items[0].next_token == tag_digest(tuple(range(1, 2 * PS + 1)) + (2 * PS + 1,))
    assert all(page(m, n).l1 is CopyState.VALID for n in expand(x.page_runs))
    m.check_invariants()


def test_scenario_10_double_release_after_split():
    m = ReferenceModel(page_size=PS)
    x = finished_extent(m, 3)
    x1, x2 = m.split(x, 1)
    fails(m, StaleHandle, m.release, x)  # the pre-split ref is stale
    before = len(pool(m, Tier.L1).free)
    m.release(x1)
    assert len(pool(m, Tier.L1).free) == before + 1  # X1's page, once
    fails(m, StaleHandle, m.release, x1)
    m.release(x2)
    free = pool(m, Tier.L1).free
    assert sorted(free) == list(range(16))  # every page freed exactly once
    m.check_invariants()


def test_scenario_11_buffer_only_to_l3():
    """spec §7.11: GPU -> pinned staging -> L3 and back, in buffer_only mode. Staging is reused only
    after the store write and the device write complete (S2); a store failure is a typed completion
    that leaves the device copy intact (F1); no host page holds a copy outside a transfer (S1)."""
    m = ReferenceModel(page_size=PS, l3=True, host_mode=HostMode.BUFFER_ONLY, l2_pages=2)
    assert Capability.L3 in m.info().capabilities and Capability.L2 not in m.info().capabilities
    x = finished_extent(m, 2)
    keys = ("prefix-hash-0", "prefix-hash-1")  # control's keys: a hash of the token prefix per page
    (failed,) = m.submit((Persist(x, keys),))
    m.fail_transfer(failed.transfer_id)
    assert [c.failure for c in m.poll_completions()] == [TransferFailure.STORE]
    assert all(p.l1 is CopyState.VALID for p in m.probe().pages) and not m.probe().objects
    m.submit((Persist(x, keys),))
    assert len(pool(m, Tier.L2).free) == 0  # both staging pages busy until the store write lands
    fails(m, OutOfPages, m.submit, (Persist(x, keys),))
    m.wait_completions()
    assert len(pool(m, Tier.L2).free) == 2 and m.l3_exists(keys) == (True, True)
    m.release(x)  # evicted from the GPU: the pages now live only in L3
    assert not m.probe().pages
    r = m.open_request()
    batch = m.prepare_batch(BatchPlan((BatchItem(r, (7,)),), (Fetch(r, keys),)))
    assert len(pool(m, Tier.L2).free) == 0  # staging busy until the device write lands
    m.check_invariants()
    done = m.execute_batch(batch)
    assert done.items[0].num_tokens == 2 * PS + 1 and len(pool(m, Tier.L2).free) == 2
    assert all(p.l2 is CopyState.ABSENT for p in m.probe().pages)
    m.check_invariants()


@pytest.mark.parametrize("requests,steps", [(1, 40), (16, 20), (256, 4)])
def test_scenario_12_per_token_pressure(requests, steps):
    m = ReferenceModel(page_size=16, max_requests=requests, max_request_tokens=16 * (steps + 2), l1_pages=requests * (steps + 2))
    handles = [m.open_request() for _ in range(requests)]
    for step in range(steps):
        items = tuple(BatchItem(h, () if step else (1, 2, 3), (), bool(step)) for h in handles)
        batch = m.prepare_batch(BatchPlan(items))
        done = m.execute_batch(batch)
        polled = m.poll_completions()
        for value in (batch, done, polled):
            assert not B2_plain_values(value)
        assert [r.num_tokens for r in done.items] == [3 + step] * requests
    calls = dict(m.probe().boundary_calls)
    assert calls == {"open_request": requests, **{op: steps for op in PER_BATCH_CALLS}}
    assert not B1_calls_per_batch(m.probe(), bound=len(PER_BATCH_CALLS) + -(-requests // steps))
