"""Every fault site of spec/faults.md on LocalGPURuntime: the typed outcome, and nothing lost.

Each test injects one fault (FAULT_INJECTION) at one site, on thread and simulated streams,
and holds the runtime to the spec's outcome: a failed completion with its destination
absent and its source readable (F1), a failed batch with nothing visible (F2), or
RuntimeFault on every call until restart; and after each, the runtime serves again and
its state satisfies every invariant. The reference model, given the same calls and the
same injection, says the same (a twin run in each test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch
from runtimekit import PS, item, plan, twin_model

from cacheruntime.invariants import F2_failed_batch_invisible, check_state
from cacheruntime.protocol import (
    Backup,
    ComputeFailed,
    CopyState,
    Demote,
    FaultKind,
    InvalidArgument,
    Restore,
    RuntimeFault,
    TransferFailure,
)
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime

#: The backends of spec/faults.md: CPU worker threads, CPU simulated streams, CUDA streams
#: (skipped without CUDA; the GPU script runs them).
STREAMS = ["threads", "simulated", pytest.param("cuda", marks=pytest.mark.cuda)]


def runtime(streams: str) -> LocalGPURuntime:
    if streams == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA")
        return LocalGPURuntime(**CONFORMANCE_OPTIONS, device="cuda")
    return LocalGPURuntime(**CONFORMANCE_OPTIONS, streams=streams)


def published(side, pages=2):
    """A request that computed `pages` full pages and published them: (request, extent)."""
    h = side.open_request()
    side.execute_batch(side.prepare_batch(plan(item(h, pages * PS))))
    return h, side.publish(h, 0, pages)


def copies(side) -> list[tuple[CopyState, CopyState]]:
    return [(p.l1, p.l2) for p in side.probe().pages]


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("site", ["issue", "stream"])
def test_a_failed_backup_under_a_demote_leaves_the_device_copy_valid(streams, site):
    rt = runtime(streams)
    model = twin_model(rt)
    tokens = []
    for side in (rt, model):
        h, x = published(side)
        side.close_request(h)
        if side is rt:
            rt.inject_fault(FaultKind.BACKUP, 1, site=site)
        else:
            model.inject_fault(FaultKind.BACKUP, 1)
        side.submit((Backup(x), Demote(x)))
        assert copies(side) == [(CopyState.DROPPING, CopyState.FILLING)] * 2  # write-back: kept until the backup lands
        (done,) = side.wait_completions()
        assert done.failure is TransferFailure.COPY
        assert copies(side) == [(CopyState.VALID, CopyState.ABSENT)] * 2  # the demote is undone: nothing lost (F1)
        check_state(side.probe())
        g = side.open_request()  # and the prefix still serves from L1
        served = side.execute_batch(side.prepare_batch(plan(item(g, 1, attach=(x,)))))
        assert served.items[0].num_tokens == 2 * PS + 1
        tokens.append(served.items[0].next_token)
    assert tokens[0] == tokens[1]  # D1: the copy kept serves the bytes last written
    rt.close()


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("site", ["issue", "stream"])
def test_a_failed_restore_read_at_kv_ready_fails_the_batch_and_keeps_the_host_copy(streams, site):
    rt = runtime(streams)
    h, x = published(rt)
    rt.submit((Backup(x),))
    rt.wait_completions()
    rt.close_request(h)
    rt.submit((Demote(x),))
    rt.inject_fault(FaultKind.RESTORE, 1, site=site)
    g = rt.open_request()
    batch = rt.prepare_batch(plan(item(g, 1, attach=(x,)), intents=(Restore(x),)))
    with pytest.raises(ComputeFailed) as failure:
        rt.execute_batch(batch)
    assert failure.value.batches == (batch.batch_id,)
    state = rt.probe()
    assert state.slots[g.slot_id].num_tokens == 0 and state.slots[g.slot_id].pages == ()  # F2: as before the batch
    assert copies(rt) == [(CopyState.ABSENT, CopyState.VALID)] * 2  # the destination is gone, the source intact
    check_state(state)
    (done,) = rt.poll_completions() or rt.wait_completions()
    assert done.failure is TransferFailure.COPY
    # control prepares the items again: the restore now lands
    again = rt.execute_batch(rt.prepare_batch(plan(item(g, 1, attach=(x,)), intents=(Restore(x),))))
    assert again.items[0].num_tokens == 2 * PS + 1
    check_state(rt.probe())
    rt.close()


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("site", ["before_writes", "after_writes"])
def test_a_runner_that_raises_fails_the_batch_with_nothing_visible(streams, site):
    rt = runtime(streams)
    h = rt.open_request()
    rt.execute_batch(rt.prepare_batch(plan(item(h, PS + 1))))
    before = rt.probe()
    rt.inject_fault(FaultKind.COMPUTE, 1, site=site)
    batch = rt.prepare_batch(plan(item(h, PS)))
    with pytest.raises(ComputeFailed):
        rt.execute_batch(batch)
    after = rt.probe()
    assert after.slots[h.slot_id] == before.slots[h.slot_id]  # row and lengths as before the batch (F2)
    assert F2_failed_batch_invisible(before, after) == []  # every written tag as it was (after_writes: only unwritten ones moved)
    check_state(after)
    done = rt.execute_batch(rt.prepare_batch(plan(item(h, PS))))  # served again, without a restart
    assert done.items[0].num_tokens == 2 * PS + 1
    rt.close()


@pytest.mark.parametrize("streams", STREAMS)
def test_a_dead_stream_worker_is_found_at_once_and_restart_recovers(streams):
    rt = runtime(streams)
    h, x = published(rt)
    rt.inject_fault(FaultKind.LOST, 1)
    rt.submit((Backup(x),))  # the D2H worker dies running this copy
    done = threading.Event()

    def wait() -> None:
        with pytest.raises(RuntimeFault):
            rt.wait_completions()  # never blocks forever on a dead worker
        done.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join()
    assert done.is_set()
    for call, args in ((rt.open_request, ()), (rt.poll_completions, ()), (rt.close_request, (h,))):
        with pytest.raises(RuntimeFault):
            call(*args)
    info = rt.restart()
    assert info.epoch == 1
    g = rt.open_request()
    assert rt.execute_batch(rt.prepare_batch(plan(item(g, PS)))).items[0].num_tokens == PS
    y = rt.publish(g, 0, 1)
    rt.submit((Backup(y),))
    assert [c.failure for c in rt.wait_completions()] == [None]  # the new streams move copies again
    check_state(rt.probe())
    rt.close()


def test_the_model_and_the_runtime_agree_on_a_fault_sequence():
    """The same calls and injections on the runtime and its model give the same outcomes and states."""
    rt = runtime("simulated")
    model = twin_model(rt)
    outcomes = {}
    for side in (rt, model):
        seen = []
        h, x = published(side, 3)
        side.close_request(h)
        side.inject_fault(FaultKind.BACKUP, 2)
        side.submit((Backup(x),))
        seen.append([c.failure for c in side.wait_completions()])
        k, y = published(side, 2)
        side.close_request(k)
        side.submit((Backup(y), Demote(y)))
        seen.append([c.failure for c in side.wait_completions()])
        seen.append(copies(side))
        side.inject_fault(FaultKind.COMPUTE, 1)
        g = side.open_request()
        with pytest.raises(ComputeFailed):
            side.execute_batch(side.prepare_batch(plan(item(g, 3))))
        slot = side.probe().slots[g.slot_id]
        seen.append((slot.live, slot.pages, slot.num_tokens, slot.reserved_tokens))
        outcomes[side is rt] = seen
    assert outcomes[True] == outcomes[False]
    rt.close()


def test_inject_fault_checks_its_arguments():
    rt = runtime("simulated")
    for args, kwargs in (((FaultKind.BACKUP, 0), {}), ((FaultKind.BACKUP, 1.5), {}), (("backup", 1), {}), ((FaultKind.COMPUTE, 1), {"site": "issue"})):
        with pytest.raises(InvalidArgument):
            rt.inject_fault(*args, **kwargs)
    rt.close()


def test_a_host_pool_that_cannot_be_allocated_is_a_clear_error():
    """The host pool's pinned allocation failing (too large) names the option, before anything runs."""
    with pytest.raises((ValueError, MemoryError, RuntimeError)) as error:
        LocalGPURuntime(**{**CONFORMANCE_OPTIONS, "l2_pages": 1 << 60})
    assert "l2_pages" in str(error.value)


@pytest.mark.parametrize("streams", STREAMS)
def test_a_restore_that_failed_before_the_execute_fails_the_batch_that_reads_it(streams):
    """The restore fails and is reported at a poll before its batch executes: compute must not run over
    the missing pages (found by the fault soak: the runtime served a wrong token there)."""
    rt = runtime(streams)
    model = twin_model(rt)
    for side in (rt, model):
        h, x = published(side)
        side.submit((Backup(x),))
        side.wait_completions()
        side.close_request(h)
        side.submit((Demote(x),))
        side.inject_fault(FaultKind.RESTORE, 1)
        g = side.open_request()
        batch = side.prepare_batch(plan(item(g, 1, attach=(x,)), intents=(Restore(x),)))
        (done,) = side.wait_completions()  # reported failed before the execute
        assert done.failure is TransferFailure.COPY
        with pytest.raises(ComputeFailed):
            side.execute_batch(batch)
        assert side.probe().slots[g.slot_id].num_tokens == 0
        check_state(side.probe())
    rt.close()


#: Run in a process of its own: a sticky CUDA error breaks the context for the whole process.
BROKEN_DEVICE = r"""
import json, torch
from cacheruntime.protocol import BatchItem, BatchPlan, RuntimeFault
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime

runtime = LocalGPURuntime(**CONFORMANCE_OPTIONS, device="cuda")
request = runtime.open_request()
runtime.execute_batch(runtime.prepare_batch(BatchPlan((BatchItem(request, (1, 2, 3)),))))
x = torch.zeros(4, device="cuda")
x[torch.tensor([64], device="cuda")] = 1.0  # a device-side assert, asynchronous and sticky
try:
    torch.cuda.synchronize()  # the assert has fired before the runtime's next call, whatever the timing
    trigger = "no error"
except RuntimeError as error:
    trigger = type(error).__name__
outcomes = [["trigger", trigger, ""]]
batch = runtime.prepare_batch(BatchPlan((BatchItem(request, (4,)),)))  # bookkeeping only: no CUDA call yet
calls = [
    ("execute_batch", lambda: runtime.execute_batch(batch)),
    ("open_request", runtime.open_request),
    ("poll_completions", runtime.poll_completions),
    ("restart", runtime.restart),
    ("info", lambda: runtime.info().epoch),
]
for name, call in calls:
    try:
        outcomes.append([name, "returned", str(call())[:80]])
    except RuntimeFault as error:
        outcomes.append([name, "RuntimeFault", str(error)])
    except BaseException as error:
        outcomes.append([name, "untyped " + type(error).__name__, str(error)[:200]])
print("OUTCOMES " + json.dumps(outcomes))
"""


@pytest.mark.cuda
def test_a_broken_cuda_device_is_a_runtime_fault_that_restart_does_not_hide():
    """A sticky asynchronous CUDA error (a device-side assert) breaks the context. The first call
    that touches the device raises RuntimeFault, not the untyped CUDA error or ComputeFailed
    (calls that only keep books, like `prepare_batch`, cannot see it before: CUDA reports it at
    the next CUDA call); so does every later call but `info`; `restart` raises RuntimeFault
    too, saying only a new process recovers."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    proc = subprocess.run([sys.executable, "-c", BROKEN_DEVICE], capture_output=True, text=True, env=env, timeout=300)
    line = next((line for line in proc.stdout.splitlines() if line.startswith("OUTCOMES ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-3000:]
    outcomes = {name: (kind, text) for name, kind, text in json.loads(line[len("OUTCOMES ") :])}
    print(outcomes)
    for name in ("execute_batch", "open_request", "poll_completions"):
        assert outcomes[name][0] == "RuntimeFault", (name, outcomes[name])
    assert "CUDA device is broken" in outcomes["execute_batch"][1] and "new process" in outcomes["execute_batch"][1]
    assert outcomes["restart"][0] == "RuntimeFault" and "new process" in outcomes["restart"][1]
    assert outcomes["info"][0] == "returned" and outcomes["trigger"][0] != "no error"
