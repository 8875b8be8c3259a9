"""Ordering is real: with the delay knob, a runtime that skips a wait reads or writes wrong bytes.

Transfers are slowed (a sleep on the CPU transfer worker, `torch.cuda._sleep` on the CUDA
transfer stream) while compute goes ahead. The correct runtime still matches the model;
a subclass without the KV_READY wait serves a different token (compute read the restore's
destination before the H2D landed), and a subclass that frees a device page while its D2H
still reads it ends with a host copy holding another request's bytes (D1).
"""

from __future__ import annotations

import pytest
from runtimekit import PS, item, plan, twin_model

from cacheruntime.conformance.mutants.local import ReuseInFlight, SkipKvReadyWait
from cacheruntime.invariants import D1_copies_hold_last_write, check_state
from cacheruntime.protocol import Backup, Demote, OutOfPages, Restore
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime

DELAY = 0.2


@pytest.fixture(params=["threads", "simulated"])
def streams(request, device) -> str:
    """Worker threads (CPU) or CUDA streams, and on CPU the simulated streams too, where the knob orders the steps."""
    if request.param == "simulated" and device != "cpu":
        pytest.skip("simulated streams run on the CPU only")
    return request.param


#: Mutant: compute does not wait for the restores it reads (O1).
SkipsKvReady = SkipKvReadyWait
#: Mutant: a released page goes straight to the free list, even while a transfer uses it (O3).
FreesInFlight = ReuseInFlight


def restore_then_compute(runtime_class, device, streams):
    """Serve one token over a prefix restored from L2 with slow transfers: (served, model's token)."""
    rt = runtime_class(device=device, **CONFORMANCE_OPTIONS, streams=streams)
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
        if side is rt:
            rt.set_transfer_delay(DELAY)
        g = side.open_request()
        done = side.execute_batch(side.prepare_batch(plan(item(g, 1, attach=(prefix,)), intents=(Restore(prefix),))))
        tokens.append(done.items[0].next_token)
        side.wait_completions()
    rt.close()
    return tokens


def test_correct_ordering_serves_the_model_token(device, streams):
    served, expected = restore_then_compute(LocalGPURuntime, device, streams)
    assert served == expected


def test_skipping_the_kv_ready_wait_is_observed(device, streams):
    served, expected = restore_then_compute(SkipsKvReady, device, streams)
    assert served != expected, "compute ran before the H2D landed, yet read the right bytes"


def restore_release_and_reuse(runtime_class, device, streams):
    """Release a prefix while its slow H2D is in flight, then fill L1: the probe after all transfers.

    Write-back keeps a page's device copy until its backup lands, so a device page under a
    transfer is freed only when its page name ends: here the restore's destination. Reused
    at once (O3 broken), the late H2D lands on another request's freshly computed page.
    """
    rt = runtime_class(device=device, **CONFORMANCE_OPTIONS, streams=streams)
    h = rt.open_request()
    rt.execute_batch(rt.prepare_batch(plan(item(h, 2 * PS))))
    prefix = rt.publish(h, 0, 2)
    rt.close_request(h)
    rt.submit((Backup(prefix),))
    rt.wait_completions()
    rt.submit((Demote(prefix),))
    rt.set_transfer_delay(DELAY)
    rt.submit((Restore(prefix),))
    rt.release(prefix)  # the page names end with the H2D in flight
    g = rt.open_request()
    try:
        rt.execute_batch(rt.prepare_batch(plan(item(g, 12 * PS))))  # every device page, if it can get them
    except OutOfPages:
        pass  # the correct runtime keeps the two pages the H2D writes
    rt.wait_completions()
    state = rt.probe()
    rt.close()
    return state


def test_deferred_free_keeps_the_new_pages_intact(device, streams):
    state = restore_release_and_reuse(LocalGPURuntime, device, streams)
    check_state(state)


def test_freeing_a_page_under_a_d2h_is_observed(device, streams):
    state = restore_release_and_reuse(FreesInFlight, device, streams)
    assert D1_copies_hold_last_write(state), "the late H2D landed on pages another request computed, yet they are right"
