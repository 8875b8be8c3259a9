"""Overlap: how much restore time stays exposed when control prepares batch N+1 during N.

Workload: B decoding requests, and each step admits one new request whose prefix (an
extent of `restore_pages` pages, demoted to L2) must be restored and attached: the plan
is `Restore(x)` + the B decode items + the new item attaching `x` + `Close(new)` +
`Demote(previous x)`. Three loops over the same steps, same compute:

- *compute only*: the extents stay resident (no restores): step time `Tc`;
- *two-phase*: `prepare_batch(N+1)` (which starts N+1's restore) is issued before
  `execute_batch(N)`, so the H2D can run under compute(N): step time `T2`;
- *one-phase*: each batch is prepared right before it executes, so its restore has
  nothing to hide under: step time `T1`.

The transfer alone (`submit(Restore)` + `wait_completions` on an idle GPU) takes `Tx`.
On CUDA the exposure is read off the compute stream itself: the bench model records an
event when compute really starts (after the runtime's KV_READY waits), one on an idle
stream at the host's launch, and one at compute end; the wait beyond max(launch, previous
compute end), minus the same wait in the compute-only loop, over the restore's GPU time,
is the exposed fraction. It does not see host time: the restore's issue cost and the
bookkeeping of restores in `execute_batch` delay the *launch* of compute, which shows in
the step times (`step_time_exposed_*` in the details: (T - Tc) / Tx). On CPU: (T - Tc) / Tx from step times. Floored at 0.001
(timer resolution). Two-phase is the value (target <= 5% when the transfer fits under
compute(N)), one-phase the baseline.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch

from benchmarks import hooks
from benchmarks.decode import Decode, timed
from benchmarks.harness import Clock, allocator_counts, counts_since, exposure, median, steady_gc
from benchmarks.report import Row
from cacheruntime.protocol import BatchItem, BatchPlan, Close, Demote, Restore

SECTION = "overlap"
FLOOR = 1e-3


class OverlapLoop:
    def __init__(self, decode: Decode):
        self.d = decode
        self.rt = decode.rt
        self.step_no = 0

    def _plan(self, i: int, new: Any, restore: bool) -> BatchPlan:
        xs = self.d.extents
        x = xs[i % len(xs)]
        intents: list[Any] = []
        if restore:
            intents.append(Restore(x))
        intents.append(Close(new))
        if restore and i > 0:
            intents.append(Demote(xs[(i - 1) % len(xs)]))
        items = self.d.decode_items() + (BatchItem(new, (1,), attach=(x,)),)
        return BatchPlan(items, tuple(intents))

    def run(self, steps: int, *, mode: str, marker: Any = None) -> float:
        """Seconds per step of `steps` steps in `mode` ("compute", "two-phase", "one-phase")."""
        rt, d = self.rt, self.d
        restore = mode != "compute"
        mark = marker or (lambda name: contextlib.nullcontext())
        if not restore:
            rt.submit(tuple(Restore(x) for x in d.extents))
            rt.wait_completions()
        d.sync()
        if mode == "one-phase":

            def loop() -> None:
                for i in range(steps):
                    with mark(f"prepare {i}"):
                        h = rt.prepare_batch(self._plan(i, rt.open_request(), restore))
                    with mark(f"execute {i}"):
                        rt.execute_batch(h)
                    rt.poll_completions()

        else:

            def loop() -> None:
                with mark("prepare 0"):
                    h = rt.prepare_batch(self._plan(0, rt.open_request(), restore))
                for i in range(steps):
                    with mark(f"prepare {i + 1}"):
                        h_next = rt.prepare_batch(self._plan(i + 1, rt.open_request(), restore))
                    with mark(f"execute {i}"):
                        rt.execute_batch(h)
                    rt.poll_completions()
                    h = h_next
                self._tail = h

        self._tail = None
        seconds = timed(loop)
        d.sync()
        if self._tail is not None:
            rt.execute_batch(self._tail)  # the batch prepared ahead, untimed
        last = steps if mode != "one-phase" else steps - 1
        rt.wait_completions()
        if restore:
            rt.submit((Demote(d.extents[last % len(d.extents)]),))
        else:
            rt.submit(tuple(Demote(x) for x in d.extents))
        rt.wait_completions()
        return seconds / steps

    def transfer_alone(self, reps: int) -> float:
        rt, x = self.rt, self.d.extents[0]
        times = []
        for _ in range(reps + 1):
            self.d.sync()
            times.append(timed(lambda: (rt.submit((Restore(x),)), rt.wait_completions())))
            rt.submit((Demote(x),))
        return median(times[1:])


def _mode(loop: OverlapLoop, steps: int, mode: str) -> dict[str, float]:
    """Step time, and on CUDA the compute stream's measured waits, of `steps` steps in `mode`.

    Also per restore: the host time issuing it and (CUDA) its GPU time, from events on the
    stream it is issued on; and the caching allocator's counters over the loop.
    """
    device = loop.d.device
    cuda = device.type == "cuda"
    runner = loop.d.runner
    runner.marks = [] if cuda else None
    blocked = [0.0, 0]
    issue_ms: list[float] = []
    restore_events: list[tuple[Any, Any]] = []

    def restore(inner: Any, src: list[int], dst: list[int]) -> None:  # host time spent issuing the restore
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        inner(src, dst)
        seconds = time.perf_counter() - t0
        if cuda:
            end.record()
            restore_events.append((start, end))
        blocked[0] += seconds
        blocked[1] += 1
        issue_ms.append(round(seconds * 1e3, 3))

    before = allocator_counts(device)
    try:
        with hooks.restores_wrapped(loop.rt, restore):
            step = loop.run(steps, mode=mode)
        marks = runner.marks or []
    finally:
        runner.marks = None
    out = {"step_s": step, "blocked_s": blocked[0] / max(blocked[1], 1), "issue_per_step_ms": issue_ms, "allocator": counts_since(before, device)}
    if restore_events:
        out["restore_gpu_per_step_ms"] = [round(start.elapsed_time(end), 3) for start, end in restore_events]
    if marks:
        waited, busy = exposure(marks[: steps + (0 if mode == "one-phase" else 1)])
        out["waited_s"] = statistics.mean(waited)
        out["compute_s"] = statistics.mean(busy)
        out["waited_per_step_ms"] = [round(w * 1e3, 3) for w in waited]
    return out


def run(args: Any, device: torch.device, rows: list[Row], guard: Any, traces: dict[str, Any]) -> None:
    fit = _measure(args, device, args.restore_pages, rows, guard, traces, main=True)
    # The sweep: restores sized for other transfer/compute ratios, each row with its ratio.
    if fit is None:
        return
    per_page, compute = fit
    for target in getattr(args, "overlap_ratios", None) or []:
        pages = max(1, round(target * compute / per_page))
        if pages == args.restore_pages:
            continue
        _measure(args, device, pages, rows, guard, {}, main=False)


def _measure(args: Any, device: torch.device, pages: int, rows: list[Row], guard: Any, traces: dict[str, Any], *, main: bool) -> tuple[float, float] | None:
    """Measure one restore size; returns (restore GPU seconds per page, compute GPU seconds) on CUDA."""
    extents = 4
    growth = 8 * (args.steps + 2) + 64 + 4 * args.timeline_steps + 16
    d = Decode(args, device, extents=extents, extent_pages=pages, growth=growth, width_mult=args.overlap_width_mult)
    fit = None
    try:
        loop = OverlapLoop(d)
        loop.run(2, mode="two-phase")  # warm up every path once
        loop.run(2, mode="one-phase")
        loop.run(2, mode="compute")
        mem = hooks.memory(d.rt)
        l1_total = mem.l1.shape[2]
        src, dst = list(range(pages)), list(range(l1_total - pages, l1_total))
        for path in ("runtime",):
            with guard(SECTION, f"{path} pages={pages}"):
                # the restore alone on the GPU (this path's routine, CUDA events on a side stream)
                gpu_tx = median([Clock(device).gpu(lambda: mem.restore(src, dst)) for _ in range(args.reps + 1)][1:])
                with steady_gc():
                    compute = _mode(loop, args.steps, "compute")
                    two = _mode(loop, args.steps, "two-phase")
                    one = _mode(loop, args.steps, "one-phase")
                    compute2 = _mode(loop, args.steps, "compute")
                tc = (compute["step_s"] + compute2["step_s"]) / 2  # bracket the restore loops
                tx = loop.transfer_alone(args.reps)
                detail = {
                    "path": path,
                    "restore_pages": pages,
                    "compute_only_step_s": tc,
                    "two_phase_step_s": two["step_s"],
                    "one_phase_step_s": one["step_s"],
                    "restore_alone_protocol_s": tx,
                    "restore_alone_gpu_s": gpu_tx,
                    "restore_bytes": pages * d.page_bytes,
                    "decode_batch": args.decode_batch,
                    "context": args.context,
                    "step_time_exposed_two_phase": (two["step_s"] - tc) / tx,
                    "step_time_exposed_one_phase": (one["step_s"] - tc) / tx,
                }
                if "waited_s" in two:
                    # CUDA: the compute stream's own waits, beyond those of the compute-only loop
                    floor = (compute["waited_s"] + compute2["waited_s"]) / 2
                    e2 = (two["waited_s"] - floor) / gpu_tx
                    e1 = (one["waited_s"] - floor) / gpu_tx
                    ratio = gpu_tx / compute["compute_s"]
                    detail.update(
                        method="compute-stream wait beyond launch (CUDA events) / restore GPU time",
                        host_blocked_per_restore_two_phase_s=two["blocked_s"],
                        host_blocked_per_restore_one_phase_s=one["blocked_s"],
                        compute_gpu_s=two["compute_s"],
                        compute_only_gpu_s=compute["compute_s"],
                        transfer_over_compute=ratio,
                        waited_two_phase_s=two["waited_s"],
                        waited_one_phase_s=one["waited_s"],
                        waited_compute_only_s=floor,
                        waited_two_phase_per_step_ms=two["waited_per_step_ms"],
                        restore_issue_two_phase_per_step_ms=two["issue_per_step_ms"],
                        restore_gpu_two_phase_per_step_ms=two["restore_gpu_per_step_ms"],
                        allocator_per_mode={
                            "compute": compute["allocator"],
                            "two_phase": two["allocator"],
                            "one_phase": one["allocator"],
                            "compute_again": compute2["allocator"],
                        },
                        context_chunk=args.context_chunk,
                        transfer_fits_under_compute=gpu_tx < two["compute_s"],
                    )
                    fit = (gpu_tx / pages, compute["compute_s"])
                else:
                    e2, e1 = detail["step_time_exposed_two_phase"], detail["step_time_exposed_one_phase"]
                    ratio = tx / tc
                    detail.update(
                        method="step time (two-phase or one-phase - compute only) / restore time",
                        transfer_fits_under_compute=tx < tc,
                        transfer_over_compute=ratio,
                    )
                    fit = (tx / pages, tc)
                detail.update(raw_two_phase=e2, raw_one_phase=e1)
                rows.append(
                    Row(
                        SECTION,
                        f"overlap: exposed restore / transfer time, two-phase, transfer/compute={ratio:.2f} ({path})",
                        "frac",
                        max(e2, FLOOR),
                        max(e1, FLOOR),
                        "one-phase",
                        "value",
                        "<=",
                        0.05,
                        detail,
                    )
                )
                if main:
                    rows.append(
                        Row(
                            SECTION,
                            f"overlap: host blocked issuing a restore in prepare_batch ({path})",
                            "ms",
                            max(two["blocked_s"], 1e-6) * 1e3,
                            gpu_tx * 1e3,
                            "restore GPU time",
                            "ratio",
                            "<=",
                            0.05,
                            {"path": path, "restore_pages": pages, "one_phase_blocked_s": one["blocked_s"], "two_phase_blocked_s": two["blocked_s"]},
                        )
                    )
        if main and args.timeline_steps and device.type == "cuda":
            with guard(SECTION, "timeline"):
                capture(loop, 1, "warm-up")  # the profiler's first sessions lose GPU timestamps: warm it up
                capture(loop, 1, "warm-up")
                traces["two-phase"] = (capture_fn(lambda: loop.run(args.timeline_steps, mode="two-phase", marker=_marker("runtime"))), ["runtime"])
    finally:
        d.close()
    return fit


def _marker(label: str) -> Any:
    from torch.profiler import record_function

    return lambda name: record_function(f"bench: {label} {name}")


def capture_fn(fn: Any) -> Any:
    """A profiler trace (CPU markers + CUDA kernels and copies) of `fn()`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof


def capture(loop: OverlapLoop, steps: int, label: str) -> Any:
    return capture_fn(lambda: loop.run(steps, mode="two-phase", marker=_marker(label)))
