"""Host time of a short prefill on a long context (the e2e section's cache hit), by function.

A cache hit computes a few new tokens over a long restored prefix: its device work is
small, so the host's launch cost can decide its TTFT. This times `LlamaRunner.forward`
of one `--new`-token item at the end of a `--context`-token row, synchronised and not,
and prints a cProfile of the host (tottime) for one step.
Usage: PYTHONPATH=src python3 -m benchmarks.diagnostics.prefillhost [--new 128] [--context 8192]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from types import SimpleNamespace

import torch

from benchmarks import hooks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--config", default="llama3-8b")
    args = parser.parse_args()
    device = torch.device("cuda")
    config = hooks.LLAMA_CONFIGS[args.config]
    page = 128
    end = args.context + args.new
    pages = -(-end // page)
    runner = hooks.LlamaRunner(config, pages * page, device, 0)
    memory = hooks.KVMemory(
        device=device, l1_pages=pages, l2_pages=0, page_size=page, layers=config.layers, heads=config.heads, head_dim=config.head_dim, dtype=config.torch_dtype
    )
    table = hooks.ReqToToken(1, pages * page, page, device)
    table.pages.copy_((torch.arange(pages, device=device)[None, :, None] * page + table.offsets).to(torch.int32))
    plan = [SimpleNamespace(input_ids=(1,) * args.new, append_previous_output=False)]
    items = hooks.ComputeBatch([0], [args.context], [end], [0], plan, [None])

    def step(sync: bool) -> tuple[float, float]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = runner.forward(memory, table.table, items)
        launched = time.perf_counter() - t0
        out.tolist()
        return launched, time.perf_counter() - t0

    for _ in range(3):
        step(True)
    samples = [step(True) for _ in range(5)]
    print("launch ms, total ms:", [(round(a * 1e3, 2), round(b * 1e3, 2)) for a, b in samples])
    profile = cProfile.Profile()
    profile.enable()
    step(True)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
