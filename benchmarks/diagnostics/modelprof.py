"""Where the Llama runner's step time goes (CUDA only): `python -m benchmarks.diagnostics.modelprof OUT_DIR`.

The `model` section's rows say how far a step is from its bound; this says which kernels
take the time, for the prefill of 8192 tokens and for a decode step of B = 16 requests of
8192 tokens run eagerly (the graph replays the same layer kernels; its mask is built
from device tensors instead): `torch.profiler`'s table of the device time per kernel over
one `_time_step` call (two warm-up steps and one timed step), after a call that compiles. Writes
`modelprof.txt` under OUT_DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import hooks
from benchmarks.model import _time_step

PAGE = 128


def main(out_dir: str) -> int:
    device = torch.device("cuda")
    config = hooks.LLAMA_CONFIGS["llama3-8b"]
    runner = hooks.LlamaRunner(config, 8192 + 2 * PAGE, device, 0)
    cases = {"prefill 8192": ([0], [8192]), "decode B=16 context=8192 (eager)": ([8192] * 16, [8193] * 16)}
    report = []
    with runner.without_graphs():
        for name, (starts, ends) in cases.items():
            _time_step(runner, config, device, PAGE, starts, ends, 1)  # compiles
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                seconds = _time_step(runner, config, device, PAGE, starts, ends, 1)
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
            report.append(f"== {name}: {seconds * 1e3:.1f} ms per step (3 steps profiled: 2 warm-up, 1 timed)\n{table}")
            print(report[-1], flush=True)
    Path(out_dir, "modelprof.txt").write_text("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
