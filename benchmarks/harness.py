"""What every part of the bench shares: the clock, the runtime it builds, the models it runs.

The bench drives `LocalGPURuntime` through the protocol (`cacheruntime.protocol`); where it
needs more (its own model in the runtime, the free lists, the KV memory) it goes through
`benchmarks.hooks`, the one module that touches the runtime's parts.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import hooks
from cacheruntime.protocol import Tier


class Clock:
    """Wall clock and device-event timing for one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def wall(self, fn: Callable[[], Any]) -> float:
        """Seconds `fn` took on the host, from an idle device until it returned (and the device is idle)."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def gpu(self, fn: Callable[[], Any], stream: Any = None) -> float:
        """Seconds of device time between events around `fn` on `stream` (a side stream by default).

        On CPU: wall clock.
        """
        if not self.cuda:
            return self.wall(fn)
        stream = stream or torch.cuda.Stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        with torch.cuda.stream(stream):
            start.record(stream)
            fn()
            end.record(stream)
        end.synchronize()
        self.sync()
        return start.elapsed_time(end) / 1000.0


def median(values: list[float]) -> float:
    return statistics.median(values)


class GcClock:
    """Seconds the garbage collector ran, per generation, while installed (`with GcClock() as clock`)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._t0
            self.count[info["generation"]] += 1

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self)


@contextlib.contextmanager
def steady_gc() -> Any:
    """The garbage collector as a serving engine sets it after start-up: collected, then frozen.

    Everything built before (the runtime's pools, the rows' pages, the model) moves to the
    collector's permanent generation, as vLLM does with `gc.freeze()` after warm-up, so a
    full collection in the timed steps scans only what those steps allocated. The
    collector keeps running; it is unfrozen after.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def allocator_counts(device: torch.device) -> dict[str, int]:
    """The CUDA caching allocator's counters that show it mapping or unmapping device memory.

    `device_mallocs` / `device_frees`: cudaMalloc / cudaFree calls it made; `alloc_retries`:
    allocations that found no cached block and device memory full, so it freed its cache
    (which synchronizes the device) and tried again. Empty on CPU.
    """
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {
        "device_mallocs": stats.get("num_device_alloc", 0),
        "device_frees": stats.get("num_device_free", 0),
        "alloc_retries": stats.get("num_alloc_retries", 0),
    }


def counts_since(before: dict[str, int], device: torch.device) -> dict[str, int]:
    """`allocator_counts` now, less `before`."""
    return {name: value - before[name] for name, value in allocator_counts(device).items()}


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------
# Free-list fragmentation
# --------------------------------------------------------------------------------------


def scattered_runs(pages: list[int], run: int, needed: int, rng: random.Random) -> list[int]:
    """Reorder `pages` so that the first `needed` form runs of exactly `run` consecutive pages.

    The runs are taken from blocks of `run` consecutive pages, every other block only, so
    that two runs are never adjacent (coalescing cannot merge them), in random order.
    The remaining pages follow, in ascending order.
    """
    pages = sorted(pages)
    blocks = []
    i = 0
    while i + run <= len(pages):
        block = pages[i : i + run]
        if block[-1] - block[0] == run - 1:
            blocks.append(block)
            i += 2 * run  # skip the next block: runs are never adjacent
        else:
            i += 1
    want = -(-needed // run)
    if len(blocks) < want:
        raise ValueError(f"{len(pages)} free pages hold {len(blocks)} separated runs of {run}; {want} needed")
    chosen = rng.sample(blocks, want)
    head = [p for block in chosen for p in block]
    used = set(head)
    return head + [p for p in pages if p not in used]


def fragment_free_list(runtime: Any, tier: Tier, run: int, needed: int, rng: random.Random) -> None:
    """Make the runtime's allocator hand out its next `needed` `tier` pages in scattered runs of `run`."""
    free = hooks.free_list(runtime, tier)
    order = scattered_runs(list(free), run, needed, rng)
    free.clear()
    free.extend(order)


# --------------------------------------------------------------------------------------
# Models the bench runs inside the runtime
# --------------------------------------------------------------------------------------


class NullRunner:
    """No compute: one token per item, for measuring the boundary's bookkeeping alone."""

    tagged = False

    def __init__(self, device: torch.device):
        self.device = device

    def forward(self, memory: Any, table: torch.Tensor, items: list) -> torch.Tensor:
        return torch.zeros(len(items), dtype=torch.long, device=self.device)

    def finish(self, outputs: list, items: list) -> list[int]:
        return [int(t) for t in outputs]


class BenchRunner:
    """A decode step shaped like a dense 8B model on the runtime's paged KV.

    Per batch: every new token's K and V is written in every layer at the location the
    ReqToToken table gives; every item's whole context (`0 .. end-1`) is read back through
    the table (the bytes attention reads); and `layers` weight matrices of
    `[hidden, hidden * width_mult]` are read once (a batched GEMV, the memory-bound part of
    decode). Without a context read (`read_context=False`) it is a prefill writer.

    The context is gathered `context_chunk` tokens at a time into one buffer allocated
    once, as an attention kernel streams KV through on-chip memory instead of
    materializing it. Gathering the whole context at once (`context_chunk=0`) allocates a
    block of ~2 GB that grows every step: the CUDA caching allocator cannot reuse the
    previous step's block, so it maps a new one every step and, with device memory full,
    frees its cache and retries. On an H200 that doubled the runtime's restore times for
    runs of ~8 steps twice per 60 steps (docs/bench-h200/history/benchmarks-2026-11-29.md, overlap).
    """

    tagged = False

    def __init__(
        self,
        device: torch.device,
        kv_shape: tuple[int, int, int],  # (layers, KV heads, head dim) of the runtime's KV memory
        *,
        hidden: int,
        weight_layers: int,
        width_mult: int,
        max_new_tokens: int,
        dtype: torch.dtype,
        seed: int = 0,
        read_context: bool = True,
        context_chunk: int = 2048,
    ):
        self.device = device
        self.read_context = read_context
        self.context_chunk = context_chunk
        self._chunk: torch.Tensor | None = None  # the gather buffer: layers * 2 * context_chunk * heads * head_dim values
        gen = torch.Generator(device=device).manual_seed(seed)
        layers, heads, head_dim = kv_shape
        self.hidden = hidden
        self.weights = [torch.randn(hidden, hidden * width_mult, generator=gen, device=device, dtype=dtype) * hidden**-0.5 for _ in range(weight_layers)]
        self.x = torch.randn(512, hidden, generator=gen, device=device, dtype=dtype)
        self.kv_values = torch.randn(layers, 2, max_new_tokens, heads, head_dim, generator=gen, device=device, dtype=dtype)
        #: when a list, each forward appends CUDA events (host launch, compute start, compute end)
        self.marks: list[tuple[Any, Any, Any]] | None = None
        self._idle = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _mark(self) -> tuple[Any, Any] | None:
        """Events for `exposure`: one on an idle stream (completes at once: the host's launch
        time on the GPU clock) and one on the compute stream (when compute really starts,
        after the runtime's waits for KV_READY)."""
        if self.marks is None or self._idle is None:
            return None
        launch, start = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        launch.record(self._idle)
        start.record()
        return launch, start

    def forward(self, memory: Any, table: torch.Tensor, items: list) -> torch.Tensor:
        marks = self._mark()
        out = self._forward(memory, table, items)
        if marks is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((*marks, end))
        return out

    def _forward(self, memory: Any, table: torch.Tensor, items: list) -> torch.Tensor:
        layers, two, pages, page_size, heads, head_dim = memory.l1.shape
        kv = memory.l1.view(layers, two, pages * page_size, heads, head_dim)
        rows = [it.slot for it in items for _ in range(it.start, it.end)]
        cols = [pos for it in items for pos in range(it.start, it.end)]
        index = hooks.to_device([rows, cols], torch.long, self.device)
        new = table[index[0], index[1]].long()
        count, have = new.numel(), self.kv_values.shape[2]
        if count <= have:
            values = self.kv_values[:, :, :count]
        else:
            values = self.kv_values.index_select(2, torch.arange(count, device=self.device) % have)
        kv.index_copy_(2, new, values)
        score = torch.zeros((), device=self.device, dtype=torch.float32)
        if self.read_context:
            context = torch.cat([table[it.slot, : it.end] for it in items]).long()
            score = self._read(kv, context)
        x = self.x[: len(items)]
        for weight in self.weights:
            x = torch.tanh((x @ weight)[:, : self.hidden])
        return (x.float().sum(dim=1) + score).abs().long() % 1000

    def _read(self, kv: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The sum of the KV at token locations `context`, read `context_chunk` tokens at a time.

        Each chunk is gathered into a prefix of one buffer allocated once (the last chunk
        into a shorter prefix), so every step reads exactly its context's bytes and
        allocates nothing large.
        """
        chunk = self.context_chunk
        if chunk <= 0:
            return kv.index_select(2, context).sum(dtype=torch.float32)
        layers, two, _, heads, head_dim = kv.shape
        if self._chunk is None:
            self._chunk = kv.new_empty(layers * two * chunk * heads * head_dim)
        score = torch.zeros((), device=kv.device, dtype=torch.float32)
        count = context.numel()
        for lo in range(0, count, chunk):
            n = min(chunk, count - lo)
            out = self._chunk[: layers * two * n * heads * head_dim].view(layers, two, n, heads, head_dim)
            torch.index_select(kv, 2, context[lo : lo + n], out=out)
            score += out.sum(dtype=torch.float32)
        return score

    def finish(self, outputs: list, items: list) -> list[int]:
        return [int(t) for t in outputs]


def kv_config(args: Any, tiny: bool = False) -> hooks.DecoderConfig:
    """The runtime's DecoderConfig with the KV shape under test (the runner itself is the bench's).

    `tiny`: a minimal KV shape, for measurements of bookkeeping alone.
    """
    if tiny:
        return hooks.DecoderConfig(vocab=97, hidden=16, layers=1, heads=1, head_dim=8, mlp=16, dtype="float32")
    return hooks.DecoderConfig(vocab=97, hidden=16, layers=args.layers, heads=args.kv_heads, head_dim=args.head_dim, mlp=16, dtype=args.dtype)


def make_runtime(args: Any, device: torch.device, runner: Any, tiny_kv: bool = False, **sizes: Any) -> Any:
    """A LocalGPURuntime with the bench's KV shape running `runner`; `sizes` are its constructor's pool sizes."""
    return hooks.new_runtime(kv_config(args, tiny=tiny_kv), device, seed=args.seed, runner=runner, **sizes)


def exposure(marks: list[tuple[Any, Any, Any]]) -> tuple[list[float], list[float]]:
    """Per batch after the first: seconds the compute stream waited beyond what it had to
    (start - max(host launch, previous compute end)), and the compute's own seconds."""
    waited, busy = [], []
    for (_, _, prev_end), (launch, start, end) in itertools.pairwise(marks):
        late = min(launch.elapsed_time(start), prev_end.elapsed_time(start)) / 1000.0
        waited.append(max(late, 0.0))
        busy.append(start.elapsed_time(end) / 1000.0)
    return waited, busy


def bench_runner(args: Any, device: torch.device, *, read_context: bool, max_new_tokens: int, width_mult: int | None = None) -> BenchRunner:
    """The bench model for the KV shape of `args` (`kv_config`)."""
    config = kv_config(args)
    return BenchRunner(
        device,
        (config.layers, config.heads, config.head_dim),
        hidden=args.hidden,
        weight_layers=args.weight_layers if read_context else 0,
        width_mult=width_mult or args.width_mult,
        max_new_tokens=max_new_tokens,
        dtype=getattr(torch, args.dtype),
        seed=args.seed,
        read_context=read_context,
        context_chunk=args.context_chunk,
    )


def close_runtime(runtime: Any) -> None:
    try:
        runtime.close()
    finally:
        free_memory()
