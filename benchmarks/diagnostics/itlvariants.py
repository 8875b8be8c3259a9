"""The ITL workload under each D2H issue point and throttle, side by side in one run (diagnostics).

`python -m benchmarks.diagnostics.itlvariants OUT.json`: the bench's itl measurement (same
workload, same defaults as `cacheruntime bench --only itl`) for every `d2h_issue` of
`LocalGPURuntime` with the default 32 MiB throttle, and for "after_compute" with 8 MiB
pieces; then each issue point again with the UVA copy kernel off (every copy on the copy
engines: the kernel runs on SMs, beside compute). Per variant: the ITL ratio (mean and p50) and the compute GPU time quiet/busy,
which is what tells whether a placement slows compute or only the host.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from benchmarks import add_arguments, hooks, resolve
from benchmarks.itl import _measure


def main(path: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = resolve(parser.parse_args([]), torch.cuda.is_available())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    variants = [(issue, 32 << 20, True) for issue in hooks.D2H_ISSUE_POINTS] + [("after_compute", 8 << 20, True)]
    variants += [(issue, 32 << 20, False) for issue in hooks.D2H_ISSUE_POINTS]
    out = {}
    for issue, budget, uva in variants:
        memory: list[Any] = []

        def setup(runtime: Any, memory: list[Any] = memory, uva: bool = uva) -> None:
            memory.append(hooks.memory(runtime))
            if not uva:
                memory[-1].uva_max_run = 0.0  # every copy on the copy engines

        quiet, busy, detail = _measure(args, device, {"d2h_issue": issue, "d2h_bytes_per_batch": budget}, setup)
        name = f"{issue}/{budget >> 20}MiB/{'uva' if uva else 'dma'}"
        out[name] = {
            "last_copy_path": memory[0].last_path,
            "ratio": busy / quiet,
            "p50_ratio": detail["busy_p50_ms"] / detail["quiet_p50_ms"],
            "quiet_ms": quiet * 1e3,
            "busy_ms": busy * 1e3,
            "compute_gpu_ms": [detail.get("quiet_compute_gpu_ms"), detail.get("busy_compute_gpu_ms")],
            "busy_max_ms": detail["busy_max_ms"],
            "per_call_ms": [detail["quiet_per_call_ms"], detail["busy_per_call_ms"]],
            "writeback_GBps": detail["writeback_bytes_per_s"] / 1e9,
        }
        print(name, json.dumps(out[name]), flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
