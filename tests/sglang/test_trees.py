"""The adapter's tree configurations (option `tree`) run the tree they name, and SGLang's own
invariant checks run on each (checks.py).

- `radix`: the legacy `RadixCache`; `unified-rust` / `unified-python`: 0.5.23's default
  `UnifiedRadixCache` with the Rust resp. the Python TreeCore. A spy on SGLang's classes
  shows a protocol scenario reaching the unified tree's methods and the named TreeCore's.
- A double unlock (issue 16: "both TreeCores reject the double unlock that the legacy
  RadixCache underflows on"), made on SGLang's objects as the stack builds them.
- A page freed under a live request fails SGLang's use-after-free check at the next boundary
  call, reported under the check's id.
"""

from __future__ import annotations

from collections import Counter

import pytest
from _sglang_env import HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from cacheruntime.protocol import BatchItem, BatchPlan, Capability, NoL2, Publish
from conformance.adapters.sglang.adapter import make_runtime
from conformance.adapters.sglang.checks import SGLangCheckFailed
from conformance.adapters.sglang.stack import TREES, build_stack

pytestmark = pytest.mark.needs_sglang

UNIFIED = ("unified-rust", "unified-python")
CORES = {"unified-rust": "RustUnifiedTreeCore", "unified-python": "UnifiedTreeCore"}


def _runtime(tree: str):
    return make_runtime(tree=tree, l2_pages=0 if TREES[tree] else 32)


def _scenario(rt) -> None:
    """Publish a request's pages, attach them to a second request, release, close both."""
    a = rt.open_request()
    done = rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),), (Publish(a, 0, 2),))))
    (x,) = done.published
    b = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(b, (1,), attach=(x,)),))))
    rt.close_request(a)
    rt.release(x)
    rt.close_request(b)


def _spy(monkeypatch, cls, names, seen: Counter) -> None:
    for name in names:
        original = getattr(cls, name)

        def wrapper(self, *args, __original=original, __name=f"{cls.__name__}.{name}", **kwargs):
            seen[__name] += 1
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)


@pytest.mark.parametrize("tree", UNIFIED)
def test_unified_configuration_runs_unified_radix_cache_on_the_named_tree_core(tree, monkeypatch):
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    seen: Counter = Counter()
    _spy(monkeypatch, UnifiedRadixCache, ("insert", "match_prefix", "inc_lock_ref", "dec_lock_ref"), seen)
    core_names = ("begin_insert", "match_prefix", "inc_lock_ref", "dec_lock_ref", "evict_device_next_node", "evict_device_leaf")
    for cls in (RustUnifiedTreeCore, UnifiedTreeCore):
        _spy(monkeypatch, cls, core_names, seen)
    _spy(monkeypatch, RadixCache, ("insert", "match_prefix", "inc_lock_ref", "dec_lock_ref"), seen)
    rt = _runtime(tree)
    assert type(rt.sg.tree) is UnifiedRadixCache
    core = type(rt.sg.tree.tree_core).__name__
    assert core == CORES[tree]
    assert Capability.INTROSPECTION not in rt.info().capabilities and Capability.L2 not in rt.info().capabilities
    free = rt.sg.allocator.available_size()
    _scenario(rt)
    for name in ("insert", "match_prefix", "inc_lock_ref", "dec_lock_ref"):
        assert seen[f"UnifiedRadixCache.{name}"] > 0, (name, seen)
    for name in core_names:
        assert seen[f"{core}.{name}"] > 0, (core, name, seen)
    other = ({"RustUnifiedTreeCore", "UnifiedTreeCore"} - {core}).pop()
    assert not [k for k in seen if k.startswith((f"{other}.", "RadixCache."))], seen
    assert rt.sg.allocator.available_size() == free  # everything went back through SGLang's frees
    assert rt.sg.tree.evictable_size() == rt.sg.tree.protected_size() == 0


def test_legacy_configuration_runs_radix_cache(monkeypatch):
    from sglang.srt.mem_cache.radix_cache import RadixCache

    seen: Counter = Counter()
    _spy(monkeypatch, RadixCache, ("insert", "match_prefix", "inc_lock_ref", "dec_lock_ref"), seen)
    rt = _runtime("radix")
    assert type(rt.sg.tree) is RadixCache
    assert Capability.INTROSPECTION in rt.info().capabilities
    _scenario(rt)
    assert all(seen[f"RadixCache.{n}"] > 0 for n in ("insert", "match_prefix", "inc_lock_ref", "dec_lock_ref")), seen


def test_unknown_tree_and_unified_with_host_tier_are_refused():
    with pytest.raises(ValueError, match="tree="):
        make_runtime(tree="hiradix")
    with pytest.raises(ValueError, match="l2_pages=0"):
        make_runtime(tree="unified-rust", l2_pages=8)


def test_unified_without_host_tier_says_no_l2_after_translating_the_intents():
    from cacheruntime.protocol import Backup

    rt = _runtime("unified-python")
    a = rt.open_request()
    (x,) = rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(4))),), (Publish(a, 0, 1),)))).published
    with pytest.raises(NoL2):
        rt.submit((Backup(x),))


def _locked_node(tree: str):
    """SGLang's objects as build_stack makes them: one entry inserted and locked once."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    sg = build_stack(tree=tree, l2_pages=0)
    value = sg.allocator.alloc(8)
    node = sg.tree.insert(InsertParams(key=RadixKey(token_ids=array("q", range(8)), extra_key="x"), value=value)).last_device_node
    receipt = sg.tree.inc_lock_ref(node)
    return sg, node, receipt


def test_legacy_radix_cache_underflows_on_a_double_unlock():
    sg, node, _ = _locked_node("radix")
    sg.tree.dec_lock_ref(node)
    sg.tree.dec_lock_ref(node)  # no check: the count goes below zero
    assert node.lock_ref == -1


@pytest.mark.parametrize("tree", UNIFIED)
def test_both_tree_cores_reject_a_double_unlock(tree):
    sg, node, receipt = _locked_node(tree)
    params = receipt.to_dec_params()
    sg.tree.dec_lock_ref(node, params)
    assert (sg.tree.evictable_size(), sg.tree.protected_size()) == (8, 0)
    # Python TreeCore: AssertionError; Rust TreeCore: its panic, raised as RuntimeError.
    with pytest.raises((AssertionError, RuntimeError), match="lock_ref=0"):
        sg.tree.dec_lock_ref(node, params)
    if tree == "unified-rust":  # a panic poisons the Rust core: every later call is refused
        with pytest.raises(RuntimeError, match="poisoned"):
            sg.tree.evictable_size()
    else:
        assert (sg.tree.evictable_size(), sg.tree.protected_size()) == (8, 0)


@pytest.mark.parametrize("tree", ("radix", *UNIFIED))
def test_sglang_use_after_free_check_fails_the_next_call_with_its_id(tree):
    rt = _runtime(tree)
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),))))
    b = rt.open_request()  # the checks pass on an honest state
    # An injected defect: a page request a's row still names goes back on the free list,
    # and another is taken off it, so the pool's totals stay right (the conservation check passes).
    ps = rt.page_size
    row_page = rt.sg.req_to_token_pool.req_to_token[rt.requests[a].row, :ps].clone()
    assert rt.sg.allocator.alloc(ps) is not None
    rt.sg.allocator.free(row_page)
    with pytest.raises(SGLangCheckFailed) as raised:
        rt.close_request(b)
    assert raised.value.check_id == "kv-page-use-after-free"
    assert type(raised.value).__name__ == "SGLangCheck[kv-page-use-after-free]"


def test_sglang_idle_check_reports_a_leak_with_its_id():
    rt = _runtime("unified-rust")
    a = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(8))),))))
    assert rt.sg.allocator.alloc(rt.page_size) is not None  # a page nobody holds: a leak once idle
    with pytest.raises(SGLangCheckFailed) as raised:
        rt.close_request(a)
    assert raised.value.check_id == "idle-pool-leak"
