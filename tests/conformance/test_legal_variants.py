"""The legal variants: each takes the freedom it names, and the suite passes every one.

The first tests show each variant really differs from the landed runtime where it says
(a variant that changed nothing would pass vacuously); the last runs
`cacheruntime conformance --legal` in the CI profile, as CI does.
"""

import time

import pytest

from cacheruntime.cli import main
from cacheruntime.conformance.variants import VARIANTS, Lanes, build
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Capability, Demote, Restore, Tier
from cacheruntime.runtime.device.simulated import SimEvent
from cacheruntime.runtime.device.streams import CpuEvent
from cacheruntime.runtime.factories import conformance

#: Cases per check for the CI run of the table: keeps the whole table within a few minutes on 2 cores.
LEGAL_EXAMPLES = 12


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


def test_every_legal_variant_passes_the_checks_it_claims(capsys):
    assert len(VARIANTS) >= 8
    assert main(["conformance", "--legal", "--max-examples", str(LEGAL_EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert f"{len(VARIANTS)}/{len(VARIANTS)} legal variants passed" in out
    for name in VARIANTS:
        assert name in out
