"""CUDA-graph decode: the runner's one-token steps captured per batch-size bucket and replayed.

A decode step of a many-layer model is hundreds of small kernels, and without a graph the
host's cost of launching them (and of the compiled attention's guards, layer by layer)
can exceed the device's work. So the runner captures its decode step once per bucket of
batch sizes and replays it: one launch per step. Control never sees this; the runtime
calls `forward` as for any batch, and a batch the graphs do not serve (a prefill, a
batch larger than the largest bucket) runs eagerly.

- **Buckets.** A batch of B items runs in the smallest bucket of at least B. The spare
  rows repeat item 0 (its row, position and token) and write item 0's own K and V to
  item 0's location, gathered from item 0's output, so the duplicate writes are
  identical and a spare row changes nothing.
- **Static inputs.** A graph reads its inputs (token ids, slots, positions, the source row
  of each write) from one device buffer that each step fills with one non-blocking copy,
  and everything else (the KV pool, the ReqToToken table, the weights) at the addresses it
  was captured with. So the graphs belong to one KV memory and one table (address, shape
  and strides), and are dropped when the runner is handed others (a runtime that rebuilt
  its memory, the bench's next size).
- **Capture.** The first step of a bucket runs its step twice outside a graph (which
  compiles the attention kernel for that shape; the second run is the standard warm-up of
  lazily initialised libraries), then captures it and replays it. Running the step
  more than once is harmless: it writes the same K and V to the same locations. The
  seconds spent are kept per bucket (`warmup_seconds`, `capture_seconds`) of the graphs
  held now, for the bench.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from cacheruntime.runtime.device.runner import ComputeBatch
from cacheruntime.runtime.device.streams import to_device

#: batch-size buckets, each a captured graph once used (SGLang's decode graphs bucket the same way)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: the step a graph captures: (memory, table, inputs `[4, bucket]`: ids, slots, positions, source) -> next tokens `[bucket]`
DecodeStep = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]


@attrs.define
class _Graph:
    """One bucket's graph, its input buffer and the output it writes."""

    inputs: torch.Tensor
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor


class DecodeGraphs:
    """The decode graphs of one runner, per bucket, for the KV memory and table they were captured on."""

    def __init__(self, step: DecodeStep, device: torch.device):
        self._step, self._device = step, device
        self._graphs: dict[int, _Graph] = {}
        # the KV memory's and the table's address, shape and strides: a capture bakes in all of them
        # (a new memory of another size may be handed out at the old address)
        self._captured_on: tuple[object, ...] | None = None
        self._pool: Any = None
        self.warmup_seconds: dict[int, float] = {}
        self.capture_seconds: dict[int, float] = {}

    @staticmethod
    def serves(items: ComputeBatch) -> bool:
        """Whether the batch is a decode step a bucket holds: one new token per item."""
        return 0 < len(items) <= BUCKETS[-1] and all(end - start == 1 for start, end in zip(items.starts, items.ends))

    def run(self, memory: Any, table: torch.Tensor, items: ComputeBatch) -> torch.Tensor:
        """Each item's next token (a device tensor), by replaying its bucket's graph (captured on first use)."""
        n = len(items)
        bucket = next(size for size in BUCKETS if size >= n)
        spare = bucket - n
        ids = [tokens[0] for tokens in items.token_ids]
        rows = [
            ids + [ids[0]] * spare,
            list(items.slots) + [items.slots[0]] * spare,
            list(items.starts) + [items.starts[0]] * spare,
            list(range(n)) + [0] * spare,
        ]
        l1 = memory.l1
        where = (l1.data_ptr(), l1.shape, l1.stride(), table.data_ptr(), table.shape, table.stride())
        if where != self._captured_on:
            # a fresh memory pool too: the graphs dropped here were the old pool's only users
            self._graphs.clear()
            self._pool = None
            self.warmup_seconds.clear()
            self.capture_seconds.clear()
            self._captured_on = where
        graph = self._graphs.get(bucket)
        if graph is None:
            return self._capture(bucket, memory, table, rows)[:n].clone()
        graph.inputs.copy_(to_device(rows, torch.int64, self._device), non_blocking=True)
        graph.graph.replay()
        return graph.output[:n].clone()

    def _capture(self, bucket: int, memory: Any, table: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
        """Warm up, capture and replay bucket `bucket`'s step on inputs `rows`; its output."""
        inputs = to_device(rows, torch.int64, self._device)
        current = torch.cuda.current_stream(self._device)
        side = torch.cuda.Stream(self._device)
        side.wait_stream(current)
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(memory, table, inputs)
        current.wait_stream(side)
        torch.cuda.synchronize(self._device)
        t1 = time.perf_counter()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the runtime's other threads may touch CUDA (a D2H throttle) while this one captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            output = self._step(memory, table, inputs)
        self.warmup_seconds[bucket], self.capture_seconds[bucket] = t1 - t0, time.perf_counter() - t1
        self._graphs[bucket] = _Graph(inputs, graph, output)
        graph.replay()
        return output
