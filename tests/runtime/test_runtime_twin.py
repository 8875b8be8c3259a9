"""The runtime and the reference model, given the same calls, give the same results and states.

Scenarios 1-10 of `spec/scenarios.md` are replayed through a `Twin` (every result, error
type and abstract state compared after every call), with transfers slowed by the delay
knob where the scenario is about work in flight. A seeded random walk then covers the
combinations no scenario names.
"""

from __future__ import annotations

import random

import pytest
from runtimekit import PS, Twin, item, new_twin, plan

from cacheruntime.protocol import (
    Backup,
    CacheRuntimeError,
    Close,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    OutOfOrder,
    OutOfPages,
    Publish,
    Release,
    Restore,
    StaleHandle,
    Tier,
)

DELAY = 0.05


def compute(t: Twin, request, n=1, **kw):
    return t.execute_batch(t.prepare_batch(plan(item(request, n, **kw))))


def published(t: Twin, pages=2):
    h = t.open_request()
    compute(t, h, pages * PS)
    return h, t.publish(h, 0, pages)


def backed_up_and_demoted(t: Twin, pages=2):
    h, e = published(t, pages)
    t.submit((Backup(e),))
    t.wait_completions()
    t.close_request(h)
    t.submit((Demote(e),))
    return e


def expect(error, fn, *args):
    with pytest.raises(error):
        fn(*args)


def test_scenario_1_prefix_hit_on_l2_while_backup_in_flight(twin):
    h, e = published(twin)
    twin.close_request(h)
    twin.runtime.set_transfer_delay(DELAY)
    twin.submit((Backup(e),))
    twin.submit((Demote(e),))  # allowed once the backup started; the device copies are kept until it lands
    assert {p.l1 for p in twin.runtime.probe().pages} == {CopyState.DROPPING}
    g = twin.open_request()
    done = twin.execute_batch(twin.prepare_batch(plan(item(g, 1, attach=(e,)), intents=(Restore(e),))))
    assert done.items[0].num_tokens == 2 * PS + 1  # the restore kept the device copies: nothing moved, nothing half-written
    assert {p.l1 for p in twin.runtime.probe().pages} == {CopyState.VALID}
    twin.wait_completions()


def test_scenario_2_split_during_restore(twin):
    e = backed_up_and_demoted(twin, 4)
    twin.runtime.set_transfer_delay(DELAY)
    twin.submit((Restore(e),))
    head, tail = twin.split(e, 1)
    twin.wait_completions()
    assert {p.l1 for p in twin.runtime.probe().pages} == {CopyState.VALID}
    twin.release(head)
    twin.release(tail)
    assert not twin.runtime.probe().pages


def test_scenario_3_close_while_backing_up(twin):
    h, e = published(twin)
    twin.runtime.set_transfer_delay(DELAY)
    twin.submit((Backup(e),))
    twin.release(e)
    twin.close_request(h)
    again = twin.open_request()
    assert (again.slot_id, again.generation) == (h.slot_id, h.generation + 1)
    pools = {p.tier: p for p in twin.runtime.probe().pools}
    assert len(pools[Tier.L1].deferred) == 2 and len(pools[Tier.L2].deferred) == 2
    twin.wait_completions()


def test_scenario_4_stale_handle_after_slot_reuse(twin):
    a = twin.open_request()
    twin.close_request(a)
    b = twin.open_request()
    compute(twin, b, 3)
    expect(StaleHandle, twin.prepare_batch, plan(item(a, 1)))
    expect(StaleHandle, twin.close_request, a)
    assert twin.runtime.probe().slots[b.slot_id].num_tokens == 3


@pytest.mark.parametrize("runner", ["tagging", "tiny"])
def test_scenario_5_restart_with_work_in_flight(runner, device):
    """Restart drains the copies in flight and they land, in the bytes and in the ledger's
    tags alike: with the tiny runner `probe()` shows the ledger's, and the pages a fresh
    request maps right after the restart show what the drained restore wrote."""
    twin = new_twin(device, runner)
    try:
        restart_with_work_in_flight(twin)
    finally:
        twin.runtime.close()


def restart_with_work_in_flight(twin):
    h, e = published(twin)
    f = backed_up_and_demoted(twin)
    twin.runtime.set_transfer_delay(DELAY)
    batch = twin.prepare_batch(plan(item(h, 1)))
    g = twin.open_request()
    twin.prepare_batch(plan(item(g, 1, attach=(f,)), intents=(Restore(f),)))
    twin.submit((Backup(e),))
    twin.restart()
    for tier in Tier:  # the drained copies landed in the ledger's tags as in the model's memory
        runtime_tags = twin.runtime.ledger.state.pools[tier].tags
        assert runtime_tags == [tag for page in twin.model.state.pools[tier].tags for tag in page], tier
    for call, arg in ((twin.execute_batch, batch), (twin.release, e), (twin.close_request, g)):
        expect(StaleHandle, call, arg)
    fresh = twin.open_request()
    prepared = twin.prepare_batch(plan(item(fresh, 2 * PS)))  # the twin compares the new pages' tags, as the drain left them
    twin.execute_batch(prepared)
    twin.wait_completions()


def test_scenario_6_out_of_pages_in_prepare(twin):
    h = twin.open_request()
    compute(twin, h, 12)  # 6 of 12 pages
    g = twin.open_request()
    with pytest.raises(OutOfPages) as info:
        twin.prepare_batch(plan(item(g, 20)))
    assert (info.value.needed, info.value.free) == (10, 6)
    twin.close_request(h)
    compute(twin, g, 20)


def test_scenario_7_cancel_prepared_batch_with_restores_started(twin):
    e = backed_up_and_demoted(twin)
    twin.runtime.set_transfer_delay(DELAY)
    g = twin.open_request()
    batch = twin.prepare_batch(plan(item(g, 1, attach=(e,)), intents=(Restore(e),)))
    twin.cancel_batch(batch)
    twin.wait_completions()
    pages = twin.runtime.probe().pages
    assert [(p.holders, p.l1) for p in pages] == [(1, CopyState.VALID)] * 2


def test_scenario_8_execute_out_of_order(twin):
    h = twin.open_request()
    first = twin.prepare_batch(plan(item(h, 3)))
    second = twin.prepare_batch(plan(item(h, 0, append=True)))
    expect(OutOfOrder, twin.execute_batch, second)
    twin.execute_batch(first)
    twin.execute_batch(second)


def test_scenario_9_lock_during_eviction(twin):
    h, e = published(twin)
    twin.submit((Backup(e),))
    twin.close_request(h)
    g = twin.open_request()
    compute(twin, g, 1, attach=(e,))
    expect(ExtentInUse, twin.submit, (Demote(e),))
    twin.wait_completions()


def test_scenario_10_double_release_after_split(twin):
    h, e = published(twin, 3)
    twin.close_request(h)
    head, tail = twin.split(e, 2)
    expect(StaleHandle, twin.release, e)
    twin.release(head)
    expect(StaleHandle, twin.release, head)
    twin.release(tail)
    assert not twin.runtime.probe().pages


def random_walk(t: Twin, rng: random.Random, steps: int) -> None:
    """Random calls, mostly valid, some stale or malformed; the twin compares after each."""
    handles, extents, batches = [], [], []

    def forget_sometimes(seq, value):
        if value in seq and rng.random() < 0.9:  # keep a few stale ones to hit the errors
            seq.remove(value)

    for _ in range(steps):
        op = rng.choice(
            [
                "open",
                "close",
                "compute",
                "compute",
                "compute",
                "publish",
                "submit",
                "submit",
                "release",
                "split",
                "retain",
                "poll",
                "poll",
                "wait",
                "pending",
                "restart",
            ]
        )
        h = rng.choice(handles) if handles else None
        x = rng.choice(extents) if extents else None
        try:
            if op == "open" or h is None:
                handles.append(t.open_request())
            elif op == "close":
                forget_sometimes(handles, h)
                t.close_request(h)
            elif op == "compute":
                attach = (x,) if x is not None and rng.random() < 0.3 else ()
                intents = tuple(Restore(a) for a in attach if rng.random() < 0.8)
                if x is not None and rng.random() < 0.3:
                    intents += (rng.choice((Backup, Release, Demote, Drop))(x),)
                if rng.random() < 0.2:
                    intents += (Publish(h, 0, 1),)
                if rng.random() < 0.1:
                    intents += (Close(h),)
                new = item(h, rng.randrange(0, 7), attach=attach, append=rng.random() < 0.3, start=rng.randrange(90))
                batch = t.prepare_batch(plan(new, intents=intents))
                if rng.random() < 0.75:
                    extents.extend(t.execute_batch(batch).published)
                else:
                    batches.append(batch)
            elif op == "publish":
                extents.append(t.publish(h, rng.randrange(2), rng.randrange(1, 3)))
            elif op == "submit" and x is not None:
                t.submit(tuple(rng.choice((Backup, Demote, Drop, Restore))(x) for _ in range(rng.randrange(1, 3))))
            elif op == "release" and x is not None:
                forget_sometimes(extents, x)
                t.release(x)
            elif op == "split" and x is not None:
                forget_sometimes(extents, x)
                extents.extend(t.split(x, rng.randrange(1, 3)))
            elif op == "retain" and x is not None:
                t.retain(x)
            elif op == "poll":
                t.poll_completions()
            elif op == "wait":
                t.wait_completions()
            elif op == "pending" and batches:
                rng.choice((t.execute_batch, t.cancel_batch))(batches.pop(rng.randrange(len(batches))))
            elif op == "restart" and rng.random() < 0.05:
                t.restart()  # with whatever is in flight: both drain it
                handles, extents, batches = [], [], []
        except CacheRuntimeError:
            pass  # the twin has already compared the errors and the states


@pytest.mark.parametrize("seed", range(12))
def test_random_walk_matches_model(seed, device):
    t = new_twin(device, "tagging" if seed % 3 else "tiny")
    t.runtime.set_transfer_delay(0.002 if seed % 2 else 0.0)
    random_walk(t, random.Random(seed), 80)
    t.wait_completions()
    t.runtime.close()
