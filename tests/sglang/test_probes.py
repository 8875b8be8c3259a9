"""Direct probes of SGLang 0.5.23's cache classes, one per finding of docs/sglang-report.md.

Each test calls SGLang's classes the way a scheduler would, and asserts what SGLang
*does* (not what the contract wants): a test that starts failing means SGLang changed
and the report (and the expected-failures file) needs a look. The finding ids (S1, ...)
and invariant ids (H1, R4, ...) are the report's.
"""

from __future__ import annotations

import pytest
from _sglang_env import HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

import torch

from conformance.adapters.sglang.stack import build_stack

pytestmark = pytest.mark.needs_sglang


def _pages(allocator, n):
    """n pages from the paged allocator, as page ids (token index // page_size)."""
    idx = allocator.alloc(n * allocator.page_size)
    assert idx is not None
    return idx, torch.unique(idx // allocator.page_size)


def test_S0_direct_io_backend_needs_a_gpu_kernel_on_cpu():
    """S0: `transfer_kv_direct` is only bound on CUDA/HIP/XPU, so io_backend='direct' cannot copy on CPU."""
    build_stack()  # binds the adapter's stand-in; check the module had none of its own
    from sglang.srt.mem_cache.pool_host import mha

    from conformance.adapters.sglang import cpu_kernels

    assert mha.transfer_kv_direct is cpu_kernels.transfer_kv_direct


def test_S1_R4_paged_allocator_accepts_a_double_free_and_hands_the_page_out_twice():
    """S1 (R4): PagedTokenToKVPoolAllocator.free() does not notice a page freed twice."""
    s = build_stack(page_size=4, l1_pages=4, l2_pages=0)
    a = s.allocator
    idx, pages = _pages(a, 1)
    a.free(idx)
    a.free(idx)  # no error
    free = a.get_all_free_pages().tolist()
    assert free.count(int(pages[0])) == 2  # the page is on the free list twice
    first, _ = _pages(a, 1)
    second, _ = _pages(a, 1)
    assert torch.equal(first, second)  # two live holders of one physical page: R2 too


def test_S1b_debug_mode_asserts_only_after_the_free_list_is_corrupted(monkeypatch):
    """S1b (R4, atomicity): SGLANG_DEBUG_MEMORY_POOL=1 asserts, but after the duplicate went in."""
    s = build_stack(page_size=4, l1_pages=4, l2_pages=0)
    a = s.allocator
    a.debug_mode = True  # what SGLANG_DEBUG_MEMORY_POOL=1 sets in __init__
    idx, pages = _pages(a, 1)
    a.free(idx)
    with pytest.raises(AssertionError):
        a.free(idx)
    assert a.get_all_free_pages().tolist().count(int(pages[0])) == 2  # state already changed


def test_S2_R4_token_allocator_double_free_has_no_check_at_all():
    """S2 (R4): page_size 1's TokenToKVPoolAllocator has no duplicate check, debug or not."""
    s = build_stack(page_size=1, l1_pages=4, l2_pages=0)
    a = s.allocator
    idx = a.alloc(1)
    a.free(idx)
    a.free(idx)
    assert a.available_size() == 5  # 4 slots, 5 free: R1 (free + held = total) broken


def test_S3_R4_host_pool_does_detect_a_double_free():
    """S3 (R4 holds on L2): HostKVCache.free() asserts on a slot that is not allocated."""
    s = build_stack(page_size=4, l1_pages=4, l2_pages=4)
    h = s.host_pool.alloc(4)
    s.host_pool.free(h)
    with pytest.raises(AssertionError, match="Double-free"):
        s.host_pool.free(h)


def test_S4_H2_req_generation_grows_at_reuse():
    """S4 (H2 holds): ReqToTokenPool.alloc_rows bumps req_generation of every row it hands out."""
    s = build_stack(max_requests=2)
    p = s.req_to_token_pool
    (row,) = p.alloc_rows(1)
    g1 = int(p.req_generation[row])
    p.free_rows([row])
    (again,) = p.alloc_rows(1)
    assert again == row and int(p.req_generation[row]) == g1 + 1


def test_S5_H1_H3_free_rows_takes_no_generation_and_accepts_a_stale_or_double_free():
    """S5 (H1, H3): free_rows([row]) frees whoever owns the row now; a double free hands it out twice."""
    s = build_stack(max_requests=3)
    p = s.req_to_token_pool
    (a,) = p.alloc_rows(1)  # request A
    p.free_rows([a])  # A finishes
    (b,) = p.alloc_rows(1)  # B gets A's row (LIFO free list)
    assert b == a
    p.req_to_token[b, :4] = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
    p.free_rows([a])  # a late free with A's row id: nothing can tell it is stale (H1)
    (c,) = p.alloc_rows(1)  # C now shares B's row, and B's row content is C's to overwrite
    assert c == b  # H3: two live requests on one row
    p.free_rows([c])
    p.free_rows([c])
    assert p.free_slots.count(c) == 2  # double free of a row accepted


def test_S6_E4_radix_dec_lock_ref_without_inc_underflows():
    """S6 (E4, then E1): RadixCache.dec_lock_ref on an unlocked node drives lock_ref to -1."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    s = build_stack(page_size=4, l1_pages=8, l2_pages=0)
    idx, _ = _pages(s.allocator, 2)
    key = RadixKey(token_ids=array("q", range(8)), extra_key=None)
    s.tree.insert(InsertParams(key=key, value=idx))
    node = s.tree.match_prefix(MatchPrefixParams(key=key)).last_device_node
    s.tree.dec_lock_ref(node)  # unlock without lock: no error
    assert node.lock_ref == -1
    s.tree.inc_lock_ref(node)  # a request now locks the node ...
    assert node.lock_ref == 0  # ... and the lock is invisible
    assert node in s.tree.evictable_leaves
    freed = s.tree.evict(EvictParams(num_tokens=8)).num_tokens_evicted
    assert freed == 8  # E1: the node the request holds was evicted and its pages freed


def test_S7_O3_device_pages_freed_during_a_backup_are_reused_at_once():
    """S7 (O3): the allocator does not defer a free while a HiCache D2H on the page is unacknowledged."""
    s = build_stack(page_size=4, l1_pages=4, l2_pages=4)
    idx, pages = _pages(s.allocator, 2)
    host = s.controller.write(idx)  # D2H queued/started; ack in ack_write_queue
    assert host is not None and s.controller.has_inflight_device_transfers()
    s.allocator.free(idx)  # e.g. the request closes or the tree evicts
    again, _ = _pages(s.allocator, 2)
    assert torch.equal(torch.sort(again).values, torch.sort(idx).values)  # handed out while in flight
    assert s.controller.has_inflight_device_transfers()  # the ack is still pending


def test_S8_E1_E2_E3_evict_respects_locks_removes_leaves_and_frees_enough():
    """S8 (E1, E2, E3 hold): evict skips locked paths, removes leaves only, frees what it can."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    s = build_stack(page_size=4, l1_pages=8, l2_pages=0)
    i1, _ = _pages(s.allocator, 2)
    i2, _ = _pages(s.allocator, 1)
    k1 = RadixKey(token_ids=array("q", range(8)), extra_key=None)
    k2 = RadixKey(token_ids=array("q", [100, 101, 102, 103]), extra_key=None)
    s.tree.insert(InsertParams(key=k1, value=i1))
    s.tree.insert(InsertParams(key=k2, value=i2))
    locked = s.tree.match_prefix(MatchPrefixParams(key=k1)).last_device_node
    s.tree.inc_lock_ref(locked)
    before = s.allocator.available_size()
    evicted = s.tree.evict(EvictParams(num_tokens=100)).num_tokens_evicted
    assert evicted == 4 and s.allocator.available_size() == before + 4
    assert locked.value is not None and locked.parent is s.tree.root_node
    s.tree.dec_lock_ref(locked)
    assert s.tree.evict(EvictParams(num_tokens=8)).num_tokens_evicted == 8
