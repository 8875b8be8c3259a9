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
    assert rt.info().capabilities == frozenset({Capability.L2})
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


def test_scenario4_stale_handle_reaches_the_new_requests_row():
    """Scenario 4 on SGLang: A's late close frees B's row (H1), as free_rows takes no generation."""
    rt = make_runtime(max_requests=2)
    a = rt.open_request()
    rt.close_request(a)
    b = rt.open_request()
    assert b.slot_id == a.slot_id and b.generation == a.generation + 1  # H2 holds
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(b, (1, 2, 3)),))))
    free_before = rt.sg.allocator.available_size()
    rt.close_request(a)  # stale: the contract says StaleHandle and no change
    assert rt.sg.allocator.available_size() > free_before  # B's page went back to the free list
    assert rt.sg.req_to_token_pool.free_slots.count(rt.slot_row[a.slot_id]) == 1  # B's row is free again
