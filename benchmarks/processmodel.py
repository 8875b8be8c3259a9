"""The process boundary on the real model: decode ITL and the GPU's idle time between steps, process against local.

Per batch size B (`process_model_batches`): B requests hold `process_model_context` tokens
of the Llama runner's KV (`process_model_config`, the model section's preset), then decode
one token a step through the protocol (prepare + execute + poll, as a scheduler does).
`LocalGPURuntime` in the control process and `ProcessGPURuntime` driving the same factory
run side by side in alternating blocks (`cpucost.alternating`), so drift cancels. ITL is the
host time of one step; target process over local <= 1.03 (issue 20). The process runtime runs
once per spin window (`process_model_spin_us`): 0, each side sleeps in the kernel as soon as it
waits for the other; 20000, each busy-polls for up to 20 ms first, as a serving engine's
processes do (`client.py`, `_wait_reply`), so neither wakes from an idle core within a step.

The essay's reason to split is then measured where it matters, on the GPU: the runner is
wrapped in `StepTimeline`, which records a CUDA event before and after each decode forward
on the compute stream, in whichever process runs the runtime. The idle time between two
steps is the time from one forward's end to the next one's start: everything the host does
in between (returning the tokens, control's next plan, the boundary). It is measured per
topology twice, with control quiet and with a control thread matching prefixes
(`processcost.Matcher`) throughout, `process_model_idle_steps` steps each. The timeline
is written to a JSON file when the last expected decode forward has been recorded (the
runtime process has no other way out but the protocol, which must not carry it), after
the timed ITL blocks, so its one synchronisation falls outside them.

CUDA events need CUDA: on CPU the ITL rows run (the CI-sized form, a tiny preset) and the
idle rows are skipped with a printed reason.
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import hooks
from benchmarks.cpucost import CALLS, alternating, block_sizes, timed_step
from benchmarks.harness import close_runtime
from benchmarks.processcost import Matcher, link_counts
from benchmarks.report import Row
from cacheruntime.protocol import BatchItem, BatchPlan

SECTION = "process"
FACTORY = "benchmarks.processmodel:llama_runtime"
#: requests prefilled per batch while the rows are filled (bounds the prefill's activations)
PREFILL_GROUP = 8


class StepTimeline:
    """A runner that records CUDA events around each decode forward of the runner it wraps.

    Prefill forwards (an item of more than one token) pass through unrecorded. After
    `decode_steps` decode forwards it synchronises once and writes every step's
    (start, end) in milliseconds from the first step's start to `path`.
    """

    def __init__(self, inner: Any, path: str, decode_steps: int):
        self.inner, self.path, self.decode_steps = inner, path, decode_steps
        self.events: list[tuple[Any, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, memory: Any, table: torch.Tensor, items: Any) -> torch.Tensor:
        if len(self.events) >= self.decode_steps or any(e - s != 1 for s, e in zip(items.starts, items.ends)):
            return self.inner.forward(memory, table, items)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.inner.forward(memory, table, items)
        end.record()
        self.events.append((start, end))
        if len(self.events) == self.decode_steps:
            end.synchronize()
            first = self.events[0][0]
            spans = [(first.elapsed_time(s), first.elapsed_time(e)) for s, e in self.events]
            Path(self.path).write_text(json.dumps(spans))
        return out


def llama_runtime(device: str, seed: int, config_name: str, timeline: str | None = None, decode_steps: int = 0, **sizes: Any) -> Any:
    """A LocalGPURuntime running the Llama preset `config_name`; the runtime process calls it too.

    With `timeline` (CUDA only), the runner records its first `decode_steps` decode forwards there.
    """
    config = hooks.LLAMA_CONFIGS[config_name]
    dev = torch.device(device)
    runner: Any = hooks.LlamaRunner(config, sizes["max_request_tokens"], dev, seed)
    if timeline is not None:
        runner = StepTimeline(runner, timeline, decode_steps)
    return hooks.new_runtime(config, dev, seed=seed, runner=runner, **sizes)


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="cacheruntime-process-model-"))
    cuda = device.type == "cuda"
    if not cuda:
        print("process: the GPU idle rows need CUDA events; on CPU only the real-model ITL rows run", flush=True)
    page = args.model_page_size
    warmup, steps, idle = args.cpu_warmup, args.process_model_steps, args.process_model_idle_steps
    decode_steps = warmup + steps + 2 * idle
    try:
        for batch in args.process_model_batches:
            with guard(SECTION, f"real model B={batch}"):
                context = args.process_model_context
                max_tokens = -(-(context + decode_steps + 1) // page) * page + page
                sizes = dict(page_size=page, max_requests=batch, max_request_tokens=max_tokens, l1_pages=batch * (max_tokens // page) + 2, l2_pages=0)
                names = ["local", *(_process_name(spin) for spin in args.process_model_spin_us)]
                paths = {name: str(workdir / f"timeline-{name.replace(' ', '-')}-B{batch}.json") for name in names}
                runtimes = _all(args, device, cuda, paths, decode_steps, sizes)
                try:
                    _measure(args, runtimes, paths if cuda else None, batch, context, (warmup, steps, idle), rows)
                finally:
                    _close(runtimes)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _process_name(spin_us: int) -> str:
    return f"process, spin {spin_us} us"


def _close(runtimes: dict[str, Any]) -> None:
    for name, runtime in runtimes.items():
        if name == "local":
            close_runtime(runtime)
        else:
            runtime.close()


def _all(args: Any, device: torch.device, cuda: bool, paths: dict[str, str], decode_steps: int, sizes: dict[str, Any]) -> dict[str, Any]:
    """The local runtime, then one process runtime per spin window, keyed by their names."""
    from cacheruntime.runtime.process import ProcessGPURuntime

    def options(name: str) -> dict[str, Any]:
        timeline = dict(timeline=paths[name], decode_steps=decode_steps) if cuda else {}
        return dict(device=str(device), seed=args.seed, config_name=args.process_model_config, **timeline, **sizes)

    runtimes = {"local": llama_runtime(**options("local"))}
    try:
        for spin in args.process_model_spin_us:
            name = _process_name(spin)
            runtimes[name] = ProcessGPURuntime(FACTORY, spin_us=spin, **options(name))
    except BaseException:
        _close(runtimes)
        raise
    return runtimes


def _measure(
    args: Any, runtimes: dict[str, Any], paths: dict[str, str] | None, batch: int, context: int, counts: tuple[int, int, int], rows: list[Row]
) -> None:
    warmup, steps, idle = counts
    plans, splits = {}, {}
    for name, rt in runtimes.items():
        requests = [rt.open_request() for _ in range(batch)]
        for i in range(0, batch, PREFILL_GROUP):
            rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * context) for r in requests[i : i + PREFILL_GROUP]))))
        plans[name] = BatchPlan(tuple(BatchItem(r, (1,)) for r in requests))
        splits[name] = dict.fromkeys(CALLS, 0.0)
        for _ in range(warmup):
            timed_step(rt, plans[name], splits[name])
        splits[name] = dict.fromkeys(CALLS, 0.0)
    sides = {name: (lambda rt=rt, name=name: timed_step(rt, plans[name], splits[name])) for name, rt in runtimes.items()}
    sent = {name: link_counts(rt) for name, rt in runtimes.items() if name != "local"}
    timed = alternating(sides, steps)
    per_step = {name: {k: (v - sent[name][k]) / steps for k, v in link_counts(runtimes[name]).items()} for name in sent}
    processes = [name for name in runtimes if name != "local"]
    itl_details: dict[str, dict[str, Any]] = {}
    for name in processes:
        rows.append(
            Row(
                SECTION,
                f"decode ITL B={batch}, context {context}, {args.process_model_config} runner, {name}",
                "ms",
                timed[name]["seconds"] * 1e3,
                timed["local"]["seconds"] * 1e3,
                "LocalGPURuntime in-process, same steps",
                "ratio",
                "<=",
                1.03,
                detail={
                    "batch": batch,
                    "context": context,
                    "steps": steps,
                    "per_call_us": {side: {k: v / steps * 1e6 for k, v in splits[side].items()} for side in (name, "local")},
                    "per_step": per_step[name],  # messages, calls answered without one, messages in short form
                    "block_means_ms": {side: [round(m * 1e3, 3) for m in timed[side]["block_means"]] for side in (name, "local")},
                    "control_gc_us": {side: timed[side]["gc_seconds"] * 1e6 for side in (name, "local")},  # collector pauses in control, per step
                },
            )
        )
        itl_details[name] = rows[-1].detail
    if paths is None:
        return
    matcher = Matcher(args.cpu_page_size, args.seed)
    matcher.start()
    gaps: dict[str, dict[str, Any]] = {}
    try:
        for name, rt in runtimes.items():
            gaps[name] = {}
            for phase in ("quiet", "busy"):
                if phase == "busy":
                    matcher.running.set()
                    before = matcher.matched
                    while matcher.matched == before:  # matching when the window opens
                        matcher.check()
                        time.sleep(0.0005)
                for _ in range(idle):
                    timed_step(rt, plans[name], splits[name])
                matcher.running.clear()
            matcher.check()
            spans = json.loads(Path(paths[name]).read_text())
            gaps[name] = _idle_gaps(spans, warmup + steps, idle)
            gaps[name]["itl"] = _itl_split(spans[warmup : warmup + steps])
    finally:
        matcher.stopped = True
        matcher.running.set()
        matcher.join()
    for name in processes:
        # The ITL steps' own GPU time, split: each side's forward (CUDA events) and its idle time
        # between forwards of one block. A step's time is about their sum; the boundary adds to the
        # idle part, while a difference in the forward part is the two runtimes' GPU work.
        itl_details[name]["itl_gpu_ms"] = {side: gaps[side]["itl"] for side in (name, "local")}
        for phase, words in (("quiet", "control quiet"), ("busy", "a control thread matching prefixes")):
            process, local = gaps[name][phase], gaps["local"][phase]
            rows.append(
                Row(
                    SECTION,
                    f"GPU idle between decode steps B={batch} ({words}), {name}",
                    "ms",
                    statistics.mean(process),
                    statistics.mean(local),
                    "LocalGPURuntime in-process",
                    detail={
                        "batch": batch,
                        "gaps": len(process),
                        "p50_ms": {"process": statistics.median(process), "local": statistics.median(local)},
                        "max_ms": {"process": max(process), "local": max(local)},
                        "forward_ms_mean": {side: gaps[side]["forward_" + phase] for side in (name, "local")},
                    },
                )
            )


def _itl_split(spans: list[list[float]]) -> dict[str, float]:
    """Mean forward and mean idle gap (ms) of one side's ITL steps, gaps taken within the
    blocks `alternating` ran them in (a gap across blocks holds the other sides' steps)."""
    starts = list(itertools.accumulate(block_sizes(len(spans)), initial=0))
    idle = [b[0] - a[1] for first, end in itertools.pairwise(starts) for a, b in itertools.pairwise(spans[first:end])]
    return {"forward_ms": statistics.mean(e - s for s, e in spans), "idle_ms": statistics.mean(idle) if idle else float("nan")}


def _idle_gaps(spans: list[list[float]], skip: int, idle: int) -> dict[str, Any]:
    """The idle gaps between consecutive steps inside the quiet and the busy phase (the gap
    across a phase boundary is left out), and the mean forward time in each."""
    out: dict[str, Any] = {}
    for phase, first in (("quiet", skip), ("busy", skip + idle)):
        phase_spans = spans[first : first + idle]
        out[phase] = [b[0] - a[1] for a, b in itertools.pairwise(phase_spans)]
        out["forward_" + phase] = statistics.mean(e - s for s, e in phase_spans)
    return out
