"""Diagnostics behind the overlap and write-back numbers (CUDA only): `python -m cacheruntime.bench.diag OUT.json`.

- restore of 768 MiB (384 pages of 2 MiB, one contiguous host run) alone and under a
  concurrent GEMV loop, for DMA piece sizes of 128, 16 and 4 MiB: its GPU time, and the
  GEMV's;
- a small D2H read (`tolist` of 16 values, as `execute_batch` reads outputs) while a 128 MiB
  backup runs, for the same piece sizes: the copy engine's head-of-line wait;
- the GEMV step alone and with a 128 MiB backup per step (the ITL workload's pressure);
- restore/backup of 512 MiB in scattered 1-page runs: DMA path vs the UVA gather kernel.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time

import torch

from cacheruntime.runtime.pools import KVMemory, _uva_kernel


def _mem(pages: int, dma_mib: int, uva: float = 0.0) -> KVMemory:
    return KVMemory(device=torch.device("cuda"), l1_pages=2 * pages + 8, l2_pages=2 * pages + 8, page_size=16, layers=32, heads=8,
                    head_dim=128, dtype=torch.bfloat16, dma_bytes=dma_mib << 20, uva_max_run=uva)


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
        solo = [_timed_on(side, lambda: mem.restore(src, dst)) for _ in range(3)]
        torch.cuda.synchronize()
        under, comp = [], []
        for _ in range(3):
            c = gemv.step()
            time.sleep(0.001)
            under.append(_timed_on(side, lambda: mem.restore(src, dst)))
            comp.append(c)
            torch.cuda.synchronize()
        # copies only (no scatter): the DMA under compute
        buf = mem._stage_in[0]
        rows = buf.shape[0]

        def dma_only():
            for lo in range(0, pages * mem.lanes, rows):
                n = min(rows, pages * mem.lanes - lo)
                for p in range(0, n, mem.dma_rows):
                    k = min(mem.dma_rows, n - p)
                    buf[p : p + k].copy_(mem.l2_rows[lo + p : lo + p + k], non_blocking=True)

        dsolo = [_timed_on(side, dma_only) for _ in range(3)]
        torch.cuda.synchronize()
        dunder = []
        for _ in range(3):
            gemv.step()
            time.sleep(0.001)
            dunder.append(_timed_on(side, dma_only))
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
        for i in range(12):
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
    out["uva_kernel_available"] = _uva_kernel() is not None
    rng = random.Random(0)
    for uva in (0.0, 2.0):
        mem = _mem(256, 16, uva)
        src = rng.sample(range(0, 2 * 256 + 8, 2), 256)
        dst = rng.sample(range(2 * 256 + 8), 256)
        try:
            mem.restore(src, dst)
            mem.backup(dst, src)
            torch.cuda.synchronize()
            r = [_timed_on(side, lambda: mem.restore(src, dst)) for _ in range(3)]
            b = [_timed_on(side, lambda: mem.backup(dst, src)) for _ in range(3)]
            torch.cuda.synchronize()
            out[f"run1_uva{uva}"] = {"path": mem.last_path, "restore_GBps": 512 * 2**20 / statistics.median(ms(e) for e in r) / 1e6,
                                     "backup_GBps": 512 * 2**20 / statistics.median(ms(e) for e in b) / 1e6}
        except Exception as error:  # noqa: BLE001
            out[f"run1_uva{uva}"] = {"error": repr(error)}
        del mem
        torch.cuda.empty_cache()
    json.dump(out, open(path, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
