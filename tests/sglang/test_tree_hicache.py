"""HiCache on 0.5.23's default tree (issue 16 item 2): adapter options `tree=unified-*`,
`l2_pages>0`, `write_policy`.

The host tier is the unified tree's own, attached as the scheduler attaches it
(`UnifiedRadixCache.init_hicache` -> `attach_hybrid_pool_to_unified_cache` ->
`HybridCacheController`, configured from the published server config), and the tier moves
reach the tree's own paths: Backup its `BackupKV` action (`_execute_and_commit_kv_backup`,
`commit_backup`), Demote `tree_core.demote`, Restore `load_back`, and an entry whose last lock
goes under write-back the deferred backup-then-demote of `_evict_components`. A spy on SGLang's
classes records each. Drop has no per-entry counterpart (`Unsupported`). A Demote of a
referenced entry is a demote of a locked node, which SGLang's eviction never makes: the Python
TreeCore carries it out and its evictable size goes negative, the Rust one panics (report F15).
"""

from __future__ import annotations

from collections import Counter

import pytest
from _sglang_env import HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Capability, Demote, Drop, Publish, Restore, Unsupported
from conformance.adapters.sglang.adapter import make_runtime

pytestmark = pytest.mark.needs_sglang


def _spy(monkeypatch, cls, names, seen: Counter) -> None:
    for name in names:
        original = getattr(cls, name)

        def wrapper(self, *args, __original=original, __name=f"{cls.__name__}.{name}", **kwargs):
            seen[__name] += 1
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)


def _published(rt, pages: int = 3):
    a = rt.open_request()
    done = rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(a, tuple(range(4 * pages))),), (Publish(a, 0, pages),))))
    return a, done.published[0]


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_tier_moves_reach_the_trees_own_hicache(policy, monkeypatch):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    seen: Counter = Counter()
    _spy(monkeypatch, UnifiedRadixCache, ("init_hicache", "_execute_and_commit_kv_backup", "load_back", "check_hicache_events"), seen)
    _spy(monkeypatch, UnifiedTreeCore, ("commit_backup", "demote", "commit_load_back", "evict_device_leaf"), seen)
    _spy(monkeypatch, HybridCacheController, ("write", "load"), seen)
    rt = make_runtime(tree="unified-python", l2_pages=8, write_policy=policy)
    assert type(rt.sg.controller) is HybridCacheController and rt.sg.controller.io_backend == "direct"
    assert rt.sg.controller.write_policy == policy and rt.sg.tree.is_write_back == (policy == "write_back")
    assert Capability.L2 in rt.info().capabilities and seen["UnifiedRadixCache.init_hicache"] == 1
    # An unbacked entry whose last lock goes: write-through backed it up at insert (threshold 1)
    # and eviction demotes it; write-back backs it up at eviction, then demotes it (deferred demote).
    c, y = _published(rt, pages=1)
    rt.close_request(c)
    assert rt.sg.tree.is_backuped(rt.entries[y.generation].node) == (policy == "write_through")
    rt.release(y)
    assert seen["UnifiedTreeCore.evict_device_leaf"] >= 1 and seen["UnifiedTreeCore.commit_backup"] == 1
    assert seen["UnifiedTreeCore.demote"] == (1 if policy == "write_back" else 0)  # write-through: evict_device_leaf demotes itself
    # Backup, Demote, Restore of a published entry.
    a, x = _published(rt)
    rt.close_request(a)
    writes = seen["HybridCacheController.write"]
    (ticket,) = rt.submit((Backup(x),))
    assert ticket.page_count == (0 if policy == "write_through" else 3)
    assert ticket in {c.ticket for c in rt.wait_completions()}
    assert seen["HybridCacheController.write"] == writes + (policy == "write_back")
    total = rt.sg.allocator.available_size()
    demotes = seen["UnifiedTreeCore.demote"]
    rt.submit((Demote(x),))
    assert seen["UnifiedTreeCore.demote"] == demotes + 1 and rt.sg.allocator.available_size() == total + 12
    (ticket,) = rt.submit((Restore(x),))
    assert ticket.page_count == 3 and seen["UnifiedRadixCache.load_back"] == 1 and seen["UnifiedTreeCore.commit_load_back"] == 1
    assert seen["HybridCacheController.load"] == 1 and ticket in {c.ticket for c in rt.wait_completions()}
    assert rt.sg.allocator.available_size() == total
    assert seen["UnifiedRadixCache.check_hicache_events"] > 0  # the scheduler's per-step poll


def test_drop_has_no_counterpart_and_changes_nothing():
    rt = make_runtime(tree="unified-rust", l2_pages=8)
    a, x = _published(rt)
    host = rt.sg.host_pool.available_size()
    with pytest.raises(Unsupported, match="no per-entry host drop"):
        rt.submit((Backup(x), Drop(x)))
    assert rt.sg.host_pool.available_size() == host


@pytest.mark.parametrize("tree", ["unified-python", "unified-rust"])
def test_demote_of_a_referenced_entry_is_a_demote_of_a_locked_node(tree):
    """F15: SGLang's eviction demotes only unlocked leaves; tree_core.demote itself does not check."""
    rt = make_runtime(tree=tree, l2_pages=8, sglang_checks=False)
    a, x = _published(rt)
    rt.close_request(a)
    rt.submit((Backup(x),))
    if tree == "unified-python":
        rt.submit((Demote(x),))
        assert rt.sg.tree.evictable_size() < 0  # the locked entry's tokens taken off an evictable size that never had them
    else:
        with pytest.raises(RuntimeError, match="evictable size underflow"):
            rt.submit((Demote(x),))
