"""Crash isolation: SIGKILL of the runtime process at random points is the spec's RuntimeLost.

One `ProcessGPURuntime` (the conformance configuration on worker threads, transfers slowed
by the delay knob so that kills find copies in flight) runs a seeded random workload
(opens, prefills and decodes, publishes, backups and restores in plans and in `submit`,
polls, waits, closes); a killer thread SIGKILLs the runtime process after a seeded random
delay, wherever the workload is: mid-batch, mid-transfer, between calls. Each kill is
then held to the reference model's outcome of RuntimeLost followed by Restart:

- the call in flight (or the next one) raises `RuntimeFault` within 2 s of the kill, and
  so does every later call, as the model's calls do once it is lost;
- `info()` still answers, at the epoch the model is at;
- `restart()` gives the model's epoch (one past the last seen), and `probe()` of the new
  process equals the model's state after its restart: every slot at the model's
  generation, not live, no page, extent, batch or transfer, every pool's pages free;
- every handle issued before (request, extent, batch) is stale on both (H1).

The model is driven with the opens and closes the runtime served (all that survives a
restart: the epoch and the slot generations); the rest of the workload only decides where
the kill lands. The seed is printed; `CRASH_SEED=N` replays another.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter

import pytest

from cacheruntime.conformance.target import model_for
from cacheruntime.protocol import (
    Backup,
    BatchItem,
    BatchPlan,
    CacheRuntimeError,
    Restore,
    RuntimeFault,
    StaleHandle,
    TransferKind,
)
from cacheruntime.runtime.process import ProcessGPURuntime

KILLS = 200
SEED = int(os.environ.get("CRASH_SEED", "20"))
DETECTION_BOUND_S = 2.0


class Killer(threading.Thread):
    """SIGKILLs `pid` after `delay` seconds and notes when."""

    def __init__(self, pid: int, delay: float):
        super().__init__(daemon=True)
        self.pid, self.delay, self.at = pid, delay, None

    def run(self) -> None:
        time.sleep(self.delay)
        os.kill(self.pid, signal.SIGKILL)
        self.at = time.monotonic()


def workload(runtime: ProcessGPURuntime, model, rng: random.Random, issued: list) -> str:
    """Random boundary calls until one raises RuntimeFault (the kill), whose operation is returned;
    opens and closes go to the model too."""
    ps = runtime.info().page_size
    live: list = []
    extents: list = []
    previous: tuple = ()  # the last plan's items: a decode step prepares the very same tuple again (its short form)
    while True:
        roll = rng.random()
        try:
            if roll < 0.2 and len(live) < runtime.info().max_requests:
                request = runtime.open_request()
                assert model.open_request() == request
                live.append(request)
                issued.append(request)
            elif roll < 0.55 and live:
                if previous and rng.random() < 0.5 and all(item.request in live for item in previous):
                    items = previous
                else:
                    chosen = rng.sample(live, rng.randint(1, len(live)))
                    items = tuple(BatchItem(r, tuple(rng.randrange(100) for _ in range(rng.choice((1, 1, ps, 2 * ps))))) for r in chosen)
                previous = items
                intents = tuple(Backup(e) for e in extents[-1:]) if rng.random() < 0.5 else ()
                batch = runtime.prepare_batch(BatchPlan(items, intents))
                issued.append(batch)
                runtime.execute_batch(batch)
            elif roll < 0.65 and live:
                extent = runtime.publish(rng.choice(live), 0, 1)
                extents.append(extent)
                issued.append(extent)
            elif roll < 0.75 and extents:
                runtime.submit((rng.choice((Backup, Restore))(rng.choice(extents)),))
            elif roll < 0.85:
                runtime.poll_completions()
            elif roll < 0.9:
                runtime.wait_completions()
            elif live:
                request = live.pop(rng.randrange(len(live)))
                runtime.close_request(request)
                model.close_request(request)
        except RuntimeFault as fault:
            return str(fault).split(":")[0]
        except CacheRuntimeError:
            pass  # out of pages, a row full, an extent not backed up...: the workload only places the kill


def test_sigkill_at_random_points_is_runtime_lost_then_restart():
    print(f"crash test seed {SEED} ({KILLS} kills)")
    rng = random.Random(SEED)
    runtime = ProcessGPURuntime("cacheruntime.runtime.factories:conformance_threads")
    runtime.set_transfer_delay(0.002, TransferKind.RESTORE)
    runtime.set_transfer_delay(0.004, TransferKind.BACKUP)
    model = model_for(runtime.info())
    latencies = []
    where: Counter[str] = Counter()  # the call that met each kill
    try:
        for kill in range(KILLS):
            issued: list = []
            killer = Killer(runtime.pid, rng.uniform(0.0, 0.02))
            killer.start()
            where[workload(runtime, model, rng, issued)] += 1
            raised_at = time.monotonic()
            killer.join()
            latencies.append(max(0.0, raised_at - killer.at))
            assert latencies[-1] < DETECTION_BOUND_S, f"kill {kill}: RuntimeFault {latencies[-1]:.3f}s after the kill"
            epoch = model.info().epoch
            model.lose()
            for call in (runtime.open_request, runtime.poll_completions, runtime.wait_completions):
                with pytest.raises(RuntimeFault):
                    call()
            for call in (model.open_request, model.poll_completions, model.wait_completions):
                with pytest.raises(RuntimeFault):
                    call()
            assert runtime.info().epoch == epoch
            assert runtime.restart().epoch == model.restart().epoch == epoch + 1
            runtime.set_transfer_delay(0.002, TransferKind.RESTORE)
            runtime.set_transfer_delay(0.004, TransferKind.BACKUP)
            after, expected = runtime.probe(), model.probe()
            assert after.slots == expected.slots, f"kill {kill}"
            assert after.pages == after.extents == after.batches == after.transfers == ()
            assert [(p.tier, p.total, sorted(p.free)) for p in after.pools] == [(p.tier, p.total, sorted(p.free)) for p in expected.pools]
            for handle in issued:
                operation = {"RequestRuntimeHandle": "close_request", "CacheExtentRef": "release", "PreparedBatchHandle": "execute_batch"}[
                    type(handle).__name__
                ]
                for side in (runtime, model):
                    with pytest.raises(StaleHandle):
                        getattr(side, operation)(handle)
        assert runtime.short["prepare_batch"] and runtime.short["execute_batch"]  # the decode steps' short forms met kills too
    finally:
        runtime.close()
    print(
        f"{KILLS} kills: RuntimeFault at most {max(latencies) * 1000:.1f} ms after the kill (mean {sum(latencies) / len(latencies) * 1000:.1f} ms); calls that met the kill: {dict(where)}"
    )


def test_restart_twice_makes_every_older_handle_stale():
    runtime = ProcessGPURuntime("cacheruntime.runtime.factories:conformance_threads")
    try:
        handles = []
        for epoch in (0, 1):
            request = runtime.open_request()
            assert request.epoch == epoch
            handles.append(request)
            os.kill(runtime.pid, signal.SIGKILL)
            with pytest.raises(RuntimeFault):
                runtime.poll_completions()
            assert runtime.restart().epoch == epoch + 1
        fresh = runtime.open_request()
        assert (fresh.epoch, fresh.slot_id, fresh.generation) == (2, 0, 2)  # slot 0 was live at both kills: its generation grew twice
        for old in handles:
            with pytest.raises(StaleHandle):
                runtime.close_request(old)
        runtime.close_request(fresh)
    finally:
        runtime.close()
