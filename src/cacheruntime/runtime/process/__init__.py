"""`ProcessGPURuntime`: the runtime interface over a process boundary (client, server, wire format).

`client` is what control imports (no torch); `server` runs in the runtime process around a
`LocalGPURuntime`; `wire` is the message format both share; `child` is where a runtime
process begins.
"""

from __future__ import annotations

from cacheruntime.runtime.process.client import ProcessGPURuntime, RuntimeStartFailed

__all__ = ["ProcessGPURuntime", "RuntimeStartFailed"]
