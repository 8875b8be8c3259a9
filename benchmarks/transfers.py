"""Restore (L2 -> L1) and backup (L1 -> L2) throughput of scattered page runs.

For each page size and run length, one extent of `transfer_mib` worth of pages is
prefilled, published, backed up and demoted through the protocol, with the runtime's free
lists fragmented so that both its device pages and its host pages lie in scattered runs of
exactly `run` pages. Then, against a plain pinned `copy_` of one contiguous buffer of the
same bytes (raw cudaMemcpy), measured in the same run:

- *protocol*: `submit((Restore(x),))` + `wait_completions()` (and Drop + Backup), host clock
  from an idle device until the completion is reported: what control sees;
- *data path*: the runtime's `KVMemory.restore`/`backup` alone on the same physical page
  lists, CUDA events on a side stream: the copy routine without bookkeeping.

Both directions at once (per page size, scattered runs of the middle length): one extent restored
and another backed up by one `submit` + `wait_completions()`, against both pinned copies
running together on two streams in the same run (target >= 0.90): H2D and D2H share the
PCIe link's two directions and the host's memory, so the baseline is their joint rate,
not the sum of each alone.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import torch

from benchmarks import hooks
from benchmarks.harness import (
    Clock,
    bench_runner,
    close_runtime,
    fragment_free_list,
    make_runtime,
    median,
    scattered_runs,
)
from benchmarks.report import Row
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Drop, Restore, Tier

SECTION = "transfer"


def run(args: Any, device: torch.device, clock: Clock, rows: list[Row], guard: Any) -> None:
    for page_size in args.page_sizes:
        with guard(SECTION, f"page_size={page_size}"):
            _page_size(args, device, clock, rows, guard, page_size)


def _page_bytes(args: Any, page_size: int) -> int:
    return args.layers * 2 * page_size * args.kv_heads * args.head_dim * torch.empty((), dtype=getattr(torch, args.dtype)).element_size()


def _page_size(args: Any, device: torch.device, clock: Clock, rows: list[Row], guard: Any, page_size: int) -> None:
    page_bytes = _page_bytes(args, page_size)
    longest = max(args.runs)
    pages = max(longest, (args.transfer_mib << 20) // page_bytes)
    pages = -(-pages // longest) * longest  # whole runs of every length
    nbytes = pages * page_bytes
    pool = 3 * pages + 2 * longest  # both directions: two extents live, and room to scatter a third
    runner = bench_runner(args, device, read_context=False, max_new_tokens=min(pages * page_size, 4096))
    rt = make_runtime(args, device, runner, page_size=page_size, max_requests=2, max_request_tokens=pages * page_size, l1_pages=pool, l2_pages=pool)
    try:
        base_h2d, base_d2h = _baselines(args, device, clock, nbytes)
        rng = random.Random(args.seed)
        mem = hooks.memory(rt)
        for run_len in args.runs:
            with guard(SECTION, f"page_size={page_size} run={run_len}"):
                _one(args, device, clock, rows, rt, mem, page_size, run_len, pages, nbytes, base_h2d, base_d2h, rng)
        with guard(SECTION, f"page_size={page_size} both directions"):
            _both_directions(args, device, clock, rows, rt, page_size, sorted(args.runs)[len(args.runs) // 2], pages, nbytes, rng)
    finally:
        close_runtime(rt)


def _baselines(args: Any, device: torch.device, clock: Clock, nbytes: int) -> tuple[float, float]:
    """Raw pinned copies of one contiguous buffer of `nbytes`, each way, in seconds (median)."""
    pin = device.type == "cuda"
    host = torch.randint(0, 255, (nbytes,), dtype=torch.uint8).pin_memory() if pin else torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = [clock.gpu(lambda: dev.copy_(host, non_blocking=True)) for _ in range(args.reps + 1)][1:]
    d2h = [clock.gpu(lambda: host.copy_(dev, non_blocking=True)) for _ in range(args.reps + 1)][1:]
    return median(h2d), median(d2h)


def scattered_extent(rt: Any, page_size: int, run_len: int, pages: int, rng: random.Random) -> Any:
    """An extent over `pages` pages, backed up and demoted, whose device and host pages lie in scattered runs of `run_len`."""
    fragment_free_list(rt, Tier.L1, run_len, pages, rng)
    fragment_free_list(rt, Tier.L2, run_len, pages, rng)
    request = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1,) * (pages * page_size)),))))
    extent = rt.publish(request, 0, pages)
    rt.close_request(request)
    rt.submit((Backup(extent),))
    rt.wait_completions()
    rt.submit((Demote(extent),))
    return extent


def _one(args, device, clock, rows, rt, mem, page_size, run_len, pages, nbytes, base_h2d, base_d2h, rng) -> None:
    extent = scattered_extent(rt, page_size, run_len, pages, rng)

    def protocol_restore() -> float:
        fragment_free_list(rt, Tier.L1, run_len, pages, rng)
        seconds = clock.wall(lambda: (rt.submit((Restore(extent),)), rt.wait_completions()))
        return seconds

    def protocol_backup() -> float:
        rt.submit((Drop(extent),))
        fragment_free_list(rt, Tier.L2, run_len, pages, rng)
        return clock.wall(lambda: (rt.submit((Backup(extent),)), rt.wait_completions()))

    def measure_protocol() -> tuple[list[float], list[float]]:
        restores = []
        for _ in range(args.reps + 1):
            restores.append(protocol_restore())
            rt.submit((Demote(extent),))
        restores = restores[1:]
        rt.submit((Restore(extent),))
        rt.wait_completions()
        backups = [protocol_backup() for _ in range(args.reps + 1)][1:]
        rt.submit((Demote(extent),))  # back to host-only for the next measurement
        return restores, backups

    # Physical page lists for the data-path timings, scattered the same way.
    src_l2 = scattered_runs(list(range(mem.l2.shape[0])), run_len, pages, rng)[:pages]
    dst_l1 = scattered_runs(list(range(mem.l1.shape[2])), run_len, pages, rng)[:pages]

    copy_paths: dict[str, str] = {}  # which copy routine the data path took: "uva" or "dma"

    def measure_data_path(restore, backup) -> tuple[list[float], list[float]]:
        r = [clock.gpu(lambda: restore(src_l2, dst_l1)) for _ in range(args.reps + 1)][1:]
        copy_paths["restore"] = mem.last_path
        b = [clock.gpu(lambda: backup(dst_l1, src_l2)) for _ in range(args.reps + 1)][1:]
        copy_paths["backup"] = mem.last_path
        return r, b

    label = f"ps={page_size} run={run_len}"
    detail = {"page_size": page_size, "run": run_len, "pages": pages, "bytes": nbytes, "page_bytes": mem.page_bytes}
    gbps = lambda seconds: nbytes / seconds / 1e9  # noqa: E731
    b_h2d, b_d2h = gbps(base_h2d), gbps(base_d2h)

    def add(kind: str, what: str, reps: list[float]) -> None:
        restore, seconds = kind == "restore", median(reps)
        rows.append(
            Row(
                SECTION,
                f"{kind} {'L2->L1' if restore else 'L1->L2'} {label} {what}",
                "GB/s",
                gbps(seconds),
                b_h2d if restore else b_d2h,
                "pinned copy_ " + ("H2D" if restore else "D2H"),
                "ratio",
                ">=",
                0.90,
                dict(detail, path=what, seconds=seconds, seconds_per_rep=reps, data_path_copy_routine=copy_paths[kind]),
            )
        )

    p_restore, p_backup = measure_protocol()
    d_restore, d_backup = measure_data_path(mem.restore, mem.backup)
    for kind, proto, data in (("restore", p_restore, d_restore), ("backup", p_backup, d_backup)):
        add(kind, "runtime (protocol)", proto)
        add(kind, "runtime data path", data)
    rt.release(extent)
    rt.wait_completions()


def _both_directions(
    args: Any, device: torch.device, clock: Clock, rows: list[Row], rt: Any, page_size: int, run_len: int, pages: int, nbytes: int, rng: random.Random
) -> None:
    """A restore of one extent and a backup of another in one submit, against both pinned copies at once."""

    def prefilled() -> Any:
        request = rt.open_request()
        rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1,) * (pages * page_size)),))))
        extent = rt.publish(request, 0, pages)
        rt.close_request(request)
        return extent

    def fragmented(*tiers: Tier) -> None:
        for tier in tiers:
            fragment_free_list(rt, tier, run_len, pages, rng)

    fragmented(Tier.L1)
    restored = prefilled()
    fragmented(Tier.L1, Tier.L2)
    backed_up = prefilled()
    rt.submit((Backup(restored),))
    rt.wait_completions()
    rt.submit((Demote(restored),))

    def protocol() -> float:
        fragmented(Tier.L1, Tier.L2)
        seconds = clock.wall(lambda: (rt.submit((Restore(restored), Backup(backed_up))), rt.wait_completions()))
        rt.submit((Demote(restored), Drop(backed_up)))
        rt.wait_completions()
        return seconds

    reps = [protocol() for _ in range(args.reps + 1)][1:]
    baseline = _both_pinned(args, device, clock, nbytes)
    seconds = median(reps)
    rows.append(
        Row(
            SECTION,
            f"restore + backup at once ps={page_size} run={run_len} runtime (protocol)",
            "GB/s",
            2 * nbytes / seconds / 1e9,
            2 * nbytes / baseline / 1e9,
            "pinned copy_ H2D and D2H at once",
            "ratio",
            ">=",
            0.90,
            {
                "page_size": page_size,
                "run": run_len,
                "pages": pages,
                "bytes_each_way": nbytes,
                "seconds": seconds,
                "seconds_per_rep": reps,
                "baseline_seconds": baseline,
            },
        )
    )
    for extent in (restored, backed_up):
        rt.release(extent)
    rt.wait_completions()


def _both_pinned(args: Any, device: torch.device, clock: Clock, nbytes: int) -> float:
    """Seconds for a pinned H2D and a pinned D2H of `nbytes` each, issued together on two streams (median)."""
    cuda = device.type == "cuda"
    host_in, host_out = (torch.randint(0, 255, (nbytes,), dtype=torch.uint8) for _ in range(2))
    if cuda:
        host_in, host_out = host_in.pin_memory(), host_out.pin_memory()
    dev_in, dev_out = (torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2))
    streams = (torch.cuda.Stream(device), torch.cuda.Stream(device)) if cuda else (None, None)

    def both() -> None:
        with torch.cuda.stream(streams[0]) if cuda else contextlib.nullcontext():
            dev_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(streams[1]) if cuda else contextlib.nullcontext():
            host_out.copy_(dev_out, non_blocking=True)

    return median([clock.wall(both) for _ in range(args.reps + 1)][1:])
