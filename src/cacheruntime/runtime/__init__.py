"""The physical side of the boundary: `LocalGPURuntime` and what it is built from.

`local` holds the runtime (bookkeeping in `state`, KV memory in `pools`, ordering
primitives in `streams`, compute in `runner`); `factories` builds configured instances by
import path, as the conformance suite and the main job name them.
"""

from cacheruntime.runtime.local import LocalGPURuntime

__all__ = ["LocalGPURuntime"]
