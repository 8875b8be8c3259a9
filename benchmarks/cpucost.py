"""Control-side CPU cost of one decode step through the boundary, against in-process bookkeeping.

Through the boundary: `prepare_batch` + `execute_batch` + `poll_completions` of B decode
items, one token each, on rows already holding `cpu_context` tokens (the runtime's state
is as large as a serving engine's), on a runtime whose model is `NullRunner` (one tiny kernel and one
device->host read of B tokens), so the time is the boundary's bookkeeping: validation,
page allocation, ReqToToken writes, completion handling.

The baseline does the same bookkeeping in-process directly on the pools, as SGLang's
scheduler does (`alloc_decode` + the ReqToToken write): a free-list pop when a row
crosses a page boundary, the B new token locations computed on the host and written to
the device table with one indexed store, plus the same null model step. SGLang's own
code on the same workload is the `cpu-sglang` section (`benchmarks/sglangcpu.py`), which
times these two sides again beside it.

Both sides run the same number of steps, in blocks that alternate between them
(`alternating`), so a drift of the host's speed during the run weighs on both alike.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.harness import GcClock, NullRunner, close_runtime, make_runtime, steady_gc
from benchmarks.hooks import to_device
from benchmarks.report import Row
from cacheruntime.protocol import BatchItem, BatchPlan

SECTION = "cpu"


class DirectPools:
    """The bookkeeping of a decode step done in-process on a free list and the table."""

    def __init__(self, device: torch.device, batch: int, page_size: int, pages: int, max_tokens: int):
        self.device, self.page_size = device, page_size
        self.free = list(range(pages))
        self.table = torch.zeros(batch, max_tokens, dtype=torch.int32, device=device)
        self.rows: list[list[int]] = [[] for _ in range(batch)]
        self.lengths = [0] * batch
        self.null = NullRunner(device)

    def prefill(self, tokens: int) -> None:
        """Rows of `tokens` tokens each (the table write of a prefill is not timed)."""
        for slot in range(len(self.lengths)):
            for _ in range(-(-tokens // self.page_size)):
                self.rows[slot].append(self.free.pop())
            self.lengths[slot] = tokens

    def step(self) -> list[int]:
        ps = self.page_size
        slots, positions, locations = [], [], []
        for slot, length in enumerate(self.lengths):
            if length % ps == 0:
                self.rows[slot].append(self.free.pop())
            slots.append(slot)
            positions.append(length)
            locations.append(self.rows[slot][length // ps] * ps + length % ps)
            self.lengths[slot] = length + 1
        index = to_device([slots, positions], torch.long, self.device)
        self.table[index[0], index[1]] = to_device(locations, torch.int32, self.device)
        return self.null.finish(self.null.forward(None, self.table, slots).tolist(), slots)


CALLS = ("prepare_batch", "execute_batch", "poll_completions")


@dataclass(frozen=True)
class Shape:
    """The sizes of one cpu measurement: B rows of `context` tokens in pages of `page_size`, in a pool of `pages`."""

    batch: int
    page_size: int
    pages: int
    max_tokens: int  # per row
    context: int


@dataclass
class DecodeSides:
    """The sides of one cpu measurement, ready to time: name -> one decode step (`alternating` takes them)."""

    shape: Shape
    split: dict[str, float]  # the boundary's seconds per call, summed by its step
    steps: dict[str, Callable[[], Any]]


def timed_step(rt: Any, plan: BatchPlan, split: dict[str, float]) -> None:
    """One decode step through the boundary; each call's host seconds are added to `split`."""
    t0 = time.perf_counter()
    h = rt.prepare_batch(plan)
    t1 = time.perf_counter()
    rt.execute_batch(h)
    t2 = time.perf_counter()
    rt.poll_completions()
    t3 = time.perf_counter()
    split["prepare_batch"] += t1 - t0
    split["execute_batch"] += t2 - t1
    split["poll_completions"] += t3 - t2


def _mean_step(fn: Any, steps: int) -> tuple[float, float]:
    """Mean seconds per call of `fn` over `steps` calls, and the garbage collector's seconds per call in them.

    The collector starts each window with nothing left over from the setup, and with the
    setup's objects frozen (`steady_gc`), so what it costs in the window is what the steps
    themselves allocate.
    """
    with steady_gc(), GcClock() as clock:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        seconds = time.perf_counter() - t0
    return seconds / steps, sum(clock.seconds) / steps


#: The timed steps of each side are split into this many blocks, the two sides' blocks
#: alternating: the host's speed drifts within a run (on the H200's host the baseline alone
#: moved by half between two processes), and alternation puts both sides in the same windows.
BLOCKS = 6


def block_sizes(steps: int, blocks: int = BLOCKS) -> list[int]:
    """How `alternating` splits `steps` steps into blocks (at most `blocks`, none empty)."""
    blocks = max(1, min(blocks, steps))
    return [steps // blocks + (1 if i < steps % blocks else 0) for i in range(blocks)]


def alternating(sides: dict[str, Any], steps: int, blocks: int = BLOCKS) -> dict[str, dict[str, Any]]:
    """Per side: mean seconds per step, collector seconds per step, and each block's mean,
    over `steps` steps run in `blocks` blocks alternating between the sides."""
    sizes = block_sizes(steps, blocks)
    out = {name: {"seconds": 0.0, "gc_seconds": 0.0, "block_means": []} for name in sides}
    for size in sizes:
        for name, fn in sides.items():
            mean, gc_mean = _mean_step(fn, size)
            side = out[name]
            side["seconds"] += mean * size / steps
            side["gc_seconds"] += gc_mean * size / steps
            side["block_means"].append(mean)
    return out


def shape_of(args: Any, batch: int) -> Shape:
    """The sizes of the cpu measurement of `batch` rows: room for the context, the warm-up and the timed steps."""
    ps = args.cpu_page_size
    total = args.cpu_context + args.cpu_warmup + args.cpu_steps
    max_tokens = -(-total // ps) * ps + ps
    return Shape(batch, ps, batch * (max_tokens // ps) + 8, max_tokens, args.cpu_context)


@contextlib.contextmanager
def boundary_rows(args: Any, device: torch.device, shape: Shape, split: dict[str, float], **options: Any) -> Iterator[Callable[[], None]]:
    """One decode step through a runtime (constructor `options`) holding `shape.batch` rows of
    `shape.context` tokens; each call's seconds are added to `split`. Closed on exit."""
    rt = make_runtime(
        args,
        device,
        NullRunner(device),
        tiny_kv=True,
        page_size=shape.page_size,
        max_requests=shape.batch,
        max_request_tokens=shape.max_tokens,
        l1_pages=shape.pages,
        l2_pages=0,
        **options,
    )
    try:
        requests = [rt.open_request() for _ in range(shape.batch)]
        if shape.context:
            rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * shape.context) for r in requests))))
        yield functools.partial(timed_step, rt, BatchPlan(tuple(BatchItem(r, (1,)) for r in requests)), split)
    finally:
        close_runtime(rt)


@contextlib.contextmanager
def decode_sides(args: Any, device: torch.device, batch: int) -> Iterator[DecodeSides]:
    """The boundary and the in-process baseline, each with `batch` rows of `args.cpu_context` tokens, warmed up."""
    shape = shape_of(args, batch)
    split = dict.fromkeys(CALLS, 0.0)
    with boundary_rows(args, device, shape, split) as boundary_step:
        direct_pools = DirectPools(device, batch, shape.page_size, shape.pages, shape.max_tokens)
        direct_pools.prefill(args.cpu_context)
        for _ in range(args.cpu_warmup):
            boundary_step()
            direct_pools.step()
        split.update(dict.fromkeys(split, 0.0))  # in place: boundary_step adds into this dict
        yield DecodeSides(shape, split, {"boundary": boundary_step, "in_process": direct_pools.step})


def timing_detail(args: Any, sides: DecodeSides, timed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What every cpu row carries beside its two numbers: the sizes, the boundary's calls, the collector, the blocks."""
    return {
        "batch": sides.shape.batch,
        "page_size": sides.shape.page_size,
        "steps": args.cpu_steps,
        "context": args.cpu_context,
        "per_call_us": {k: v / args.cpu_steps * 1e6 for k, v in sides.split.items()},
        "gc_us_per_step": {name: side["gc_seconds"] * 1e6 for name, side in timed.items()},
        "block_means_us": {name: [round(m * 1e6, 2) for m in side["block_means"]] for name, side in timed.items()},
    }


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    for batch in args.cpu_batches:
        with guard(SECTION, f"B={batch}"), decode_sides(args, device, batch) as sides:
            timed = alternating(sides.steps, args.cpu_steps)
            boundary, direct = timed["boundary"]["seconds"], timed["in_process"]["seconds"]
            rows.append(
                Row(
                    SECTION,
                    f"CPU per decode step B={batch} (prepare+execute+poll)",
                    "us",
                    boundary * 1e6,
                    direct * 1e6,
                    "in-process on pools",
                    "ratio",
                    "<=",
                    1.0,
                    timing_detail(args, sides, timed),
                )
            )
