"""The SGLang adapter: it runs the protocol's flows on SGLang's classes, and it forwards
what SGLang cannot reject (so a conformance run sees SGLang's gaps, not the adapter's)."""

from __future__ import annotations

import pytest
from _sglang_env import HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from cacheruntime.protocol import (
    Backup,
    BatchItem,
    BatchPlan,
    Capability,
    Demote,
    OutOfPages,
    OutOfSlots,
    Restore,
    RuntimeInterface,
    Unsupported,
)
from conformance.adapters.sglang.adapter import make_runtime

pytestmark = pytest.mark.needs_sglang


def test_is_a_runtime_and_claims_only_what_it_has():
    rt = make_runtime()
    assert isinstance(rt, RuntimeInterface)
    assert rt.info().capabilities == frozenset({Capability.L2, Capability.INTROSPECTION})
    with pytest.raises(Unsupported):
        rt.restart()


def test_backup_demote_restore_attach_round_trip_keeps_bytes():
    rt = make_runtime(page_size=4, l1_pages=8, l2_pages=8)
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),))))
    x = rt.publish(a, 0, 2)
    kv = rt.sg.kv_pool.k_buffer[0]
    before = rt._device_indices(rt.extents[x.generation].pages)
    kv[before] = 42.0
    (ticket,) = rt.submit((Backup(x),))
    assert [c.ticket for c in rt.wait_completions()] == [ticket]
    rt.close_request(a)
    rt.submit((Demote(x),))
    rt.submit((Restore(x),))
    rt.wait_completions()
    after = rt._device_indices(rt.extents[x.generation].pages)
    assert bool((kv[after] == 42.0).all())
    b = rt.open_request()
    done = rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(b, (1,), attach=(x,)),))))
    assert done.items[0].num_tokens == 9


def test_exhaustion_is_translated_to_typed_errors():
    rt = make_runtime(max_requests=1, l1_pages=2, l2_pages=0)
    a = rt.open_request()
    with pytest.raises(OutOfSlots):
        rt.open_request()
    with pytest.raises(OutOfPages):
        rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(12))),)))


def test_scenario4_stale_close_is_refused_by_req_to_token_pool_free():
    """Scenario 4 on SGLang: A's late close reaches ReqToTokenPool.free(A's Req), whose assert refuses it before B's row changes."""
    rt = make_runtime(max_requests=2)
    a = rt.open_request()
    rt.close_request(a)
    b = rt.open_request()
    assert b.slot_id == a.slot_id and b.generation == a.generation + 1  # H2 holds
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(b, (1, 2, 3)),))))
    free_pages, free_rows = rt.sg.allocator.available_size(), list(rt.sg.req_to_token_pool.free_slots)
    with pytest.raises(AssertionError, match="request must have req_pool_idx"):
        rt.close_request(a)  # stale: SGLang's own check, an assert rather than StaleHandle
    assert rt.sg.allocator.available_size() == free_pages and rt.sg.req_to_token_pool.free_slots == free_rows


def test_a_second_release_reaches_the_tree_and_the_allocator():
    """A released extent's ref, released again, reaches its RadixCache entry: the pages go on the free list twice (S1, S6)."""
    rt = make_runtime(page_size=4, l1_pages=4, l2_pages=0)
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),))))
    x = rt.publish(a, 0, 2)
    rt.close_request(a)
    rt.release(x)
    assert rt.sg.allocator.available_size() == 16
    with pytest.raises(AssertionError, match="parent does not have child key"):
        rt.release(x)  # RadixCache._delete_leaf asserts, after free_segment freed the pages again
    assert rt.sg.allocator.available_size() == 24  # 4 pages of 4 tokens, 6 on the free list


def test_a_handle_is_never_issued_twice_and_a_closed_one_never_names_a_live_request():
    """SGLang's rows rotate last-in first-out with a generation per row (report F6); the handles still never repeat.

    The report's F6 case, short: two rows alternate under slot name 0, so the row's own
    generation would repeat a handle; the adapter names each row use (SGLang's pair (row,
    req_generation)) with the slot name's next generation, and a closed handle reaches its own
    finished Req, which ReqToTokenPool.free refuses.
    """
    rt = make_runtime(max_requests=3)
    issued = []
    for _ in range(4):
        a = rt.open_request()
        b = rt.open_request()
        rt.close_request(a)
        c = rt.open_request()  # slot 0 again, on the row b did not take
        rt.close_request(b)
        rt.close_request(c)
        issued += [a, b, c]
    assert len(set(issued)) == len(issued)
    assert [h.generation for h in issued if h.slot_id == 0] == list(range(8))
    live = rt.open_request()
    for old in issued:
        with pytest.raises(AssertionError, match="request must have req_pool_idx"):
            rt.close_request(old)
    rt.close_request(live)


@pytest.mark.parametrize("tree", ["unified-rust", "unified-python"])
def test_a_stale_unlock_on_the_unified_trees_carries_no_receipt(tree):
    """A split's original holds no lock (its receipt passed to the rest): its release passes the empty receipt, which SGLang refuses."""
    rt = make_runtime(tree=tree, l2_pages=0)
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),))))
    x = rt.publish(a, 0, 2)
    head, rest = rt.split(x, 1)
    with pytest.raises((AssertionError, RuntimeError), match="lock receipt anchored on node None"):
        rt.release(x)


def test_publish_cuts_a_partly_computed_page_as_the_insert_path_does():
    """publish keys the computed tokens page-aligned (RadixKey.page_aligned, as _insert_cache): 10 tokens of page size 4 publish 2 pages."""
    rt = make_runtime(page_size=4)
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(10))),))))
    x = rt.publish(a, 0, 3)
    assert sum(run.page_count for run in x.page_runs) == 2
