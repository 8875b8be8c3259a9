"""Kernel options of FlexAttention's decoding kernel on the Llama-3-8B KV shape (CUDA only).

`python -m benchmarks.diagnostics.flexdecode OUT.json`. The decode step's attention reads
every K and V of the batch once, so its time against the bytes read says how close the
kernel comes to the read bandwidth. For B = 16 and 64 requests of 8192 tokens (8 K/V heads,
32 query heads, head_dim 128, bf16, 128-token pages scattered over the pool), one layer's
paged attention (the runner's block mask) is timed with FlexAttention's default decoding
options, with options set by hand (`BLOCK_N`, `num_stages`, `num_warps`, `SPLIT_KV`), and
compiled with `max-autotune`: the median of 20 calls between CUDA events, and the GB/s.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention

from cacheruntime.runtime.device.pagedattention import PagedBatch

PAGE, CONTEXT, KV_HEADS, Q_HEADS, HEAD_DIM = 128, 8192, 8, 32, 128
OPTIONS: list[dict] = [
    {},
    {"BLOCK_N": 64, "num_stages": 3, "num_warps": 4},
    {"BLOCK_N": 128, "num_stages": 2, "num_warps": 4},
    {"BLOCK_N": 128, "num_stages": 3, "num_warps": 4},
    {"BLOCK_N": 64, "num_stages": 3, "num_warps": 4, "SPLIT_KV": 4},
    {"BLOCK_N": 64, "num_stages": 3, "num_warps": 4, "SPLIT_KV": 8},
    {"BLOCK_N": 128, "num_stages": 3, "num_warps": 4, "SPLIT_KV": 8},
    {"BLOCK_N": 128, "num_stages": 3, "num_warps": 8, "SPLIT_KV": 8},
]


def main(out: str) -> int:
    device = torch.device("cuda")
    results = []
    for batch in (16, 64):
        row_pages = -(-(CONTEXT + 1) // PAGE)
        pool_pages = batch * row_pages
        gen = torch.Generator(device=device).manual_seed(batch)
        k_pool = torch.randn(pool_pages * PAGE, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
        v_pool = torch.randn_like(k_pool)
        table = (
            (torch.randperm(pool_pages, device=device, generator=gen).view(batch, row_pages)[..., None] * PAGE + torch.arange(PAGE, device=device))
            .view(batch, -1)
            .int()
        )
        slots = torch.arange(batch, device=device)
        paged = PagedBatch.decode(table, slots, torch.full((batch,), CONTEXT, device=device), PAGE, pool_pages)
        q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
        keys = k_pool.transpose(0, 1)[None].expand(batch, -1, -1, -1)
        values = v_pool.transpose(0, 1)[None].expand(batch, -1, -1, -1)
        nbytes = 2 * batch * (CONTEXT + 1) * KV_HEADS * HEAD_DIM * 2
        reference = None
        variants: list[tuple[str, Any, dict]] = [(json.dumps(o), torch.compile(flex_attention, dynamic=False), o) for o in OPTIONS]
        variants.append(("max-autotune", torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs"), {}))
        for name, fn, options in variants:
            torch._dynamo.reset()  # each variant compiles afresh (else Dynamo's recompile limit sends later ones to eager)
            t0 = time.perf_counter()
            try:
                out_t = fn(q, keys, values, block_mask=paged.block_mask, scale=1 / math.sqrt(HEAD_DIM), enable_gqa=True, kernel_options=options or None)
                torch.cuda.synchronize()
            except Exception as error:  # a config the kernel rejects is a result too
                results.append({"batch": batch, "options": name, "error": f"{type(error).__name__}: {str(error)[:200]}"})
                print(batch, name, "error", str(error)[:200], flush=True)
                continue
            compile_s = time.perf_counter() - t0
            reference = out_t if reference is None else reference
            times = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(q, keys, values, block_mask=paged.block_mask, scale=1 / math.sqrt(HEAD_DIM), enable_gqa=True, kernel_options=options or None)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            seconds = statistics.median(times)
            error = (out_t.float() - reference.float()).abs().max().item()
            results.append(
                {"batch": batch, "options": name, "ms": seconds * 1e3, "GBps": nbytes / seconds / 1e9, "compile_s": compile_s, "max_diff_vs_default": error}
            )
            print(f"B={batch} {name}: {seconds * 1e3:.3f} ms, {nbytes / seconds / 1e9:.0f} GB/s, compile {compile_s:.1f} s, diff {error:.3g}", flush=True)
        del k_pool, v_pool
        torch.cuda.empty_cache()
    Path(out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
