"""notes.md's table "operation -> SGLang functions reached" is what the adapter does, recorded.

`conformance.adapters.sglang.calls` spies on every call adapter.py makes into SGLang while
each protocol operation runs; this test fails when the recording and the table in
notes.md differ (and prints the recorded table to paste), so the table cannot drift.
"""

from __future__ import annotations

import pytest
from _sglang_env import ADAPTER_DIR, HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from conformance.adapters.sglang import calls

pytestmark = pytest.mark.needs_sglang


def test_notes_table_is_the_recorded_calls():
    reached = calls.record()
    text = (ADAPTER_DIR / "notes.md").read_text()
    documented = text[text.index(calls.START) + len(calls.START) : text.index(calls.END)].strip()
    assert documented == calls.table(reached), "notes.md is out of date; the recorded table is:\n" + calls.table(reached)


def test_the_real_work_is_sglangs():
    """The operations the issue names reach the SGLang method that does the work."""
    reached = calls.record()
    assert "memory_pool.ReqToTokenPool.free" in reached["close_request"]
    assert "memory_pool.ReqToTokenPool.alloc" in reached["open_request"]
    assert "radix_cache.RadixCache.insert" in reached["publish"]
    assert {"radix_cache.RadixCache.dec_lock_ref", "paged.PagedTokenToKVPoolAllocator.free_segment"} <= set(reached["release"])
