"""The physical side of the boundary: `LocalGPURuntime` and what it is built from.

`local` holds the facade; `ledger` the torch-free bookkeeping (the model's sections);
`device` the KV memory, ReqToToken, streams, ordering points, throttle and runners;
`factories` builds configured instances by import path, as the conformance suite and the
main job name them. `LocalGPURuntime` is imported on first use, so that the ledger can be
imported without torch (the `[runtime]` extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LocalGPURuntime"]


def __getattr__(name: str) -> Any:
    if name == "LocalGPURuntime":
        from cacheruntime.runtime.local import LocalGPURuntime

        return LocalGPURuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
