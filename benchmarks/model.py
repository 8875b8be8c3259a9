"""The `model` section: the Llama runner's decode step and prefill against the device's limits.

Both limits are measured in the same run, beside the rows that use them:

- **read bandwidth**: a float32 sum over a large device buffer (`model_bw_gib` GiB), the
  best of `reps` timings;
- **bf16 matmul throughput**: an `n x n x n` product (8192 on CUDA), the best of `reps`.

Decode: B requests with `context` tokens each compute one token through the runner's
`forward` (paged attention over the pool, K and V written through the table), timed on
the host from an idle device to an idle device (median of `model_steps`, after two
warm-up steps that compile the attention kernel and capture the step's CUDA graph). The
row is the graph's step; the same step run eagerly (no graph) is timed beside it, and the
graph's capture and warm-up seconds are printed and kept in the row's detail. Its HBM bound is (the weights a step
reads whole + the batch's KV) / the measured bandwidth; target ratio <= 1.5 at B >= 16 and
an 8k context. Prefill: one request of n tokens; its FLOP count is 2 x the layers'
projection parameters x n, plus the output projection of the last token, plus causal
attention 2 x layers x query heads x head_dim x n^2 (QK^T and PV over half the square);
target >= 0.6 of the matmul throughput at 8k tokens. A size whose weights, KV and a
margin do not fit in free device memory is skipped and printed.

The runner's step is timed directly on a KV memory and a ReqToToken table the section
fills (one contiguous run of pages per request), without protocol calls: the section
measures the model, the other sections the boundary.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks import hooks
from benchmarks.harness import free_memory, median
from benchmarks.report import Row

SECTION = "model"
#: device memory left free beyond weights and KV (activations, the attention kernel's workspace)
MARGIN_BYTES = 8 << 30


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    config = hooks.LLAMA_CONFIGS[args.model_config]
    cuda = device.type == "cuda"
    page_size = args.model_page_size
    max_tokens = max(max(args.model_contexts) + 1, max(args.model_prefill))
    runner = hooks.LlamaRunner(config, max_tokens + page_size, device, args.seed)
    kv_token_bytes = config.layers * 2 * config.heads * config.head_dim * torch.empty((), dtype=config.torch_dtype).element_size()
    per_token, unembed = runner.matmul_parameters
    print(f"model {args.model_config}: {runner.step_weight_bytes / 1e9:.2f} GB of weights read per step, {kv_token_bytes} B of KV per token", flush=True)

    bandwidth = _read_bandwidth(device, args.model_bw_gib << 30, args.reps)
    flops_per_s = _matmul_throughput(device, config.torch_dtype, args.model_matmul, args.reps)
    print(f"read bandwidth {bandwidth / 1e9:.0f} GB/s, {config.dtype} matmul {flops_per_s / 1e12:.1f} TFLOP/s", flush=True)

    def fits(tokens: int) -> bool:
        if not cuda:
            return True
        free, _ = torch.cuda.mem_get_info(device)
        return tokens * kv_token_bytes + MARGIN_BYTES <= free

    for batch in args.model_batches:
        for context in args.model_contexts:
            if not fits(batch * (context + page_size)):
                print(f"decode B={batch} context={context}: weights + KV do not fit, skipped", flush=True)
                continue
            with guard(SECTION, f"decode B={batch} context={context}"):
                seconds = _time_step(runner, config, device, page_size, [context] * batch, [context + 1] * batch, args.model_steps)
                graphs = runner.graphs
                if graphs is not None:
                    capture = {"warmup_s": sum(graphs.warmup_seconds.values()), "capture_s": sum(graphs.capture_seconds.values())}
                    with runner.without_graphs():
                        eager = _time_step(runner, config, device, page_size, [context] * batch, [context + 1] * batch, args.model_steps)
                    print(
                        f"  decode B={batch} context={context}: graph {seconds * 1e3:.2f} ms, eager {eager * 1e3:.2f} ms;"
                        f" graph capture {capture['capture_s']:.3f} s after {capture['warmup_s']:.1f} s of warm-up (compiling the attention kernel)",
                        flush=True,
                    )
                else:  # no CUDA graphs on this device: the row is the eager step
                    capture, eager = {}, seconds
                kv_bytes = batch * (context + 1) * kv_token_bytes
                bound = (runner.step_weight_bytes + kv_bytes) / bandwidth
                targeted = batch >= 16 and context == 8192
                rows.append(
                    Row(
                        SECTION,
                        f"decode step B={batch} context={context}",
                        "ms",
                        seconds * 1e3,
                        bound * 1e3,
                        "HBM bound: (weights + KV) / read bandwidth",
                        *(("ratio", "<=", 1.5) if targeted else (None, None, None)),
                        detail={
                            "weight_bytes": runner.step_weight_bytes,
                            "kv_bytes": kv_bytes,
                            "read_bandwidth": bandwidth,
                            "cuda_graph": graphs is not None,
                            "eager_ms": eager * 1e3,
                            **capture,
                        },
                    )
                )
            free_memory()

    for tokens in args.model_prefill:
        if not fits(tokens + page_size):
            print(f"prefill {tokens}: does not fit, skipped", flush=True)
            continue
        with guard(SECTION, f"prefill {tokens}"):
            seconds = _time_step(runner, config, device, page_size, [0], [tokens], args.model_steps)
            attention = 2 * config.layers * runner.query_heads * config.head_dim * tokens * tokens
            flops = 2 * per_token * tokens + 2 * unembed + attention
            rows.append(
                Row(
                    SECTION,
                    f"prefill {tokens} tokens",
                    "TFLOP/s",
                    flops / seconds / 1e12,
                    flops_per_s / 1e12,
                    f"{config.dtype} matmul throughput",
                    *(("ratio", ">=", 0.6) if tokens == 8192 else (None, None, None)),
                    detail={"seconds": seconds, "flops": flops, "attention_flops": attention, "matmul_parameters": per_token},
                )
            )
        free_memory()


def _time_step(runner: Any, config: Any, device: torch.device, page_size: int, starts: list[int], ends: list[int], steps: int) -> float:
    """Median seconds of `runner.forward` on items `starts .. ends` (one request each), KV pages laid out per request."""
    batch = len(starts)
    row_pages = -(-max(ends) // page_size)
    memory = hooks.KVMemory(
        device=device,
        l1_pages=batch * row_pages,
        l2_pages=0,
        page_size=page_size,
        layers=config.layers,
        heads=config.heads,
        head_dim=config.head_dim,
        dtype=config.torch_dtype,
    )
    table = hooks.ReqToToken(batch, row_pages * page_size, page_size, device)
    phys = torch.arange(batch * row_pages, device=device).view(batch, row_pages)
    table.pages.copy_((phys[..., None] * page_size + table.offsets).to(torch.int32))
    plan_items = [SimpleNamespace(input_ids=(1,) * (end - start), append_previous_output=False) for start, end in zip(starts, ends)]
    items = hooks.ComputeBatch(list(range(batch)), list(starts), list(ends), [0] * batch, plan_items, [None] * batch)
    cuda = device.type == "cuda"

    def step() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        runner.forward(memory, table.table, items).tolist()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    for _ in range(2):
        step()
    graphs = _compiled_graphs()
    seconds = median([step() for _ in range(steps)])
    if _compiled_graphs() != graphs:
        print(f"  recompiled during the timed steps ({_compiled_graphs() - graphs} graphs): the time includes compilation", flush=True)
    return seconds


def _compiled_graphs() -> int:
    """Graphs compiled so far in this process (a timed step must add none)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _read_bandwidth(device: torch.device, nbytes: int, reps: int) -> float:
    """Bytes per second of a float32 sum over `nbytes` of device memory (best of `reps`)."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = []
    for _ in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        buffer.sum().item()
        times.append(time.perf_counter() - t0)
    del buffer
    free_memory()
    return nbytes / min(times[1:])


def _matmul_throughput(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    """FLOP per second of an `n x n x n` matmul in `dtype` (best of `reps`, ten products each)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = []
    for _ in range(reps + 1):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        _sync(device)
        times.append((time.perf_counter() - t0) / 10)
    return 2 * math.pow(n, 3) / min(times[1:])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
