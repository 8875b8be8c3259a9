"""An independent cache runtime in plain Python: a template for engine teams.

Written from `spec/protocol.md` alone: it shares no code with the reference model or
`LocalGPURuntime`, and imports nothing of cacheruntime but `cacheruntime.protocol`.
The conformance suite holds it to the contract like any engine:

    PYTHONPATH=examples cacheruntime conformance --runtime skeleton_runtime:make_runtime

Modules, from the bottom up:

- `ledger`: every record the runtime keeps (slots, page names, pools, extents, batches,
  transfers, counters) as plain data, nothing else.
- `pages`: page names, holders, physical pages taken and freed (deferred while a
  transfer touches them).
- `handles`: the handle checks, in the contract's order.
- `requests`, `extents`, `tiers`, `batches`: the operations, each over the ledger.
- `transfers`: transfers started, completed (only on the caller's thread) and reported.
- `memory`, `copier`, `compute`: the "hardware": two memories of version tags, the copy
  streams (worker threads) that move pages between them, and compute's tag writes and reads.
- `probe`: the `AbstractState` view (INTROSPECTION).
- `runtime`: `SkeletonRuntime`, where every operation is one transaction on the ledger.
"""

from __future__ import annotations

from .runtime import SkeletonRuntime

__all__ = ["SkeletonRuntime", "make_runtime"]


def make_runtime(
    *,
    runtime_id: str = "skeleton",
    page_size: int = 4,
    max_requests: int = 4,
    max_request_tokens: int = 64,
    l1_pages: int = 12,
    l2_pages: int = 24,
    vocab_size: int = 1 << 20,
) -> SkeletonRuntime:
    """A fresh runtime; the suite passes `--option key=value` as keyword arguments.

    Pools are small on purpose: out-of-pages, deferred frees and page reuse then happen
    within a few calls. `l2_pages=0` gives a runtime without a host tier, which then
    claims neither L2 nor the transfer capabilities. Compute writes and reads version
    tags, not token ids, so the vocabulary is only what `info()` reports.
    """
    return SkeletonRuntime(
        runtime_id=runtime_id,
        page_size=page_size,
        max_requests=max_requests,
        max_request_tokens=max_request_tokens,
        l1_pages=l1_pages,
        l2_pages=l2_pages,
        vocab_size=vocab_size,
    )
