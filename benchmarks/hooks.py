"""Every place the benchmark touches `LocalGPURuntime` beyond the protocol, through its public seams.

The bench drives the runtime through the protocol (`cacheruntime.protocol`); this module is
the only one that imports `cacheruntime.runtime` or reads a runtime's parts, so a change of
the runtime's structure is fixed here once. What it uses, all public:

- the constructor's `runner` option: the bench builds the runtime with its own model
  (`harness.BenchRunner`, `harness.NullRunner`) instead of the tiny one; the runtime's
  ordering, bookkeeping and transfers are untouched;
- `rt.device_layer.memory` (the KVMemory): read to time the runtime's own copy routines
  alone (the data path), and its `restore` wrapped for a while to time the host's issue cost;
- `rt.ledger.state.pools[tier].free`: the free lists, reordered (`harness.fragment_free_list`)
  so that the allocator hands out pages in scattered runs, as a long-running server's
  fragmented pools do. Which free page is handed out is the runtime's choice and invisible
  to control, so this only picks a realistic starting state;
- the device layer's classes and helpers (KVMemory, DecoderConfig, `to_device`) and the D2H
  issue points, for the diagnostics and the bench model;
- the Llama runner, its presets, ReqToToken and ComputeBatch, for the `model` section,
  which times the runner's own step on a table it fills (no protocol calls).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cacheruntime.protocol import Tier
from cacheruntime.runtime.device.llama import LLAMA_CONFIGS, LlamaRunner
from cacheruntime.runtime.device.memory import KVMemory
from cacheruntime.runtime.device.reqtotoken import ReqToToken
from cacheruntime.runtime.device.runner import ComputeBatch, DecoderConfig
from cacheruntime.runtime.device.streams import to_device
from cacheruntime.runtime.local import D2H_ISSUE_POINTS, LocalGPURuntime

#: a KVMemory copy routine: (source pages, destination pages)
CopyRoutine = Callable[[list[int], list[int]], None]

__all__ = [
    "D2H_ISSUE_POINTS",
    "LLAMA_CONFIGS",
    "ComputeBatch",
    "DecoderConfig",
    "KVMemory",
    "LlamaRunner",
    "LocalGPURuntime",
    "ReqToToken",
    "free_list",
    "memory",
    "new_runtime",
    "restores_wrapped",
    "to_device",
]


def new_runtime(config: DecoderConfig, device: torch.device, *, seed: int, runner: Any = None, **options: Any) -> LocalGPURuntime:
    """A LocalGPURuntime named "bench" with KV shape `config`, running `runner` (a Runner object; default the tiny one).

    `options` are the constructor's other options (pool sizes, the D2H throttle and issue point).
    """
    return LocalGPURuntime(runtime_id="bench", device=str(device), runner=runner or "tiny", config=config, seed=seed, **options)


def memory(rt: LocalGPURuntime) -> KVMemory:
    """The runtime's KV memory: its pools and its copy routines."""
    return rt.device_layer.memory


def free_list(rt: LocalGPURuntime, tier: Tier) -> deque[int]:
    """The free physical pages of `tier`, in the order the allocator hands them out."""
    return rt.ledger.state.pools[tier].free


@contextlib.contextmanager
def restores_wrapped(rt: LocalGPURuntime, wrapper: Callable[[CopyRoutine, list[int], list[int]], None]) -> Iterator[None]:
    """While inside, every restore the runtime issues runs as `wrapper(restore, src_l2, dst_l1)`.

    The wrapper is set on the KVMemory instance and removed after, so the runtime's code
    and every other instance stay as they were.
    """
    mem = memory(rt)
    own, inner = mem.__dict__.get("restore"), mem.restore
    mem.restore = lambda src, dst: wrapper(inner, src, dst)
    try:
        yield
    finally:
        if own is None:
            del mem.restore
        else:
            mem.restore = own
