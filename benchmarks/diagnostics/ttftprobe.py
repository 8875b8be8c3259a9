"""Where the e2e section's idle TTFT probe spends its time: host stamps around each part of a hit.

The probe (`benchmarks/e2e.py`) times `prepare_batch` + `execute_batch` of one request whose
8k-token prefix is restored from L2 in its plan, attached from L1, or computed whole. An L2
hit can overlap the restore (on the H2D stream) with the host's launching of the prefill,
since compute waits for KV_READY on the device, not on the host; whether it does is what
these stamps show: for each probe call, when `prepare_batch` returned, when the runner's
`forward` was entered and returned (the launching), and when `execute_batch` returned (the
result on the host), each in ms from the call's start, medians over the probe's reps; and on
CUDA the forward's span on the device, between events recorded on the compute stream when
`forward` was entered (after the stream's wait for KV_READY) and when it returned.
Usage: PYTHONPATH=src python3 -m benchmarks.diagnostics.ttftprobe [--quick] [any bench option]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict
from statistics import median
from typing import Any

import torch

import benchmarks
from benchmarks import e2e, hooks


def _stamped(stamps: list[tuple[str, float]], name: str, call: Any) -> Any:
    @functools.wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stamps.append((f"{name} in", time.perf_counter()))
        try:
            return call(*args, **kwargs)
        finally:
            stamps.append((f"{name} out", time.perf_counter()))

    return wrapper


def _timed_on_device(spans: list[tuple[Any, Any]], call: Any) -> Any:
    @functools.wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            return call(*args, **kwargs)
        finally:
            end.record()
            spans.append((start, end))

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    benchmarks.add_arguments(parser)
    args = parser.parse_args()
    device = torch.device(args.device or "cuda")
    benchmarks.resolve(args, device.type == "cuda")
    config = hooks.LLAMA_CONFIGS[args.model_config]
    page = args.model_page_size
    longest = max(args.e2e_system) + args.e2e_turns * (args.e2e_user[1] + args.e2e_new_tokens)
    row_tokens = -(-(longest + 1) // page) * page
    _, _, kv_tokens = e2e.workload(args, config.vocab)
    kv_pages = -(-kv_tokens // page) + len(args.e2e_system) + args.e2e_conversations * args.e2e_turns
    l1_pages, l2_pages = max(kv_pages // 4, 2 * row_tokens // page), kv_pages + kv_pages // 10
    runner = hooks.LlamaRunner(config, row_tokens + page, device, args.seed)
    rt = hooks.new_runtime(
        config,
        device,
        seed=args.seed,
        runner=runner,
        l2_pages=l2_pages,
        page_size=page,
        max_requests=args.e2e_max_requests,
        max_request_tokens=row_tokens,
        l1_pages=l1_pages,
    )
    hooks.warm_up(rt, args.e2e_max_requests, prefill=min(longest, 2 * page))
    print(f"L1 {l1_pages} pages, L2 {l2_pages} pages, rows of {row_tokens} tokens, {args.e2e_max_requests} requests at most", flush=True)
    stamps: list[tuple[str, float]] = []
    rt.prepare_batch = _stamped(stamps, "prepare", rt.prepare_batch)
    rt.execute_batch = _stamped(stamps, "execute", rt.execute_batch)
    spans: list[tuple[Any, Any]] = []
    runner.forward = _stamped(stamps, "forward", _timed_on_device(spans, runner.forward) if device.type == "cuda" else runner.forward)
    e2e._probe(args, rt, config.vocab, [])
    if device.type == "cuda":
        torch.cuda.synchronize()
    calls = [stamps[i : i + 6] for i in range(0, len(stamps), 6)]
    # the probe's setup prefill first, then per rep: L2 hit, L1 hit, recompute
    kinds = ("l2 hit", "l1 hit", "recompute")
    parts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for index, call in enumerate(calls[1 + len(kinds) :]):  # the first rep warms up and is dropped
        start = call[0][1]
        for name, at in call[1:]:
            parts[kinds[index % len(kinds)]][name].append((at - start) * 1e3)
        if spans:
            begin, end = spans[1 + len(kinds) + index]
            parts[kinds[index % len(kinds)]]["device span of forward"].append(begin.elapsed_time(end))
    for kind in kinds:
        print(f"{kind}: " + ", ".join(f"{name} {median(values):.1f}" for name, values in parts[kind].items()) + " ms from the call's start")


if __name__ == "__main__":
    main()
