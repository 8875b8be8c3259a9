"""The D2H throttle: backups issued one piece per batch (or poll) keep every semantic.

A runtime whose throttle moves one page per piece (`d2h_bytes_per_batch=1`) is driven
through the twin (scenarios that depend on a backup in flight, and the seeded random
walk): results, errors and abstract states must stay the model's, `wait_completions`
must drain every queued piece, and a restore that reads a queued backup's host copy
issues that backup first.
"""

from __future__ import annotations

import random

import pytest
from runtimekit import PS, Twin, item, plan
from test_runtime_twin import random_walk

from cacheruntime.protocol import Backup, BatchPlan, CopyState, Demote, Restore, TransferKind
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import D2H_ISSUE_POINTS, LocalGPURuntime


def throttled_twin(device: str, d2h_issue: str = "after_compute") -> Twin:
    return Twin(LocalGPURuntime(device=device, **CONFORMANCE_OPTIONS, d2h_bytes_per_batch=1, d2h_issue=d2h_issue))


@pytest.fixture
def twin(device):
    t = throttled_twin(device)
    yield t
    t.runtime.close()


def published(t: Twin, pages: int):
    h = t.open_request()
    t.execute_batch(t.prepare_batch(plan(item(h, pages * PS))))
    return h, t.publish(h, 0, pages)


def test_backup_is_issued_piecewise_and_wait_drains(twin):
    h, e = published(twin, 4)
    twin.submit((Backup(e),))  # the first page's piece now, the rest later
    assert len(twin.runtime.device_layer.throttle.queue) == 3
    twin.poll_completions()  # no batch since: one more piece
    assert len(twin.runtime.device_layer.throttle.queue) == 2
    twin.execute_batch(twin.prepare_batch(plan(item(h, 1))))  # one piece per batch
    assert len(twin.runtime.device_layer.throttle.queue) == 1
    done = twin.wait_completions()
    assert not twin.runtime.device_layer.throttle.queue and len(done) == 1


def test_restore_while_its_backup_is_queued_keeps_the_device_copies(twin):
    h, e = published(twin, 4)
    twin.close_request(h)
    twin.submit((Backup(e),))
    twin.submit((Demote(e),))  # the backup is still queued: the device copies stay, dropping
    assert twin.runtime.device_layer.throttle.queue
    assert {p.l1 for p in twin.runtime.probe().pages} == {CopyState.DROPPING}
    g = twin.open_request()
    done = twin.execute_batch(twin.prepare_batch(plan(item(g, 1, attach=(e,)), intents=(Restore(e),))))
    assert done.items[0].num_tokens == 4 * PS + 1  # the tags read back are the model's
    twin.wait_completions()
    assert {(p.l1, p.l2) for p in twin.runtime.probe().pages[:4]} == {(CopyState.VALID, CopyState.VALID)}


def test_unthrottled_issues_at_once(device):
    rt = LocalGPURuntime(device=device, **CONFORMANCE_OPTIONS, d2h_bytes_per_batch=None)
    h = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((item(h, 4 * PS),))))
    x = rt.publish(h, 0, 4)
    (ticket,) = rt.submit((Backup(x),))
    assert rt.device_layer.throttle is None and ticket.transfer_id in rt.device_layer.launched
    assert len(rt.wait_completions()) == 1
    rt.close()
    with pytest.raises(ValueError):
        LocalGPURuntime(device=device, d2h_bytes_per_batch=0)
    with pytest.raises(ValueError):
        LocalGPURuntime(device=device, d2h_issue="before_prepare")


@pytest.mark.parametrize("seed", range(8))
def test_random_walk_throttled_matches_model(seed, device):
    t = throttled_twin(device)
    t.runtime.set_transfer_delay(0.002 if seed % 2 else 0.0)
    random_walk(t, random.Random(1000 + seed), 80)
    t.wait_completions()
    assert not t.runtime.device_layer.throttle.queue
    t.runtime.close()


@pytest.mark.parametrize("d2h_issue", D2H_ISSUE_POINTS)
def test_every_issue_point_issues_one_piece_per_batch_and_keeps_the_models_semantics(d2h_issue, device):
    """Where `execute_batch` issues its piece changes only when the D2H runs: the pieces go one
    per batch, and the backed-up pages, demoted and restored, read back the model's tags."""
    t = throttled_twin(device, d2h_issue)
    t.runtime.set_transfer_delay(0.005, TransferKind.BACKUP)
    h, e = published(t, 4)
    t.close_request(h)
    t.submit((Backup(e),))  # one piece now, three queued
    g = t.open_request()
    for queued in (2, 1, 0):
        t.execute_batch(t.prepare_batch(plan(item(g, 1))))
        assert len(t.runtime.device_layer.throttle.queue) == queued
    t.wait_completions()
    t.submit((Demote(e),))
    r = t.open_request()
    done = t.execute_batch(t.prepare_batch(plan(item(r, 1, attach=(e,)), intents=(Restore(e),))))
    assert done.items[0].num_tokens == 4 * PS + 1
    t.wait_completions()
    t.runtime.close()
