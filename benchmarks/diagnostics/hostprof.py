"""Where the boundary's host time goes (diagnostics, not table rows): `python -m benchmarks.diagnostics.hostprof OUT_DIR [DEVICE]`.

The bench's rows say how long a call takes; this says why, on the machine that runs it:

- **decode step** (the cpu section's workload, B = 1 and 256, page size 16, context 1024):
  per-call means of `prepare_batch`, `execute_batch`, `poll_completions` and of the
  in-process baseline's step, each with the garbage collector running (as in the bench,
  with the collector's own time in the window recorded) and paused; and a cProfile of
  the boundary steps with the collector paused, so that the collector's time is not
  charged to whichever function happened to allocate;
- **restore issue**: host time of `KVMemory.restore` for 384 pages of 2 MiB from one
  contiguous host run into scattered device pages (the overlap section's restore), and
  its cProfile.

Writes `hostprof.json` and `hostprof.txt` (the profiles) under OUT_DIR.
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import pstats
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.cpucost import CALLS, DirectPools, timed_step
from benchmarks.harness import GcClock, NullRunner, close_runtime, make_runtime
from benchmarks.hooks import KVMemory
from cacheruntime.protocol import BatchItem, BatchPlan


def _top(profile: cProfile.Profile, title: str, lines: int = 30) -> str:
    text = io.StringIO()
    text.write(f"==== {title}\n")
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(lines)
    return text.getvalue()


def decode_step(device: torch.device, batch: int, steps: int, report: list[str]) -> dict[str, Any]:
    ps, context = 16, 1024
    args = SimpleNamespace(seed=0)
    max_tokens = -(-(context + 4 * steps + 64) // ps) * ps + ps
    pages = batch * (max_tokens // ps) + 8
    rt = make_runtime(
        args, device, NullRunner(device), tiny_kv=True, page_size=ps, max_requests=batch, max_request_tokens=max_tokens, l1_pages=pages, l2_pages=0
    )
    out: dict[str, Any] = {"batch": batch, "steps": steps}
    try:
        requests = [rt.open_request() for _ in range(batch)]
        rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * context) for r in requests))))
        plan = BatchPlan(tuple(BatchItem(r, (1,)) for r in requests))
        split = dict.fromkeys(CALLS, 0.0)

        def step() -> None:
            timed_step(rt, plan, split)

        def window(label: str, collect: bool) -> None:
            for _ in range(10):
                step()
            split.update(dict.fromkeys(CALLS, 0.0))
            if not collect:
                gc.disable()
            try:
                with GcClock() as clock:
                    for _ in range(steps):
                        step()
            finally:
                gc.enable()
            out[label] = {
                **{f"{call}_us": seconds / steps * 1e6 for call, seconds in split.items()},
                "total_us": sum(split.values()) / steps * 1e6,
                "gc_us_per_step": [s / steps * 1e6 for s in clock.seconds],
                "gc_collections": clock.count,
            }

        window("boundary_gc_on", True)
        window("boundary_gc_off", False)
        profile = cProfile.Profile()
        gc.disable()
        try:
            profile.enable()
            for _ in range(steps):
                step()
            profile.disable()
        finally:
            gc.enable()
        report.append(_top(profile, f"decode step B={batch}, {steps} steps, collector paused"))
        direct = DirectPools(device, batch, ps, pages, max_tokens)
        direct.prefill(context)
        for label, collect in (("baseline_gc_on", True), ("baseline_gc_off", False)):
            for _ in range(10):
                direct.step()
            if not collect:
                gc.disable()
            try:
                with GcClock() as clock:
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        direct.step()
                    seconds = time.perf_counter() - t0
            finally:
                gc.enable()
            out[label] = {"total_us": seconds / steps * 1e6, "gc_us_per_step": [s / steps * 1e6 for s in clock.seconds]}
        out["tracked_objects"] = len(gc.get_objects())
    finally:
        close_runtime(rt)
    return out


def restore_issue(device: torch.device, report: list[str]) -> dict[str, Any]:
    pages = 384
    mem = KVMemory(device=device, l1_pages=4 * pages, l2_pages=pages + 8, page_size=16, layers=32, heads=8, head_dim=128, dtype=torch.bfloat16)
    rng = random.Random(0)
    src = list(range(pages))
    out: dict[str, Any] = {"pages": pages, "page_bytes": mem.page_bytes}
    times = []
    profile = cProfile.Profile()
    for rep in range(12):
        dst = rng.sample(range(4 * pages), pages)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        if rep >= 2:
            profile.enable()
        mem.restore(src, dst)
        if rep >= 2:
            profile.disable()
        times.append(time.perf_counter() - t0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out["issue_ms"] = [t * 1e3 for t in times]
    out["path"] = mem.last_path
    report.append(_top(profile, "KVMemory.restore issue, 384 pages, 10 calls"))
    return out


def main(out_dir: str, device_name: str | None = None) -> None:
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    out: dict[str, Any] = {"device": str(device), "python": sys.version, "torch": torch.__version__, "gc_threshold": gc.get_threshold()}
    report: list[str] = []
    for batch in (1, 16, 256):
        out[f"decode_B{batch}"] = decode_step(device, batch, 300, report)
    out["restore_issue"] = restore_issue(device, report)
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "hostprof.json").write_text(json.dumps(out, indent=1))
    (path / "hostprof.txt").write_text("\n".join(report))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
