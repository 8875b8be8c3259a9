"""CPU cost per decode step of two source trees, measured in alternating processes in one run.

    python scripts/cpu_ab.py --base /tmp/base --new . [--reps 5] [--device cpu|cuda] [--json out.json]

`--base` and `--new` are checkouts (e.g. the base commit through `git worktree add`).
Each repetition runs one process per tree, alternately, so that a drift of the host's
speed weighs on both alike; every process runs on the same two cores (its streams' worker
threads hand work over between them) with one torch thread, and reports the median of
`BLOCKS` timed blocks; each process imports `cacheruntime` from its tree's `src`
and times `prepare_batch` + `execute_batch` + `poll_completions` of a reused decode plan
of B items on rows already holding `CONTEXT` tokens, on `--device`, with a null model (one
tiny tensor per step), so the time is the boundary's host-side bookkeeping. Printed: per B, the
median microseconds per step of each tree over the repetitions and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BATCHES = (1, 64, 256)
CONTEXT = 512
PAGE_SIZE = 16
WARMUP = 64
STEPS = 128
BLOCKS = 5

#: Run inside each process, with that tree's `src` first on the path.
MEASURE = r"""
import gc, json, os, statistics, sys, time
os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))  # the same two cores for every process
import torch
torch.set_num_threads(1)
from cacheruntime.protocol import BatchItem, BatchPlan
from cacheruntime.runtime.local import LocalGPURuntime

class NullRunner:
    tagged = False
    def forward(self, memory, table, items):
        return torch.zeros(len(items), dtype=torch.long, device=table.device)
    def finish(self, outputs, items):
        return outputs

BATCHES, CONTEXT, PS, WARMUP, STEPS, BLOCKS, DEVICE = json.loads(sys.argv[1])
out = {}
for batch in BATCHES:
    tokens = CONTEXT + WARMUP + STEPS * BLOCKS
    pages = batch * (-(-tokens // PS) + 1)
    options = dict(device=DEVICE, page_size=PS, max_requests=batch, max_request_tokens=tokens + PS,
                   l1_pages=pages, l2_pages=1, d2h_bytes_per_batch=None)
    try:
        rt = LocalGPURuntime(runner=NullRunner(), **options)  # a Runner object: the restructured tree
    except (TypeError, ValueError, AttributeError):
        rt = LocalGPURuntime(runner="tiny", **options)  # the base tree takes only a runner's name
        rt._runner = NullRunner()
    handles = [rt.open_request() for _ in range(batch)]
    rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(h, tuple(range(CONTEXT))) for h in handles))))
    plan = BatchPlan(tuple(BatchItem(h, (1,)) for h in handles))
    for _ in range(WARMUP):
        rt.execute_batch(rt.prepare_batch(plan)); rt.poll_completions()
    gc.collect(); gc.freeze()
    blocks = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(STEPS):
            rt.execute_batch(rt.prepare_batch(plan)); rt.poll_completions()
        blocks.append((time.perf_counter() - start) / STEPS * 1e6)
    out[batch] = statistics.median(blocks)
    rt.close()
print(json.dumps(out))
"""


def measure(tree: Path, device: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    args = json.dumps([BATCHES, CONTEXT, PAGE_SIZE, WARMUP, STEPS, BLOCKS, device])
    run = subprocess.run([sys.executable, "-c", MEASURE, args], env=env, capture_output=True, text=True, check=False)
    if run.returncode:
        raise SystemExit(f"measuring {tree} failed: {run.stderr.strip().splitlines()[-1]}")
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the base tree")
    parser.add_argument("--new", type=Path, default=Path("."), help="checkout of the new tree (default: here)")
    parser.add_argument("--reps", type=int, default=5, help="alternating process pairs (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--json", type=Path, help="write the samples and medians here")
    args = parser.parse_args()
    for tree in (args.base, args.new):
        if not (tree / "src" / "cacheruntime").is_dir():
            raise SystemExit(f"{tree} is not a cacheruntime checkout (no src/cacheruntime)")
    samples: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    for rep in range(args.reps):
        for name in ("base", "new") if rep % 2 == 0 else ("new", "base"):
            samples[name].append(measure(getattr(args, name), args.device))
    print(f"CPU per decode step (us) on {args.device}, median of {args.reps} alternating processes, context {CONTEXT}, page size {PAGE_SIZE}")
    print(f"{'B':>5} {'base':>10} {'new':>10} {'new/base':>9}")
    medians = {}
    for batch in BATCHES:
        base = statistics.median(s[str(batch)] for s in samples["base"])
        new = statistics.median(s[str(batch)] for s in samples["new"])
        medians[batch] = {"base_us": base, "new_us": new, "ratio": new / base}
        print(f"{batch:>5} {base:>10.1f} {new:>10.1f} {new / base:>9.3f}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "samples": samples, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
