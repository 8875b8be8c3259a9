"""notes.md's tables "operation -> SGLang functions reached" are what the adapter does, recorded.

`conformance.adapters.sglang.calls` spies on every call adapter.py makes into SGLang while
each protocol operation runs, once per adapter configuration (`calls.CONFIGURATIONS`); this
test fails when a recording and its table in notes.md differ (and prints the recorded table to
paste), so no table can drift.
"""

from __future__ import annotations

import functools

import pytest
from _sglang_env import ADAPTER_DIR, HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from conformance.adapters.sglang import calls

pytestmark = pytest.mark.needs_sglang

LEGACY, UNIFIED_RUST, UNIFIED_PYTHON = calls.CONFIGURATIONS


@functools.cache
def _reached(configuration: str) -> dict[str, list[str]]:
    """One recording per configuration for both tests (each builds a fresh SGLang stack)."""
    return calls.record(configuration)


@pytest.mark.parametrize("configuration", list(calls.CONFIGURATIONS))
def test_notes_table_is_the_recorded_calls(configuration):
    recorded = calls.table(_reached(configuration))
    start, end = calls.markers(configuration)
    text = (ADAPTER_DIR / "notes.md").read_text()
    documented = text[text.index(start) + len(start) : text.index(end)].strip()
    assert documented == recorded, f"notes.md is out of date for {configuration}; the recorded table is:\n{recorded}"


def test_the_real_work_is_sglangs():
    """The operations the issue names reach the SGLang method that does the work."""
    reached = _reached(LEGACY)
    assert "memory_pool.ReqToTokenPool.free" in reached["close_request"]
    assert "memory_pool.ReqToTokenPool.alloc" in reached["open_request"]
    assert "radix_cache.RadixCache.insert" in reached["publish"]
    assert {"radix_cache.RadixCache.dec_lock_ref", "paged.PagedTokenToKVPoolAllocator.free_segment"} <= set(reached["release"])
    assert {"cache_controller.HiCacheController.write", "cache_controller.HiCacheController.load"} <= set(reached["submit"])


def test_the_real_work_is_sglangs_on_the_unified_trees_hicache():
    """Backup builds the tree's own BackupKV action, Demote is tree_core.demote, Restore is load_back."""
    for configuration in (UNIFIED_RUST, UNIFIED_PYTHON):
        reached = _reached(configuration)
        assert "memory_pool.ReqToTokenPool.alloc" in reached["open_request"]
        assert "unified_radix_cache.UnifiedRadixCache.insert" in reached["publish"]
        assert "unified_radix_cache.UnifiedRadixCache.dec_lock_ref" in reached["release"]
        assert "unified_radix_cache.UnifiedRadixCache.check_hicache_events" in reached["wait_completions"]
    python = _reached(UNIFIED_PYTHON)["submit"]
    # write-back: the entry is not backed up yet, so Backup is the tree's action, flushed
    assert {
        "unified_tree_core.UnifiedTreeCore.build_backup_kv_action",
        "unified_radix_cache.UnifiedRadixCache._apply_cache_action",
        "unified_radix_cache.UnifiedRadixCache.flush_pending_backups",
        "unified_tree_core.UnifiedTreeCore.demote",
        "unified_radix_cache.UnifiedRadixCache.load_back",
    } <= set(python)
    # write-through: insert backed the entry up already (Backup only asks); the Demote of the
    # referenced entry reaches the Rust TreeCore's demote, which panics (F15), ending the scenario
    rust = _reached(UNIFIED_RUST)
    assert {"unified_radix_cache.UnifiedRadixCache.is_backuped", "adapter.RustUnifiedTreeCore.demote"} <= set(rust["submit"])
    assert "unified_tree_core.UnifiedTreeCore.build_backup_kv_action" not in rust["submit"] and "poll_completions" not in rust
