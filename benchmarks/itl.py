"""Decode inter-token latency with background write-back running, against none.

B requests decode one token a step. In the write-back steps every plan also carries
`Backup` of one request's published prefix (`writeback_pages` pages), and `Drop`s the host
copies of the ones whose completion was reported (so the next backup moves them again):
the D2H stream is kept busy in the background, as a write-through HiCache keeps it. The
quiet and write-back blocks alternate (`rounds` times) so drift cancels. ITL = the host
time of one step (prepare + execute + poll), mean over the steps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.decode import Decode, timed
from benchmarks.harness import GcClock, allocator_counts, counts_since, steady_gc
from benchmarks.report import Row
from cacheruntime.protocol import Backup, BatchPlan, Drop

SECTION = "itl"


class WriteBack:
    def __init__(self, decode: Decode, pages: int):
        rt = self.rt = decode.rt
        self.d = decode
        self.extents = {}
        for r in decode.requests:
            x = rt.publish(r, 0, pages)
            self.extents[x.generation] = x
        self.state = dict.fromkeys(self.extents, "idle")
        self.order = list(self.extents)
        self.next = 0
        self.moved = 0

    def intents(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for g, s in self.state.items():
            if s == "backed":
                out.append(Drop(self.extents[g]))
                self.state[g] = "dropping"
        for _ in range(len(self.order)):
            g = self.order[self.next % len(self.order)]
            self.next += 1
            if self.state[g] == "idle":
                out.append(Backup(self.extents[g]))
                self.state[g] = "inflight"
                break
        return tuple(out)

    def after_execute(self) -> None:
        for g, s in self.state.items():
            if s == "dropping":
                self.state[g] = "idle"

    def completed(self, completions: tuple[Any, ...]) -> None:
        for c in completions:
            g = c.ticket.extent_generation
            if self.state.get(g) == "inflight":
                self.state[g] = "backed"
                self.moved += c.ticket.page_count

    def drain(self) -> None:
        self.completed(self.rt.wait_completions())
        drops = [Drop(self.extents[g]) for g, s in self.state.items() if s == "backed"]
        if drops:
            self.rt.submit(tuple(drops))
        self.state = dict.fromkeys(self.extents, "idle")


def steps(d: Decode, n: int, wb: WriteBack | None, split: dict[str, float] | None = None) -> list[float]:
    """Host seconds of each of `n` decode steps; `split` accumulates each call's host seconds."""
    rt = d.rt
    times = []
    split = {} if split is None else split
    for _ in range(n):

        def step() -> None:
            intents = wb.intents() if wb else ()
            t0 = time.perf_counter()
            h = rt.prepare_batch(BatchPlan(d.decode_items(), intents))
            t1 = time.perf_counter()
            rt.execute_batch(h)
            t2 = time.perf_counter()
            if wb:
                wb.after_execute()
            done = rt.poll_completions()
            t3 = time.perf_counter()
            for name, seconds in (("prepare_batch", t1 - t0), ("execute_batch", t2 - t1), ("poll_completions", t3 - t2)):
                split[name] = split.get(name, 0.0) + seconds
            if wb:
                wb.completed(done)

        times.append(timed(step))
    if wb:
        wb.drain()
    d.sync()
    return times


def _compute_ms(d: Decode, n: int, wb: WriteBack | None, split: dict[str, float], gpu: list[float]) -> list[float]:
    """`steps`, recording each batch's compute GPU time (CUDA events of the bench model) into `gpu`."""
    runner = d.runner
    runner.marks = [] if d.device.type == "cuda" else None
    try:
        times = steps(d, n, wb, split)
        if runner.marks:
            gpu += [start.elapsed_time(end) for _, start, end in runner.marks]
    finally:
        runner.marks = None
    return times


def _measure(args: Any, device: torch.device, options: dict[str, Any], setup: Callable[[Any], None] | None = None) -> tuple[float, float, dict[str, Any]]:
    """Mean step seconds quiet and with write-back, and the details; `setup(runtime)` runs first (diagnostics)."""
    growth = 2 * (2 * args.rounds * args.steps + 8) + 64
    wb_pages = min(args.writeback_pages, args.context // args.overlap_page_size)
    d = Decode(args, device, extents=0, extent_pages=1, growth=growth, l2_extra=(args.decode_batch + 4) * wb_pages, runtime_options=options)
    try:
        if setup is not None:
            setup(d.rt)
        wb = WriteBack(d, wb_pages)
        steps(d, 2, None)
        steps(d, 2, wb)
        quiet: list[float] = []
        busy: list[float] = []
        quiet_gpu: list[float] = []
        busy_gpu: list[float] = []
        quiet_split: dict[str, float] = {}
        busy_split: dict[str, float] = {}
        wb.moved = 0
        before = allocator_counts(device)
        with steady_gc(), GcClock() as clock:
            for _ in range(args.rounds):
                quiet += _compute_ms(d, args.steps, None, quiet_split, quiet_gpu)
                busy += _compute_ms(d, args.steps, wb, busy_split, busy_gpu)
        mq, mb = statistics.mean(quiet), statistics.mean(busy)
        detail = {
            "decode_batch": args.decode_batch,
            "context": args.context,
            "writeback_pages_per_backup": wb_pages,
            "writeback_bytes_per_s": wb.moved * d.page_bytes / sum(busy),
            "quiet_p50_ms": statistics.median(quiet) * 1e3,
            "busy_p50_ms": statistics.median(busy) * 1e3,
            "quiet_max_ms": max(quiet) * 1e3,
            "busy_max_ms": max(busy) * 1e3,
            "quiet_per_call_ms": {k: v / len(quiet) * 1e3 for k, v in quiet_split.items()},
            "busy_per_call_ms": {k: v / len(busy) * 1e3 for k, v in busy_split.items()},
            "gc_ms_in_window": sum(clock.seconds) * 1e3,
            "gc_collections_in_window": clock.count,
            "allocator_in_window": counts_since(before, device),
            "context_chunk": args.context_chunk,
        }
        if quiet_gpu and busy_gpu:
            detail.update(quiet_compute_gpu_ms=statistics.mean(quiet_gpu), busy_compute_gpu_ms=statistics.mean(busy_gpu))
        return mq, mb, detail
    finally:
        d.close()


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    for path in ("runtime",):
        with guard(SECTION, path):
            mq, mb, detail = _measure(args, device, {})
            # the same runtime without its D2H throttle (every backup issued whole at once)
            uq, ub, unthrottled = _measure(args, device, {"d2h_bytes_per_batch": None})
            detail.update(
                path=path,
                d2h_bytes_per_batch="runtime default",
                unthrottled_ratio=ub / uq,
                unthrottled_quiet_ms=uq * 1e3,
                unthrottled_busy_ms=ub * 1e3,
                unthrottled=unthrottled,
            )
            rows.append(Row(SECTION, f"decode ITL with background write-back ({path})", "ms", mb * 1e3, mq * 1e3, "no write-back", "ratio", "<=", 1.03, detail))
