"""Diagnostics behind the overlap and write-back numbers (CUDA only): `python -m benchmarks.diagnostics.diag OUT.json`.

- restore of 768 MiB (384 pages of 2 MiB, one contiguous host run) alone and under a
  concurrent GEMV loop, for DMA piece sizes of 128, 16 and 4 MiB: its GPU time, and the
  GEMV's;
- a small D2H read (`tolist` of 16 values, as `execute_batch` reads outputs) while a 128 MiB
  backup runs, for the same piece sizes: the copy engine's head-of-line wait;
- the GEMV step alone and with a 128 MiB backup per step (the ITL workload's pressure);
- restore/backup of 512 MiB in scattered 1-page runs: DMA path vs the UVA gather kernel,
  and (`run1_patterns`) both paths on several page lists, interleaved; (`run1_split`) the
  kernel and the DMA path sharing one transfer, from an idle GPU and behind compute;
- (`chunk_sizes`) the DMA path's staging chunk size against the pinned copy baseline.
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import sys
import time

import torch

from benchmarks.harness import scattered_runs
from benchmarks.hooks import KVMemory


def _mem(pages: int, dma_mib: int, uva: float = 0.0, pool: int | None = None) -> KVMemory:
    pool = pool or 2 * pages + 8
    return KVMemory(
        device=torch.device("cuda"),
        l1_pages=pool,
        l2_pages=pool,
        page_size=16,
        layers=32,
        heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        dma_bytes=dma_mib << 20,
        uva_max_run=uva,
    )


def _run1_patterns(side: torch.cuda.Stream, pages: int = 256, rounds: int = 3) -> dict:
    """512 MiB in 1-page runs through each path, for several page lists, interleaved in rounds.

    On the pools of the transfer section at page size 16 (640 pages each): the transfer
    section's own lists (`scattered_runs`: every other page, in random order), the same
    pages in ascending order, random every-other host pages with random device pages, and
    the bench's host pages with one contiguous run of device pages. Interleaving the
    lists round by round separates the page list from drift of the machine.
    """
    pool = 2 * pages + 2 * 64
    rng = random.Random(1)
    bench_src = scattered_runs(list(range(pool)), 1, pages, rng)[:pages]
    bench_dst = scattered_runs(list(range(pool)), 1, pages, rng)[:pages]
    lists = {
        "bench": (bench_src, bench_dst),
        "bench_sorted": (sorted(bench_src), sorted(bench_dst)),
        "random": (rng.sample(range(0, pool, 2), pages), rng.sample(range(pool), pages)),
        "bench_host_contiguous_device": (bench_src, list(range(pages))),
    }
    times: dict[str, list[float]] = {}
    paths: dict[str, str] = {}
    for uva in (0.0, 2.0):
        mem = _mem(pages, 128, uva, pool=pool)
        for src, dst in lists.values():  # warm-up (the kernel's first launch compiles it)
            mem.restore(src, dst)
            mem.backup(dst, src)
        torch.cuda.synchronize()
        for _ in range(rounds):
            for name, (src, dst) in lists.items():
                key = f"{'uva' if uva else 'dma'} {name}"
                r = [_timed_on(side, functools.partial(mem.restore, src, dst)) for _ in range(3)]
                paths[f"{key} restore"] = mem.last_path
                b = [_timed_on(side, functools.partial(mem.backup, dst, src)) for _ in range(3)]
                paths[f"{key} backup"] = mem.last_path
                torch.cuda.synchronize()
                times.setdefault(f"{key} restore", []).extend(ms(e) for e in r)
                times.setdefault(f"{key} backup", []).extend(ms(e) for e in b)
        del mem
        torch.cuda.empty_cache()
    nbytes = pages * 2 * 2**20
    return {
        key: {
            "path": paths[key],
            "median_GBps": round(nbytes / statistics.median(v) / 1e6, 2),
            "min_GBps": round(nbytes / max(v) / 1e6, 2),
            "max_GBps": round(nbytes / min(v) / 1e6, 2),
        }
        for key, v in times.items()
    }


def _uva_available() -> bool:
    """Whether KVMemory's UVA gather kernel runs here: a 1-page restore that may use it does."""
    mem = _mem(1, 16, 2.0, pool=4)
    mem.restore([0], [0])
    return mem.last_path == "uva"


class Gemv:
    def __init__(self, width_mult: int = 40):
        self.w = [torch.randn(4096, 4096 * width_mult, device="cuda", dtype=torch.bfloat16) for _ in range(32)]
        self.x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.Stream()

    def step(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            a.record()
            x = self.x
            for w in self.w:
                x = torch.tanh((x @ w)[:, :4096])
            b.record()
        return a, b


def _timed_on(stream: torch.cuda.Stream, fn) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        a.record()
        fn()
        b.record()
    return a, b


def ms(ev) -> float:
    return ev[0].elapsed_time(ev[1])


def _synced_ms(ev) -> float:
    ev[1].synchronize()
    return ms(ev)


def _run1_split(gemv: Gemv, pages: int = 256, reps: int = 5) -> dict:
    """The transfer section's 1-page lists (page size 16, 512 MiB) moved by the UVA kernel and
    the DMA path at once, each on its own stream, the first `share` of the pages by the
    kernel: do the SM loads and the copy engines together fill the link better than either
    alone? Each share is timed from an idle GPU ("idle": SM clocks as the transfer section
    finds them) and right behind a GEMV step on the same stream ("busy": clocks raised).
    """
    pool = 2 * pages + 2 * 64
    rng = random.Random(1)
    src = scattered_runs(list(range(pool)), 1, pages, rng)[:pages]
    dst = scattered_runs(list(range(pool)), 1, pages, rng)[:pages]
    uva_mem, dma_mem = _mem(pages, 128, 2.0, pool=pool), _mem(pages, 128, 0.0, pool=pool)
    dma_mem.l2.copy_(uva_mem.l2)  # not needed for timing; keeps the two pools alike
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    nbytes = pages * 2 * 2**20
    out: dict = {}

    def once(share: float, warm: bool, kind: str) -> float:
        k = round(share * pages)
        torch.cuda.synchronize()
        start, end_a, end_b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        with torch.cuda.stream(a):
            if warm:
                x = gemv.x
                for w in gemv.w[:8]:
                    x = torch.tanh((x @ w)[:, :4096])
            start.record()
            if k:
                (uva_mem.restore if kind == "restore" else uva_mem.backup)(*((src[:k], dst[:k]) if kind == "restore" else (dst[:k], src[:k])))
            end_a.record()
        if k < pages:
            b.wait_event(start)
            with torch.cuda.stream(b):
                (dma_mem.restore if kind == "restore" else dma_mem.backup)(*((src[k:], dst[k:]) if kind == "restore" else (dst[k:], src[k:])))
                end_b.record()
        torch.cuda.synchronize()
        return max(start.elapsed_time(end_a), start.elapsed_time(end_b) if k < pages else 0.0)

    for kind in ("restore", "backup"):
        for share in (1.0, 0.0, 0.75, 0.5, 0.25):
            once(share, True, kind)  # warm-up (compiles the kernel)
            for warm in (False, True):
                t = [once(share, warm, kind) for _ in range(reps)]
                out[f"{kind} uva_share={share} {'busy' if warm else 'idle'}"] = round(nbytes / statistics.median(t) / 1e6, 2)
    return out


def _chunk_sizes(side: torch.cuda.Stream, pages: int = 256) -> dict:
    """The DMA path's staging chunk (128, 64, 32 MiB) for 512 MiB in runs of 1, 8 and 64 pages
    (the transfer section's lists at page size 16), from an idle GPU: a chunk's scatter
    (gather) runs on SMs, and the last (first) one is not hidden behind a copy."""
    pool = 2 * pages + 2 * 64
    nbytes = pages * 2 * 2**20
    out: dict = _pinned_copies(side, nbytes)
    for chunk_mib in (128, 64, 32):
        mem = KVMemory(
            device=torch.device("cuda"),
            l1_pages=pool,
            l2_pages=pool,
            page_size=16,
            layers=32,
            heads=8,
            head_dim=128,
            dtype=torch.bfloat16,
            chunk_bytes=chunk_mib << 20,
            uva_max_run=0.0,
        )
        for run in (1, 8, 64):
            rng = random.Random(run)
            src = scattered_runs(list(range(pool)), run, pages, rng)[:pages]
            dst = scattered_runs(list(range(pool)), run, pages, rng)[:pages]
            mem.restore(src, dst)
            mem.backup(dst, src)
            times: dict[str, list[float]] = {"restore": [], "backup": []}
            for _ in range(5):
                for kind, pair in (("restore", (src, dst)), ("backup", (dst, src))):
                    torch.cuda.synchronize()
                    time.sleep(0.002)  # let the GPU idle, as between the transfer section's repetitions
                    # the partial is not kept: `del mem` below must free the pools
                    times[kind].append(_synced_ms(_timed_on(side, functools.partial(mem.restore if kind == "restore" else mem.backup, *pair))))
            for kind, t in times.items():
                out[f"{kind} run={run} chunk={chunk_mib}MiB"] = round(nbytes / statistics.median(t) / 1e6, 2)
        del mem
        torch.cuda.empty_cache()
    return out


def _pinned_copies(side: torch.cuda.Stream, nbytes: int) -> dict:
    """The pinned copy baseline: `nbytes` in one contiguous buffer, each way, from an idle GPU.
    A function of its own so that its two buffers are freed before the caller allocates pools."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out: dict = {}
    for kind, call in (("h2d", lambda: dev.copy_(host, non_blocking=True)), ("d2h", lambda: host.copy_(dev, non_blocking=True))):
        call()
        t = []
        for _ in range(5):
            torch.cuda.synchronize()
            time.sleep(0.002)
            t.append(_synced_ms(_timed_on(side, call)))
        out[f"pinned copy_ {kind}"] = round(nbytes / statistics.median(t) / 1e6, 2)
    return out


def _dma_only(mem: KVMemory, buf: torch.Tensor, rows: int, pages: int) -> None:
    """Copies only (no scatter): `pages` pages of the host pool into `buf`, `rows` rows at a time, in DMA pieces."""
    for lo in range(0, pages * mem.lanes, rows):
        n = min(rows, pages * mem.lanes - lo)
        for p in range(0, n, mem.dma_rows):
            k = min(mem.dma_rows, n - p)
            buf[p : p + k].copy_(mem.l2_rows[lo + p : lo + p + k], non_blocking=True)


def main(path: str) -> None:
    out: dict = {}
    gemv = Gemv()
    for _ in range(3):
        gemv.step()
    torch.cuda.synchronize()
    alone = [gemv.step() for _ in range(5)]
    torch.cuda.synchronize()
    out["gemv_alone_ms"] = statistics.median(ms(e) for e in alone)
    side = torch.cuda.Stream()
    pages = 384
    for dma in (128, 16, 4):
        mem = _mem(pages, dma)
        src, dst = list(range(pages)), list(range(pages, 2 * pages))
        mem.restore(src, dst)
        torch.cuda.synchronize()
        solo = [_timed_on(side, functools.partial(mem.restore, src, dst)) for _ in range(3)]
        torch.cuda.synchronize()
        under, comp = [], []
        for _ in range(3):
            c = gemv.step()
            time.sleep(0.001)
            under.append(_timed_on(side, functools.partial(mem.restore, src, dst)))
            comp.append(c)
            torch.cuda.synchronize()
        # copies only (no scatter): the DMA under compute, into a buffer of one staging chunk's rows
        rows = min(mem.chunk_pages, mem.l2.shape[0]) * mem.lanes
        buf = torch.empty(rows, mem.l1_rows.shape[1], dtype=mem.l1_rows.dtype, device="cuda")
        dsolo = [_timed_on(side, functools.partial(_dma_only, mem, buf, rows, pages)) for _ in range(3)]
        torch.cuda.synchronize()
        dunder = []
        for _ in range(3):
            gemv.step()
            time.sleep(0.001)
            dunder.append(_timed_on(side, functools.partial(_dma_only, mem, buf, rows, pages)))
            torch.cuda.synchronize()
        # small D2H read behind a 128 MiB backup
        bsrc = list(range(64))
        small = torch.arange(16, device="cuda")
        waits = []
        for _ in range(5):
            torch.cuda.synchronize()
            with torch.cuda.stream(side):
                mem.backup(bsrc, list(range(64)))
            time.sleep(0.0002)
            t0 = time.perf_counter()
            small.tolist()
            waits.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        out[f"dma{dma}"] = {
            "restore_alone_ms": statistics.median(ms(e) for e in solo),
            "restore_under_gemv_ms": statistics.median(ms(e) for e in under),
            "gemv_with_restore_ms": statistics.median(ms(e) for e in comp),
            "dma_only_alone_ms": statistics.median(ms(e) for e in dsolo),
            "dma_only_under_gemv_ms": statistics.median(ms(e) for e in dunder),
            "small_d2h_read_behind_backup_ms": statistics.median(waits),
        }
        del mem
        torch.cuda.empty_cache()
    # GEMV with a 128 MiB backup per step, unthrottled vs 32 MiB per step
    mem = _mem(128, 16)
    for budget in (64, 16):
        evs = []
        for _ in range(12):
            c = gemv.step()
            with torch.cuda.stream(side):
                side.wait_event(c[0])
                mem.backup(list(range(budget)), list(range(budget)))
            evs.append(c)
            evs[-1][1].synchronize()
        torch.cuda.synchronize()
        out[f"gemv_with_backup_{budget * 2}MiB_per_step_ms"] = statistics.median(ms(e) for e in evs[2:])
    del mem
    torch.cuda.empty_cache()
    # scattered 1-page runs: DMA vs UVA
    out["uva_kernel_available"] = _uva_available()
    rng = random.Random(0)
    for uva in (0.0, 2.0):
        mem = _mem(256, 16, uva)
        src = rng.sample(range(0, 2 * 256 + 8, 2), 256)
        dst = rng.sample(range(2 * 256 + 8), 256)
        try:
            mem.restore(src, dst)
            mem.backup(dst, src)
            torch.cuda.synchronize()
            r = [_timed_on(side, functools.partial(mem.restore, src, dst)) for _ in range(3)]
            b = [_timed_on(side, functools.partial(mem.backup, dst, src)) for _ in range(3)]
            torch.cuda.synchronize()
            out[f"run1_uva{uva}"] = {
                "path": mem.last_path,
                "restore_GBps": 512 * 2**20 / statistics.median(ms(e) for e in r) / 1e6,
                "backup_GBps": 512 * 2**20 / statistics.median(ms(e) for e in b) / 1e6,
            }
        except Exception as error:
            out[f"run1_uva{uva}"] = {"error": repr(error)}
        del mem
        torch.cuda.empty_cache()
    out["run1_patterns"] = _run1_patterns(side)
    out["run1_split"] = _run1_split(gemv)
    out["chunk_sizes"] = _chunk_sizes(side)
    json.dump(out, open(path, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
