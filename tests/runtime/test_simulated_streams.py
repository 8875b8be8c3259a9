"""Simulated streams keep the ordering a stream promises, and a seed fixes the interleaving.

The schedule's own rules first (FIFO per stream, `wait`, the delay step, a deadlock named,
the same seed giving the same interleaving and other seeds others), then what it is for:
without the delay knob, a runtime that leaves out a wait (O1, O3 and scenario 1) serves
wrong bytes under some seeds, the same seeds on every machine, while the landed runtime
serves the model's under all of them.
"""

from __future__ import annotations

import pytest
from runtimekit import PS, item, plan, twin_model

from cacheruntime.conformance.mutants.local import ReuseInFlight, SkipKvReadyWait
from cacheruntime.invariants import D1_copies_hold_last_write, check_state
from cacheruntime.protocol import Backup, Capability, Demote, OutOfPages, Restore, Unsupported
from cacheruntime.runtime.device.simulated import Schedule, SimEvent, SimStream
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, conformance
from cacheruntime.runtime.local import LocalGPURuntime

SEEDS = range(24)


def interleaving(seed: int) -> list[str]:
    """Three streams of three steps each, the second waiting on the first's event, run under `seed`."""
    schedule = Schedule(seed)
    a, b, c = (SimStream(name, schedule) for name in "abc")
    ran: list[str] = []
    for n in range(3):
        a.submit(lambda n=n: ran.append(f"a{n}"))
    first_done = a.record()
    b.wait(first_done)
    for n in range(3):
        b.submit(lambda n=n: ran.append(f"b{n}"))
        c.submit(lambda n=n: ran.append(f"c{n}"))
    schedule.drain()
    return ran


def test_each_stream_runs_in_order_and_a_wait_holds_its_stream():
    for seed in SEEDS:
        ran = interleaving(seed)
        for stream in "abc":
            assert [s for s in ran if s[0] == stream] == [f"{stream}{n}" for n in range(3)]
        assert ran.index("b0") > ran.index("a2")


def test_a_seed_fixes_the_interleaving_and_seeds_differ():
    assert interleaving(5) == interleaving(5)
    assert len({tuple(interleaving(seed)) for seed in SEEDS}) > 5


def test_a_delay_step_runs_once_nothing_else_can_move():
    schedule = Schedule(0)
    slow, fast = SimStream("slow", schedule), SimStream("fast", schedule)
    ran: list[str] = []
    slow.sleep(1.0)
    slow.submit(lambda: ran.append("slow"))
    for n in range(4):
        fast.submit(lambda n=n: ran.append(f"fast{n}"))
    slow.synchronize()
    assert ran == ["fast0", "fast1", "fast2", "fast3", "slow"]


def test_results_errors_and_a_deadlock_are_reported():
    schedule = Schedule(0)
    stream, other = SimStream("s", schedule), SimStream("o", schedule)
    assert stream.submit(lambda: 7).result() == 7
    with pytest.raises(ZeroDivisionError):
        stream.submit(lambda: 1 // 0).result()
    other.wait(SimEvent(schedule))  # an event no stream will ever reach
    with pytest.raises(RuntimeError, match="deadlocked"):
        other.submit(lambda: None).result()


def test_the_runtime_claims_the_seed_only_on_simulated_streams():
    simulated, threads = conformance(), LocalGPURuntime(**CONFORMANCE_OPTIONS)
    try:
        assert Capability.SCHEDULE_SEED in simulated.info().capabilities
        assert Capability.SCHEDULE_SEED not in threads.info().capabilities
        with pytest.raises(Unsupported, match="streams='simulated'"):
            threads.set_schedule_seed(1)
        with pytest.raises(ValueError, match="streams must be one of"):
            LocalGPURuntime(**CONFORMANCE_OPTIONS, streams="fibers")
    finally:
        simulated.close()
        threads.close()


def served_over_restored_prefix(runtime_class, seed: int) -> tuple[int, int]:
    """One token over a prefix restored from L2 (its backup landed before the Demote), no delay: (served, model's token)."""
    rt = runtime_class(**CONFORMANCE_OPTIONS, streams="simulated", schedule_seed=seed)
    model = twin_model(rt)
    tokens = []
    for side in (rt, model):
        h = side.open_request()
        side.execute_batch(side.prepare_batch(plan(item(h, 2 * PS))))
        prefix = side.publish(h, 0, 2)
        side.submit((Backup(prefix),))
        side.wait_completions()
        side.close_request(h)
        side.submit((Demote(prefix),))
        g = side.open_request()
        done = side.execute_batch(side.prepare_batch(plan(item(g, 1, attach=(prefix,)), intents=(Restore(prefix),))))
        tokens.append(done.items[0].next_token)
        side.wait_completions()
    rt.close()
    return tokens[0], tokens[1]


def wrong_seeds(runtime_class) -> list[int]:
    """The seeds under which `runtime_class` serves another token than the model."""
    return [seed for seed in SEEDS if len(set(served_over_restored_prefix(runtime_class, seed))) > 1]


def test_o1_without_its_wait_serves_wrong_tokens_under_some_seeds_only_there():
    assert wrong_seeds(LocalGPURuntime) == []
    wrong = wrong_seeds(SkipKvReadyWait)
    assert wrong, "compute never ran before the H2D it reads under any seed"
    assert wrong == wrong_seeds(SkipKvReadyWait)  # replayable


def reuse_under_restore(runtime_class, seed: int):
    """Release a prefix while its H2D is in flight, then fill L1; the state after every transfer.

    The restore's destination pages are freed when the page names end; reused at once (O3
    broken), the H2D may land on another request's freshly computed pages.
    """
    rt = runtime_class(**CONFORMANCE_OPTIONS, streams="simulated", schedule_seed=seed)
    h = rt.open_request()
    rt.execute_batch(rt.prepare_batch(plan(item(h, 2 * PS))))
    prefix = rt.publish(h, 0, 2)
    rt.close_request(h)
    rt.submit((Backup(prefix),))
    rt.wait_completions()
    rt.submit((Demote(prefix),))
    rt.submit((Restore(prefix),))
    rt.release(prefix)
    g = rt.open_request()
    try:
        rt.execute_batch(rt.prepare_batch(plan(item(g, 12 * PS))))
    except OutOfPages:
        pass  # the landed runtime keeps the two pages the H2D writes
    rt.wait_completions()
    state = rt.probe()
    rt.close()
    return state


def test_o3_reuse_in_flight_corrupts_new_pages_under_some_seeds():
    for seed in SEEDS:
        check_state(reuse_under_restore(LocalGPURuntime, seed))
    lost = [seed for seed in SEEDS if D1_copies_hold_last_write(reuse_under_restore(ReuseInFlight, seed))]
    assert lost, "the H2D always landed before compute wrote the reused pages"
