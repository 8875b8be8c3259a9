"""The boundary benchmark: its cost and overlap, each beside a baseline of the same run.

It lives in the checkout, not in the installed package: run it from a clone as
`cacheruntime bench [options]` (which finds this folder) or `python -m benchmarks [options]`.
It drives `LocalGPURuntime` through the protocol and reaches the runtime's parts only
through `benchmarks.hooks`. One-off diagnostics behind its numbers are in `diagnostics/`.

Sections (`--only` picks some):

- `transfer`: restore (L2->L1) and backup (L1->L2) throughput of scattered page runs through
  the runtime, against a raw pinned `copy_` of one contiguous buffer of the same bytes
  (target ratio >= 0.90), for each page size and run length; also the runtime's copy
  routine alone (its data path);
- `overlap`: restore time left exposed when `prepare_batch(N+1)` is issued during batch N,
  as a fraction of the transfer time (target <= 5%), against one-phase issue;
- `itl`: decode inter-token latency with background write-back against none (<= 1.03x);
- `cpu`: host time of a decode step through the boundary against the same bookkeeping
  in-process on the pools (<= 1.0x), for B = 1, 16, 64, 256;
- `process` (only when named in `--only`): the same decode step and one call's round trip on `ProcessGPURuntime` (the
  runtime in a runtime process, over ZeroMQ) against `LocalGPURuntime` in-process, for
  B = 1, 16, 64, 256 (`benchmarks/processcost.py`; no target: the ratio is what the split costs);
- `cpu-sglang`: the same decode step against SGLang's own code on its CPU path
  (`alloc_decode` + the ReqToToken write on its real pools) and against the in-process
  baseline, all three alternating (<= 1.0x); only on the CPU and where SGLang is
  importable (its own environment), else skipped with the reason;
- `model` (only when named in `--only`): the Llama runner's decode step against its HBM
  bound and its prefill against the matmul throughput, both limits measured in the run
  (`benchmarks/model.py`);
- `l3` (only when named in `--only`): the L3 tier's fetch (store -> staging -> device, its
  completion polled) and persist through the runtime against a raw read or write of the same
  objects on the same store, warm and cold (target >= 0.90 for the file store's fetch), and
  the store I/O's exposed time under decode steps (`benchmarks/l3.py`);
- `e2e` (only when named in `--only`): a multi-turn workload served through the Scheduler
  on the Llama runner, TTFT, ITL and throughput of recompute, an L1 prefix cache, L1+L2
  two-phase and one-phase (`benchmarks/e2e.py`).

The printed table has: measurement, value, baseline, ratio, target, met. `--json` writes
every row with its details. On CUDA, `--timeline DIR` writes profiler traces of a few
two-phase batches and a PNG of the compute, H2D and D2H streams.

torch is imported inside `main` only, so building the CLI parser stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import sys
import time
import traceback
from typing import Any

SECTIONS = ("transfer", "overlap", "itl", "cpu", "cpu-sglang")
#: sections run only when `--only` names them (the model's and e2e's runs need a large GPU; the
#: process section needs the [process] extra and forks runtime processes; l3 writes to a store on disk)
OPT_IN_SECTIONS = ("model", "e2e", "process", "l3")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions (the CI smoke test)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--timeline", default=None, metavar="DIR", help="write profiler traces and timeline.png here (CUDA)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS + OPT_IN_SECTIONS)}")
    parser.add_argument("--seed", type=int, default=0)
    g = parser.add_argument_group("sizes (defaults depend on --device and --quick)")
    g.add_argument("--layers", type=int, help="KV layers (32)")
    g.add_argument("--kv-heads", type=int, help="KV heads (8)")
    g.add_argument("--head-dim", type=int, help="head dim (128)")
    g.add_argument("--dtype", help="KV dtype (bfloat16)")
    g.add_argument("--hidden", type=int, help="bench model hidden size (4096)")
    g.add_argument("--weight-layers", type=int, help="bench model weight matrices read per step (32)")
    g.add_argument("--width-mult", type=int, help="each weight matrix is [hidden, hidden*width_mult] (13: ~8B params)")
    g.add_argument("--page-sizes", type=_ints, help="page sizes for the transfer section (16,64)")
    g.add_argument("--runs", type=_ints, help="run lengths in pages for the transfer section (1,8,64)")
    g.add_argument("--transfer-mib", type=int, help="bytes moved per transfer measurement (512 MiB)")
    g.add_argument("--reps", type=int, help="repetitions per timing, after one warm-up (5)")
    g.add_argument("--overlap-page-size", type=int, help="page size for overlap and ITL (16)")
    g.add_argument("--overlap-width-mult", type=int, help="width_mult of the overlap section's model: a longer, GPU-bound batch (40)")
    g.add_argument("--decode-batch", type=int, help="decoding requests for overlap and ITL (16)")
    g.add_argument("--context", type=int, help="context tokens per decoding request (1024)")
    g.add_argument("--restore-pages", type=int, help="pages restored per step in the overlap section (384)")
    g.add_argument("--overlap-ratios", type=_floats, help="further transfer/compute ratios for the overlap sweep (0.25,0.5)")
    g.add_argument("--context-chunk", type=int, help="tokens the bench model's context read gathers at a time; 0: the whole context at once (2048)")
    g.add_argument("--writeback-pages", type=int, help="pages per background backup in the ITL section (64)")
    g.add_argument("--steps", type=int, help="decode steps per timed loop (30)")
    g.add_argument("--rounds", type=int, help="alternating quiet/write-back rounds (3)")
    g.add_argument("--timeline-steps", type=int, help="two-phase steps in each timeline trace (4)")
    g.add_argument("--cpu-batches", type=_ints, help="batch sizes for the cpu section (1,16,64,256)")
    g.add_argument("--cpu-steps", type=int, help="timed decode steps per batch size (300)")
    g.add_argument("--cpu-warmup", type=int, help="untimed decode steps first (8)")
    g.add_argument("--cpu-context", type=int, help="context tokens per request before the timed steps (1024)")
    g.add_argument("--process-batches", type=_ints, help="batch sizes for the process section (1,16,64,256)")
    g.add_argument("--process-interference-batch", type=int, help="batch size of the process section's interference rows (16)")
    g.add_argument("--process-model-config", help="Llama preset of the process section's real-model rows (llama3-8b)")
    g.add_argument("--process-model-batches", type=_ints, help="decode batch sizes of the process section's real-model rows (16,64)")
    g.add_argument("--process-model-context", type=int, help="context tokens per request in the real-model rows (2048)")
    g.add_argument("--process-model-steps", type=int, help="timed decode steps per topology in the real-model ITL rows (300)")
    g.add_argument("--process-model-idle-steps", type=int, help="decode steps per phase of the GPU idle rows (40)")
    g.add_argument("--process-model-spin-us", type=_ints, help="spin windows (us) of the process runtimes in the real-model rows (0,20000)")
    g.add_argument("--cpu-page-size", type=int, help="page size for the cpu section (16)")
    g.add_argument("--model-config", help="Llama preset for the model section (llama3-8b)")
    g.add_argument("--model-batches", type=_ints, help="decode batch sizes for the model section (1,16,64,256)")
    g.add_argument("--model-contexts", type=_ints, help="decode context tokens for the model section (2048,8192,16384)")
    g.add_argument("--model-prefill", type=_ints, help="prefill lengths for the model section (2048,8192,16384)")
    g.add_argument("--model-steps", type=int, help="timed steps per model measurement (5)")
    g.add_argument("--model-page-size", type=int, help="page size of the model section's KV (128)")
    g.add_argument("--model-bw-gib", type=int, help="GiB read by the bandwidth reduction (8)")
    g.add_argument("--model-matmul", type=int, help="n of the n x n x n matmul timing (8192)")
    g.add_argument("--l3-stores", type=lambda text: [s for s in text.split(",") if s], help="stores of the l3 section: file, mooncake (file)")
    g.add_argument("--l3-dir", help="folder the l3 section's file store (and Mooncake's logs) go in, emptied after (default: a temporary one)")
    g.add_argument("--l3-page-size", type=int, help="page size (tokens) of the l3 throughput rows: one page is one object (16)")
    g.add_argument("--l3-mib", type=int, help="bytes per l3 fetch or persist measurement (512 MiB)")
    g.add_argument("--l3-step-pages", type=int, help="pages fetched or persisted per decode step in the l3 exposed rows (64)")
    g.add_argument("--e2e-conversations", type=int, help="conversations of the e2e workload (32)")
    g.add_argument("--e2e-turns", type=int, help="turns per conversation (4)")
    g.add_argument("--e2e-system", type=_ints, help="system prompts' lengths in tokens, shared round-robin (2048,4096,8192)")
    g.add_argument("--e2e-user", type=_ints, help="MIN,MAX tokens of a user turn (1024,2048)")
    g.add_argument("--e2e-new-tokens", type=int, help="tokens generated per turn (32)")
    g.add_argument("--e2e-arrival-gap", type=int, help="scheduler steps between the first turns of consecutive conversations (8)")
    g.add_argument("--e2e-max-requests", type=int, help="request slots of the e2e runtime (16)")
    g.add_argument("--e2e-prefill-tokens", type=int, help="prompt tokens computed per batch beyond the first prompt (8192)")
    g.add_argument("--e2e-probe-prefix", type=int, help="prefix tokens of the idle TTFT probe (8192)")
    g.add_argument("--e2e-probe-suffix", type=int, help="new tokens after the probe's prefix (128)")
    g.add_argument("--e2e-probe-reps", type=int, help="timed reps of each probe path (5)")


#: (full run on CUDA, --quick on CUDA, CPU, --quick on CPU)
DEFAULTS: dict[str, tuple[Any, Any, Any, Any]] = {
    "layers": (32, 32, 4, 2),
    "kv_heads": (8, 8, 2, 2),
    "head_dim": (128, 128, 32, 16),
    "dtype": ("bfloat16", "bfloat16", "float32", "float32"),
    "hidden": (4096, 4096, 256, 64),
    "weight_layers": (32, 32, 4, 2),
    "width_mult": (13, 13, 4, 2),
    "page_sizes": ([16, 64], [16, 64], [16, 64], [16, 64]),
    "runs": ([1, 8, 64], [1, 8, 64], [1, 8, 64], [1, 8, 64]),
    "transfer_mib": (512, 256, 32, 2),
    "reps": (5, 2, 3, 1),
    "overlap_page_size": (16, 16, 16, 16),
    "decode_batch": (16, 16, 8, 4),
    "context": (1024, 1024, 256, 64),
    "restore_pages": (384, 384, 16, 4),
    "overlap_width_mult": (40, 40, 4, 2),
    "overlap_ratios": ([0.25, 0.5], [0.5], [0.5], []),
    "context_chunk": (2048, 2048, 256, 64),
    "writeback_pages": (64, 64, 8, 4),
    "steps": (30, 10, 10, 4),
    "rounds": (3, 2, 2, 1),
    "timeline_steps": (4, 4, 0, 0),
    "cpu_batches": ([1, 16, 64, 256], [1, 16, 64, 256], [1, 16, 64, 256], [1, 16, 64, 256]),
    "cpu_steps": (300, 8, 16, 4),
    "process_batches": ([1, 16, 64, 256], [1, 16, 64, 256], [1, 16, 64, 256], [1, 16, 64, 256]),
    "process_interference_batch": (16, 16, 16, 16),
    "process_model_config": ("llama3-8b", "llama3-8b", "llama-small", "llama-small"),
    "process_model_batches": ([16, 64], [16], [2], [2]),
    "process_model_context": (2048, 2048, 32, 16),
    "process_model_steps": (300, 20, 6, 3),
    "process_model_idle_steps": (40, 10, 4, 2),
    "process_model_spin_us": ([0, 20000], [0, 20000], [0, 1000], [0, 1000]),
    "cpu_warmup": (4, 2, 2, 1),
    "cpu_context": (1024, 1024, 256, 32),
    "cpu_page_size": (16, 16, 16, 16),
    "model_config": ("llama3-8b", "llama3-8b", "llama-small", "llama-small"),
    "model_batches": ([1, 16, 64, 256], [16], [1, 4], [2]),
    "model_contexts": ([2048, 8192, 16384], [8192], [128], [64]),
    "model_prefill": ([2048, 8192, 16384], [8192], [256], [64]),
    "model_steps": (5, 2, 2, 1),
    "model_page_size": (128, 128, 16, 16),
    "model_bw_gib": (8, 4, 1, 1),
    "model_matmul": (8192, 8192, 512, 256),
    "l3_stores": (["file"], ["file"], ["file"], ["file"]),
    "l3_dir": (None, None, None, None),
    "l3_page_size": (16, 16, 16, 16),
    "l3_mib": (512, 128, 16, 2),
    "l3_step_pages": (16, 16, 8, 4),
    "e2e_conversations": (32, 8, 8, 8),
    "e2e_turns": (4, 2, 3, 3),
    "e2e_system": ([2048, 4096, 8192], [2048, 8192], [64, 96], [32, 48]),
    "e2e_user": ([1024, 2048], [512, 1024], [16, 32], [8, 16]),
    "e2e_new_tokens": (32, 8, 6, 3),
    "e2e_arrival_gap": (8, 4, 2, 2),
    "e2e_max_requests": (16, 8, 4, 4),
    "e2e_prefill_tokens": (8192, 8192, 128, 64),
    "e2e_probe_prefix": (8192, 8192, 64, 32),
    "e2e_probe_suffix": (128, 128, 16, 8),
    "e2e_probe_reps": (5, 2, 3, 1),
}


def resolve(args: argparse.Namespace, cuda: bool) -> argparse.Namespace:
    column = (0 if not args.quick else 1) if cuda else (2 if not args.quick else 3)
    for name, values in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, values[column])
    return args


def main(args: argparse.Namespace) -> int:
    import torch

    from benchmarks import report

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    resolve(args, device.type == "cuda")
    sections = [s for s in args.only.split(",") if s]
    unknown = set(sections) - set(SECTIONS) - set(OPT_IN_SECTIONS)
    if unknown:
        print(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS + OPT_IN_SECTIONS)}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    rows: list[report.Row] = []
    failures: list[report.Failure] = []

    @contextlib.contextmanager
    def guard(section: str, what: str):
        try:
            yield
        except Exception as error:  # one failed measurement must not lose the others
            traceback.print_exc()
            failures.append(report.Failure(section, what, f"{type(error).__name__}: {error}"))

    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["cacheruntime", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else " ".join(sys.argv),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "quick": bool(args.quick),
        "config": {k: getattr(args, k) for k in DEFAULTS},
    }
    print(f"cacheruntime bench on {meta['device_name']} ({device}), torch {torch.__version__}, quick={args.quick}", flush=True)
    clock = None
    traces: dict[str, Any] = {}
    started = time.perf_counter()
    for section in sections:
        t0 = time.perf_counter()
        with guard(section, "section"):
            if section == "transfer":
                from benchmarks import harness, transfers

                clock = clock or harness.Clock(device)
                transfers.run(args, device, clock, rows, guard)
            elif section == "overlap":
                from benchmarks import overlap

                if args.timeline is None:
                    args.timeline_steps = 0
                overlap.run(args, device, rows, guard, traces)
            elif section == "itl":
                from benchmarks import itl

                itl.run(args, device, rows, guard)
            elif section == "cpu":
                from benchmarks import cpucost

                cpucost.run(args, device, rows, guard)
            elif section == "process":
                from benchmarks import processcost

                processcost.run(args, device, rows, guard)
            elif section == "cpu-sglang":
                from benchmarks import sglangcpu

                skipped = sglangcpu.run(args, device, rows, guard)
                if skipped:
                    meta.setdefault("skipped", {})[section] = skipped
                    print(f"[{section}: skipped: {skipped}]", flush=True)
            elif section == "model":
                from benchmarks import model

                model.run(args, device, rows, guard)
            elif section == "l3":
                from benchmarks import l3

                l3.run(args, device, rows, guard)
            elif section == "e2e":
                from benchmarks import e2e

                e2e.run(args, device, rows, guard)
        print(f"[{section}: {time.perf_counter() - t0:.1f} s]", flush=True)
    if traces and args.timeline:
        with guard("timeline", "export"):
            from benchmarks import timeline

            meta["timeline"] = timeline.export(traces, args.timeline)
    meta["seconds"] = time.perf_counter() - started
    print()
    print(report.table(rows, failures))
    if args.json:
        report.write_json(args.json, meta, rows, failures)
    print(f"\n{len(rows)} measurements, {sum(1 for r in rows if r.met)} targets met, {len(failures)} failures")
    return 1 if failures else 0
