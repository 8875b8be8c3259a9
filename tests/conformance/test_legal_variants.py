"""The legal variants: each takes the freedom it names, and the suite passes every one.

The first tests show each variant really differs from the landed runtime where it says
(a variant that changed nothing would pass vacuously); the last runs
`cacheruntime conformance --legal` in the CI profile, as CI does.
"""

import time

import pytest

from cacheruntime.cli import main
from cacheruntime.conformance.storage import SuiteStore
from cacheruntime.conformance.variants import L3_CHECKS, VARIANTS, Lanes, build
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Capability, Demote, Persist, Restore, Tier
from cacheruntime.runtime.device.simulated import SimEvent
from cacheruntime.runtime.device.streams import CpuEvent
from cacheruntime.runtime.factories import conformance, conformance_l3

#: Cases per check for the CI run of the table: keeps the whole table within a few minutes on 2 cores
#: (`cacheruntime conformance --legal` without it runs the CI profile's full count).
LEGAL_EXAMPLES = 8


@pytest.fixture
def runtimes():
    made = []

    def make(name=None):
        rt = conformance() if name is None else build(name)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.close()


class PutLog(SuiteStore):
    """A suite store that logs the keys of every put it is asked for."""

    def __init__(self):
        super().__init__()
        self.puts = []

    def put(self, keys, sources):
        self.puts.append(tuple(keys))
        return super().put(keys, sources)


@pytest.fixture
def l3_runtimes():
    """Runtimes with L3 over a `PutLog` each: the landed one (`conformance_l3`) in a host mode, or a variant."""
    made = []

    def make(name=None, host_mode="resident"):
        store = PutLog()
        rt = conformance_l3(host_mode=host_mode, l3=store) if name is None else build(name, l3=store)
        made.append((rt, store))
        return rt, store

    yield make
    for rt, store in made:
        rt.close()
        store.close()


def published(rt, pages=2, extents=1):
    """A request computes `pages * extents` full pages and publishes them as `extents` extents; (request, refs)."""
    request = rt.open_request()
    tokens = tuple(range(2 * pages * extents))  # page_size 2
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, tokens),))))
    return request, [rt.publish(request, i * pages, pages) for i in range(extents)]


def until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_numbering_and_placement_differ_from_the_landed_runtime(runtimes):
    default, renumbered = runtimes(), runtimes("renumbered")
    assert published(default)[1][0].page_runs[0].first_page == 0
    _, (ref,) = published(renumbered)
    assert (ref.generation, [run.first_page for run in ref.page_runs]) == (7, [100, 103])

    def placement(rt):
        request = rt.open_request()
        rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, tuple(range(6))),))))
        rt.close_request(request)
        request = rt.open_request()
        rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1, 2)),))))
        return [phys for phys, _ in rt.probe().pools[0].mapped]

    assert placement(runtimes()) == [3]  # the oldest free page
    assert placement(runtimes("lifo")) == [9]  # the page freed last (the row took 11, 10, 9 and freed them in order)
    assert placement(runtimes("random_free")) != [3]


@pytest.mark.parametrize("name, polls", [("next_poll", [(), (1,)]), ("at_wait", [(), ()])])
def test_completions_are_reported_later(runtimes, name, polls):
    rt = runtimes(name)
    _, (ref,) = published(rt)
    (ticket,) = rt.submit((Backup(ref),))
    until(lambda: not rt.device_layer.launched or rt.device_layer.done([ticket.transfer_id]))
    assert [tuple(c.ticket.page_count for c in rt.poll_completions()) for _ in polls] == [tuple(p * 2 for p in poll) for poll in polls]
    assert [c.ticket for c in rt.wait_completions()] == ([ticket] if name == "at_wait" else [])


def test_restores_complete_out_of_issue_order(runtimes):
    rt = runtimes("restores_out_of_order")
    request, (first, second) = published(rt, pages=1, extents=2)
    rt.submit((Backup(first), Backup(second)))
    rt.wait_completions()
    rt.close_request(request)
    rt.submit((Demote(first), Demote(second)))
    lanes = rt.device_layer.h2d
    assert isinstance(lanes, Lanes) and lanes.current == 0
    blocker = CpuEvent() if rt.device_layer.schedule is None else SimEvent(rt.device_layer.schedule)
    lanes.streams[0].wait(blocker)  # the first lane stalls (a long copy, say)
    (a, b) = rt.submit((Restore(first), Restore(second)))
    reported = []
    until(lambda: reported.extend(rt.poll_completions()) or reported)
    assert [c.ticket for c in reported] == [b], "the second restore completes while the first is still copying"
    blocker.set()
    assert [c.ticket for c in rt.wait_completions()] == [a]


def test_more_streams_carry_the_transfers(runtimes):
    rt = runtimes("more_streams")
    assert len(rt.device_layer.h2d.streams) == 3 and len(rt.device_layer.d2h.streams) == 2
    _, refs = published(rt, pages=1, extents=2)
    rt.submit(tuple(Backup(ref) for ref in refs))
    assert sorted(c.ticket.transfer_id for c in rt.wait_completions()) == [0, 1]


def test_eager_free_frees_at_once_what_the_landed_runtime_defers(runtimes):
    def deferred_after_release(rt):
        request, (ref,) = published(rt)
        (ticket,) = rt.submit((Backup(ref),))
        until(lambda: rt.device_layer.done([ticket.transfer_id]))
        rt.close_request(request)
        rt.release(ref)
        return {pool.tier: len(pool.deferred) for pool in rt.probe().pools}

    assert deferred_after_release(runtimes()) == {Tier.L1: 2, Tier.L2: 2}
    assert deferred_after_release(runtimes("eager_free")) == {Tier.L1: 0, Tier.L2: 0}


def test_opaque_claims_no_introspection(runtimes):
    assert Capability.INTROSPECTION not in runtimes("opaque").info().capabilities
    assert Capability.INTROSPECTION in runtimes("combined").info().capabilities


def test_l3_staging_is_taken_last_freed_first(l3_runtimes):
    """buffer_only: a second persist stages in the host pages the first one freed last, not in the oldest free ones."""

    def staging_of_two_persists(rt, store):
        _, (ref,) = published(rt)
        staged = []
        for _ in range(2):
            (ticket,) = rt.submit((Persist(ref, store.fresh_keys(2)),))
            staged.append(sorted(staging for _, _, staging in rt.ledger.state.transfers[ticket.transfer_id].pages))
            rt.wait_completions()
        return staged

    landed = staging_of_two_persists(*l3_runtimes(host_mode="buffer_only"))
    lifo = staging_of_two_persists(*l3_runtimes("l3_lifo_staging"))
    assert landed == [[0, 1], [2, 3]]  # the oldest free host pages
    assert lifo[1] == lifo[0] != landed[0]  # the pages the first persist freed


def test_l3_objects_are_put_one_per_call_last_first(l3_runtimes):
    def puts_of_one_persist(rt, store):
        _, (ref,) = published(rt)
        rt.submit((Backup(ref),))
        rt.wait_completions()
        keys = store.fresh_keys(2)
        rt.submit((Persist(ref, keys),))
        rt.wait_completions()
        return keys, store.puts

    keys, puts = puts_of_one_persist(*l3_runtimes())
    assert puts == [keys]
    keys, puts = puts_of_one_persist(*l3_runtimes("l3_store_lanes"))
    assert puts == [(keys[1],), (keys[0],)]


def test_l3_persists_complete_out_of_issue_order_on_storage_lanes(l3_runtimes):
    rt, store = l3_runtimes("l3_store_lanes")
    _, refs = published(rt, pages=1, extents=2)
    rt.submit(tuple(Backup(ref) for ref in refs))
    rt.wait_completions()
    lanes = rt.device_layer.l3.stream
    assert isinstance(lanes, Lanes) and lanes.current == 0
    blocker = CpuEvent() if rt.device_layer.schedule is None else SimEvent(rt.device_layer.schedule)
    lanes.streams[0].wait(blocker)  # the first lane stalls (a slow store write, say)
    a, b = rt.submit(tuple(Persist(ref, store.fresh_keys(1)) for ref in refs))
    until(lambda: rt.device_layer.done([b.transfer_id])[0])
    assert not rt.device_layer.done([a.transfer_id])[0], "the second persist lands while the first is still writing"
    assert rt.poll_completions() == ()  # reported only at wait
    blocker.set()
    assert [c.ticket for c in rt.wait_completions()] == [a, b]


def test_l3_combined_takes_its_lanes():
    rt = build("l3_combined")
    try:
        layer = rt.device_layer
        assert isinstance(layer.l3.stream, Lanes) and isinstance(layer.h2d, Lanes) and Capability.L2 not in rt.info().capabilities
    finally:
        rt.close()


def test_every_legal_variant_passes_the_checks_it_claims(capsys):
    assert len(VARIANTS) >= 8
    assert sum(variant.checks == L3_CHECKS for variant in VARIANTS.values()) >= 2  # the storage check has legal variants of its own
    assert main(["conformance", "--legal", "--max-examples", str(LEGAL_EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert f"{len(VARIANTS)}/{len(VARIANTS)} legal variants passed" in out
    for name in VARIANTS:
        assert name in out
