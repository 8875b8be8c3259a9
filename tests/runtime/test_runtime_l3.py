"""The runtime's L3 tier against the reference model (spec/protocol.md §9, S1-S3), on directed sequences.

Each test drives `LocalGPURuntime(l3=FaultyStore(FileStore(dir)), host_mode=...)` and
`ReferenceModel(l3=True, host_mode=...)` with the same calls (`runtimekit.Twin`: equal results or
error types, equal abstract states after every call, objects and page keys included), on CPU
worker threads and on simulated streams. The store's environment moves are mirrored on the model:
an object evicted behind the runtime's back is `remove_object`, a store failure `fail_transfer`.
"""

from __future__ import annotations

import time

import pytest
from runtimekit import Twin, item, plan, twin_model

from cacheruntime.invariants import S1_host_pages_only_stage
from cacheruntime.protocol import (
    Backup,
    ComputeFailed,
    Fetch,
    HostMode,
    InvalidPlan,
    NoL2,
    NoL3,
    Persist,
    Tier,
    TransferFailure,
    TransferKind,
)
from cacheruntime.runtime.factories import conformance_options
from cacheruntime.runtime.local import LocalGPURuntime
from cacheruntime.storage import FaultyStore, FileStore, Op

MODES = ["resident", "buffer_only"]
#: CPU worker threads, CPU simulated streams, and CUDA streams (marked `cuda`: skipped without a
#: GPU; scripts/gpu_check.sh runs them), where a fetch's H2D is issued by the storage step.
STREAMS = ["threads", "simulated", "cuda"]
KEYS = ("p0", "p1")


class L3Twin(Twin):
    """The twin with the model's L3 tier; a failed L3 completion is the model's `fail_transfer`."""

    def __init__(self, runtime: LocalGPURuntime, mode: str):
        self.runtime = runtime
        self.model = twin_model(runtime, l3=True, host_mode=HostMode(mode))
        self.model.info()

    def _poll(self):
        done = self.runtime.poll_completions()
        for completion in done:
            if completion.ticket.transfer_id in self.model.state.transfers:
                if completion.failure is TransferFailure.STORE:
                    self.model.fail_transfer(completion.ticket.transfer_id)
                else:
                    self.model.complete_transfer(completion.ticket.transfer_id)
        assert self.model.poll_completions() == done
        self.check()
        return done

    def settle(self):
        """Poll until the runtime has no transfer in flight; every completion reported."""
        reported = []
        while self.runtime.ledger.state.transfers:
            reported += self._poll()
            time.sleep(0.001)
        return reported + list(self._poll())


def new_l3twin(tmp_path, mode: str, streams: str) -> L3Twin:
    store = FaultyStore(FileStore(tmp_path / "l3"))
    where = {"device": "cuda", "streams": "threads"} if streams == "cuda" else {"streams": streams}
    twin = L3Twin(LocalGPURuntime(**conformance_options(), **where, l3=store, host_mode=mode), mode)
    twin.store, twin.mode = store, mode
    return twin


@pytest.fixture(
    params=[pytest.param((m, s), marks=[pytest.mark.cuda] if s == "cuda" else []) for m in MODES for s in STREAMS],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def l3twin(request, tmp_path):
    twin = new_l3twin(tmp_path, *request.param)
    yield twin
    twin.runtime.close()


def persisted(t: L3Twin):
    """A request that computed two pages, published as an extent, persisted under KEYS (landed)."""
    r = t.open_request()
    t.execute_batch(t.prepare_batch(plan(item(r, 4))))
    extent = t.publish(r, 0, 2)
    if t.mode == "resident":
        t.submit((Backup(extent),))
        t.settle()
    (ticket,) = t.submit((Persist(extent, KEYS),))
    assert ticket.kind is TransferKind.PERSIST and ticket.page_count == 2
    return r, extent, ticket


def fetch_step(t: L3Twin, keys=KEYS):
    r = t.open_request()
    return r, t.prepare_batch(plan(item(r, 1, start=9), intents=(Fetch(r, keys),)))


#: A fetch reads a chunk of objects per store request and copies each chunk as its read lands:
#: in one-page chunks a hit lands page by page, and a miss of the second key comes after the
#: first chunk was copied.
CHUNKS = pytest.mark.parametrize("one_page_chunks", [False, True], ids=["one-chunk", "page-chunks"])


def _chunked(t: L3Twin, one_page_chunks: bool) -> None:
    if one_page_chunks:
        t.runtime.device_layer.l3.fetch_chunk_pages = 1


@CHUNKS
def test_persist_then_fetch_hits(l3twin, one_page_chunks):
    t = l3twin
    _chunked(t, one_page_chunks)
    r, extent, ticket = persisted(t)
    (done,) = t.settle()
    assert done.ticket == ticket and done.failure is None
    assert {o.key for o in t.runtime.probe().objects} == set(KEYS)
    assert t.l3_exists((*KEYS, "absent")) == (True, True, False)
    t.close_request(r)
    t.release(extent)
    r2, batch = fetch_step(t)
    completion = t.execute_batch(batch)  # the tagged runner's token digests the fetched bytes: equal to the model's
    assert completion.items[0].num_tokens == 5
    (fetched,) = t.settle()
    assert fetched.ticket.kind is TransferKind.FETCH and fetched.failure is None


@CHUNKS
def test_fetch_of_a_removed_object_misses_and_the_batch_fails(l3twin, one_page_chunks):
    t = l3twin
    _chunked(t, one_page_chunks)
    r, extent, _ = persisted(t)
    t.settle()
    t.store.evict(KEYS[1:])  # another runtime sharing the store removed it: l3_exists was a hint
    t.model.remove_object(KEYS[1])
    r2, batch = fetch_step(t)
    with pytest.raises(ComputeFailed):
        t.execute_batch(batch)
    (missed,) = t.settle()
    assert missed.failure is TransferFailure.MISS
    # control falls back to recompute: the same request, the tokens as input
    t.execute_batch(t.prepare_batch(plan(item(r2, 5, start=1))))


def test_a_failed_store_write_reports_store_and_keeps_every_copy(l3twin):
    t = l3twin
    t.store.fail_nth(Op.PUT, 1)
    r, extent, ticket = persisted(t)
    (failed,) = t.settle()
    assert failed.ticket == ticket and failed.failure is TransferFailure.STORE
    assert not t.runtime.probe().objects
    t.execute_batch(t.prepare_batch(plan(item(r, 1, start=7))))  # the device copies were kept (F1)


@pytest.mark.parametrize("mode", MODES)
def test_staging_is_freed_only_after_the_store_write(mode, tmp_path):
    """On worker threads: a held store step would stall a simulated schedule, whose turn it blocks."""
    t = new_l3twin(tmp_path, mode, "threads")
    t.store.hold(Op.PUT)
    r, extent, _ = persisted(t)
    state = t.runtime.probe()
    (persist,) = state.transfers
    host = next(p for p in state.pools if p.tier is Tier.L2)
    if t.mode == "buffer_only":
        assert set(persist.destinations) <= set(host.deferred) and not set(persist.destinations) & set(host.free)  # S2
        assert not S1_host_pages_only_stage(state)
    t.store.release(Op.PUT)
    t.settle()
    host = next(p for p in t.runtime.probe().pools if p.tier is Tier.L2)
    assert not host.deferred
    t.runtime.close()


@pytest.mark.parametrize("mode", MODES)
def test_device_pages_released_under_an_l3_transfer_are_freed_when_it_lands(mode, tmp_path):
    """A device page whose name ends while an L3 transfer uses it (an extent released under its
    buffer_only persist's D2H; a fetch whose batch is cancelled) is deferred behind the transfer
    and freed when it lands, as when it fails (O3): found by the legal L3 variants."""
    t = new_l3twin(tmp_path, mode, "threads")
    t.store.hold(Op.PUT)
    r, extent, _ = persisted(t)
    t.close_request(r)
    t.release(extent)
    t.store.release(Op.PUT)
    t.settle()
    # The fetch on the runtime alone: probe() reads the store's objects, which a held get blocks.
    rt = t.runtime
    t.store.hold(Op.GET)
    r2 = rt.open_request()
    rt.cancel_batch(rt.prepare_batch(plan(item(r2, 1, start=9), intents=(Fetch(r2, KEYS),))))
    rt.close_request(r2)
    t.store.release(Op.GET)
    rt.wait_completions()
    device = next(p for p in rt.probe().pools if p.tier is Tier.L1)
    assert not device.deferred and len(device.free) == device.total
    rt.close()


def test_restart_keeps_the_store(l3twin):
    t = l3twin
    persisted(t)
    t.settle()
    t.restart()
    r, batch = fetch_step(t)
    t.execute_batch(batch)
    (fetched,) = t.settle()
    assert fetched.failure is None


def test_l3_intents_are_refused_where_they_do_not_apply(l3twin, tmp_path):
    t = l3twin
    r, extent, _ = persisted(t)
    t.settle()
    with pytest.raises(InvalidPlan):
        t.submit((Fetch(r, KEYS),))
    with pytest.raises(InvalidPlan):
        t.submit((Persist(extent, KEYS[:1]),))  # one key per page
    if t.mode == "buffer_only":
        with pytest.raises(NoL2):
            t.submit((Backup(extent),))
    plain = LocalGPURuntime(**conformance_options())
    try:
        with pytest.raises(NoL3):
            plain.l3_exists(KEYS)
        assert plain.capabilities == LocalGPURuntime(**conformance_options()).capabilities
    finally:
        plain.close()


def test_bad_l3_specs_and_modes_are_one_line_errors():
    with pytest.raises(ValueError, match="file:DIR"):
        LocalGPURuntime(l3="nfs:/x")
    with pytest.raises(ValueError, match="buffer_only"):
        LocalGPURuntime(host_mode="buffer_only")
