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
  which times the runner's own step on a table it fills (no protocol calls);
- the device layer's runner, KV memory and ReqToToken table, for `warm_up` (the `e2e`
  section), which runs the runner's step once per decode bucket before the timed run.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from types import SimpleNamespace
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
    "warm_up",
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


def warm_up(rt: LocalGPURuntime, max_requests: int, prefill: int) -> None:
    """Run the runtime's runner once per decode bucket up to `max_requests` items and once on a
    `prefill`-token item, on rows no request holds yet, so that the timed run compiles
    nothing and captures no graph: the first step of a bucket compiles its attention
    kernel and captures its CUDA graph (`decodegraphs`), seconds that belong to no
    request. The K and V it writes land in free pages, which hold nothing yet."""
    layer = rt.device_layer
    sizes = sorted({min(1 << i, max_requests) for i in range(max_requests.bit_length() + 1)})
    batches = [([0] * n, [1] * n) for n in sizes] + [([0], [prefill])]
    for starts, ends in batches:
        plan_items = [SimpleNamespace(input_ids=(0,) * (end - start), append_previous_output=False) for start, end in zip(starts, ends)]
        items = ComputeBatch(list(range(len(starts))), starts, ends, [0] * len(starts), plan_items, [None] * len(starts))
        layer.runner.forward(layer.memory, layer.req_to_token.table, items).tolist()
