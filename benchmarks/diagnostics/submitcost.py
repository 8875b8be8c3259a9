"""The host's work in a protocol restore or backup beside the copy: what the transfer
section's protocol rows add to its data-path rows.

At page size 16 with runs of one page, the protocol rows read 0.888-0.890 of the pinned
copy where the data path reads 0.916-0.920 (docs/benchmarks.md, transfer): about 0.3 ms
of a 10.5-ms copy of 256 runs. This builds the same extent (`--pages` pages whose device
and host pages lie in scattered runs of `--run`), then times `submit((Restore(x),))` and
`wait_completions()` apart on the host clock, and the same for a Backup, and prints a
cProfile of one restore (submit + wait) by the runtime's own functions. With
`--tiny-kv` (the default off CUDA) a page holds a few bytes and nothing is computed, so the
copies cost nearly nothing and what is left is the bookkeeping and the streams' hand-offs.
Usage: PYTHONPATH=src python3 -m benchmarks.diagnostics.submitcost [--device cpu] [--pages 256] [--run 1]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time
from statistics import median

import torch

import benchmarks
from benchmarks.harness import NullRunner, bench_runner, close_runtime, fragment_free_list, make_runtime
from benchmarks.transfers import scattered_extent
from cacheruntime.protocol import Backup, Demote, Drop, Restore, Tier


def main() -> None:
    parser = argparse.ArgumentParser()
    benchmarks.add_arguments(parser)
    parser.add_argument("--pages", type=int, default=256)
    parser.add_argument("--run", type=int, default=1)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--tiny-kv", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    benchmarks.resolve(args, device.type == "cuda")
    tiny = device.type != "cuda" if args.tiny_kv is None else args.tiny_kv
    pages, page_size, rng = args.pages, args.page_size, random.Random(args.seed)
    pool = 3 * pages + 2 * args.run
    runner = NullRunner(device) if tiny else bench_runner(args, device, read_context=False, max_new_tokens=min(pages * page_size, 4096))
    rt = make_runtime(
        args, device, runner, tiny_kv=tiny, page_size=page_size, max_requests=2, max_request_tokens=pages * page_size, l1_pages=pool, l2_pages=pool
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        extent = scattered_extent(rt, page_size, args.run, pages, rng)

        def timed(intent: object, before: object, tier: Tier) -> tuple[float, float]:
            rt.submit((before,))
            fragment_free_list(rt, tier, args.run, pages, rng)
            sync()
            t0 = time.perf_counter()
            rt.submit((intent,))
            t1 = time.perf_counter()
            rt.wait_completions()
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1

        restores = [timed(Restore(extent), Demote(extent), Tier.L1) for _ in range(args.reps + 1)][1:]
        backups = [timed(Backup(extent), Drop(extent), Tier.L2) for _ in range(args.reps + 1)][1:]
        print(f"{device}, page size {page_size}, {pages} pages in runs of {args.run}, {'tiny' if tiny else 'bench'} KV shape, median of {args.reps}:")
        for name, samples in (("restore", restores), ("backup", backups)):
            submit, wait = (median(s[i] for s in samples) * 1e3 for i in (0, 1))
            print(f"  {name}: submit returns after {submit:.3f} ms ({submit * 1e3 / pages:.2f} us a page), wait_completions after {wait:.3f} ms more")
        rt.submit((Demote(extent),))
        fragment_free_list(rt, Tier.L1, args.run, pages, rng)
        sync()
        profile = cProfile.Profile()
        profile.enable()
        rt.submit((Restore(extent),))
        rt.wait_completions()
        profile.disable()
        entries = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        print("one restore (submit + wait_completions) under cProfile, the runtime's functions by own time, us:")
        own = sorted(((tottime, cumtime, calls, key) for key, (_, calls, tottime, cumtime, _) in entries.items() if "cacheruntime" in key[0]), reverse=True)
        for tottime, cumtime, calls, (path, line, name) in own[:15]:
            print(f"  {tottime * 1e6:8.0f} own {cumtime * 1e6:8.0f} with callees  {calls:5d} calls  {path.split('cacheruntime/')[-1]}:{line}({name})")
    finally:
        close_runtime(rt)


if __name__ == "__main__":
    main()
