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
"""

from __future__ import annotations

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
    pool = 2 * pages + 2 * longest
    runner = bench_runner(args, device, read_context=False, max_new_tokens=min(pages * page_size, 4096))
    rt = make_runtime(args, device, runner, page_size=page_size, max_requests=2, max_request_tokens=pages * page_size, l1_pages=pool, l2_pages=pool)
    try:
        base_h2d, base_d2h = _baselines(args, device, clock, nbytes)
        rng = random.Random(args.seed)
        mem = hooks.memory(rt)
        for run_len in args.runs:
            with guard(SECTION, f"page_size={page_size} run={run_len}"):
                _one(args, device, clock, rows, rt, mem, page_size, run_len, pages, nbytes, base_h2d, base_d2h, rng)
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


def _one(args, device, clock, rows, rt, mem, page_size, run_len, pages, nbytes, base_h2d, base_d2h, rng) -> None:
    # An extent over `pages` pages whose device and host pages lie in scattered runs of `run_len`.
    fragment_free_list(rt, Tier.L1, run_len, pages, rng)
    fragment_free_list(rt, Tier.L2, run_len, pages, rng)
    request = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1,) * (pages * page_size)),))))
    extent = rt.publish(request, 0, pages)
    rt.close_request(request)
    rt.submit((Backup(extent),))
    rt.wait_completions()
    rt.submit((Demote(extent),))

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
