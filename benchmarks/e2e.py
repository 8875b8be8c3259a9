"""The `e2e` section: a multi-turn workload served end to end on the Llama runner.

Served through the Scheduler and the protocol on `LocalGPURuntime` with the real model
(`--model-config`, Llama-3-8B's shape on CUDA), in four configurations, one after another
in one run, on the same workload and the same runner (its weights and compiled kernels):

- `recompute`: no prefix cache (the Scheduler publishes nothing, every prompt is computed);
- `l1`: the prefix cache in L1 only (evicted prefixes are dropped);
- `l1+l2`: L1 and L2 (write-through backups), restores issued one step ahead (two-phase);
- `l1+l2 one-phase`: the same, each batch executed in the step that prepares it, so its
  restores start right before its compute.

The workload: `e2e_conversations` conversations of `e2e_turns` turns; each opens with one of
the system prompts (`e2e_system`, tokens) and each turn adds a user message (`e2e_user`,
a range) and `e2e_new_tokens` generated tokens; a follow-up turn arrives when its parent
finished, conversation c's first turn at step c * `e2e_arrival_gap`. L1 holds about a
quarter of the workload's KV (at least two of its longest rows, so that a long turn can
run beside another), L2 all of it; the sizes are printed.

Per configuration: TTFT (a turn's arrival, when the Scheduler takes it, to its first token
on the host) p50/p99 per turn index, ITL (gaps between a turn's consecutive tokens) p50/p99
over every gap, and throughput (generated tokens per second of the run); each beside the
recompute configuration's. The sample counts are in each row's detail. A step that
prefills delays the decode items in it (they run in the same step), so ITL p99 follows
how much a configuration recomputes, not only its transfers; the `itl` section measures
write-back against none with the batches held equal.

Apart from the workload, TTFT of one request at an idle runtime, through protocol calls:
an `e2e_probe_prefix`-token prefix held in L2 only (restored in the request's plan) or in
L1, plus `e2e_probe_suffix` new tokens, against the same prompt computed whole (target: an
L2 hit at an 8k prefix <= 0.15x of recompute); medians of `e2e_probe_reps` alternating reps.
The prefix's restore alone (`submit` of its `Restore`, then waiting for it) is timed
beside them: the L2 hit's compute waits for it (O1), so the two add up.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from benchmarks import hooks
from benchmarks.harness import close_runtime, free_memory, median
from benchmarks.report import Row
from cacheruntime.control.scheduler import Scheduler
from cacheruntime.control.workload import ChainedSource, FollowUp, RequestSpec
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Restore

SECTION = "e2e"
#: configuration -> (L2 used, prefix cache, two-phase)
CONFIGS = {
    "recompute": (False, False, True),
    "l1": (False, True, True),
    "l1+l2": (True, True, True),
    "l1+l2 one-phase": (True, True, False),
}


class TimedSource:
    """A workload source that notes when each turn is handed to the Scheduler (its arrival)."""

    def __init__(self, source: ChainedSource):
        self.source = source
        self.arrived: dict[str, float] = {}

    def arrivals(self, step: int) -> list[RequestSpec]:
        specs = self.source.arrivals(step)
        now = time.perf_counter()
        for spec in specs:
            self.arrived.setdefault(spec.request_id, now)
        return specs

    def finished(self, spec: RequestSpec, output: tuple[int, ...]) -> None:
        self.source.finished(spec, output)

    def abandoned(self, spec: RequestSpec) -> int:
        return self.source.abandoned(spec)

    def exhausted(self) -> bool:
        return self.source.exhausted()

    def next_arrival(self) -> int | None:
        return self.source.next_arrival()


def workload(args: Any, vocab: int) -> tuple[list[RequestSpec], list[FollowUp], int]:
    """The conversations (seeded by `args.seed`) and the tokens of KV they leave (shared system prompts once)."""
    rng = random.Random(args.seed)
    tokens = lambda n: tuple(rng.randrange(vocab) for _ in range(n))  # noqa: E731
    systems = [tokens(n) for n in args.e2e_system]
    roots, follow_ups = [], []
    kv_tokens = sum(args.e2e_system)
    low, high = args.e2e_user
    for c in range(args.e2e_conversations):
        user = tokens(rng.randint(low, high))
        parent = f"c{c}t0"
        roots.append(RequestSpec(parent, systems[c % len(systems)] + user, args.e2e_new_tokens, c * args.e2e_arrival_gap))
        kv_tokens += len(user) + args.e2e_new_tokens
        for turn in range(1, args.e2e_turns):
            user = tokens(rng.randint(low, high))
            follow_ups.append(FollowUp(f"c{c}t{turn}", parent, user, args.e2e_new_tokens))
            parent = f"c{c}t{turn}"
            kv_tokens += len(user) + args.e2e_new_tokens
    return roots, follow_ups, kv_tokens


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    config = hooks.LLAMA_CONFIGS[args.model_config]
    page = args.model_page_size
    roots, follow_ups, kv_tokens = workload(args, config.vocab)
    longest = max(args.e2e_system) + args.e2e_turns * (args.e2e_user[1] + args.e2e_new_tokens)
    row_tokens = -(-(longest + 1) // page) * page
    kv_pages = -(-kv_tokens // page) + len(args.e2e_system) + args.e2e_conversations * args.e2e_turns  # partial pages
    l1_pages = max(kv_pages // 4, 2 * row_tokens // page)
    l2_pages = kv_pages + kv_pages // 10
    page_bytes = page * config.layers * 2 * config.heads * config.head_dim * torch.empty((), dtype=config.torch_dtype).element_size()
    print(
        f"e2e: {args.e2e_conversations} conversations x {args.e2e_turns} turns, system prompts {args.e2e_system} tokens, user turns "
        f"{args.e2e_user[0]}-{args.e2e_user[1]} tokens, {args.e2e_new_tokens} new tokens a turn; rows up to {longest} tokens; "
        f"workload KV {kv_pages} pages ({kv_pages * page_bytes / 2**30:.1f} GiB); L1 {l1_pages} pages ({l1_pages * page_bytes / 2**30:.1f} GiB), "
        f"L2 {l2_pages} pages ({l2_pages * page_bytes / 2**30:.1f} GiB); page {page} tokens",
        flush=True,
    )
    runner = hooks.LlamaRunner(config, row_tokens + page, device, args.seed)
    sizes = dict(page_size=page, max_requests=args.e2e_max_requests, max_request_tokens=row_tokens, l1_pages=l1_pages)

    def runtime(l2: bool) -> Any:
        rt = hooks.new_runtime(config, device, seed=args.seed, runner=runner, l2_pages=l2_pages if l2 else 0, **sizes)
        hooks.warm_up(rt, args.e2e_max_requests, prefill=min(longest, 2 * page))
        return rt

    with guard(SECTION, "TTFT probe"):
        rt = runtime(True)
        try:
            _probe(args, rt, config.vocab, rows)
        finally:
            close_runtime(rt)

    results: dict[str, dict[str, Any]] = {}
    for name, (l2, prefix_cache, two_phase) in CONFIGS.items():
        with guard(SECTION, name):
            rt = runtime(l2)
            try:
                results[name] = _serve(rt, roots, follow_ups, prefix_cache, two_phase, args.e2e_prefill_tokens)
            finally:
                close_runtime(rt)
            r = results[name]
            print(
                f"  {name}: {r['seconds']:.1f} s, {r['tokens_per_s']:.1f} tokens/s, TTFT p50 {r['ttft_all'][0] * 1e3:.0f} ms, "
                f"ITL p50 {r['itl'][0] * 1e3:.1f} ms p99 {r['itl'][1] * 1e3:.1f} ms; hits L1 {r['stats']['hit_tokens_l1']} "
                f"L2 {r['stats']['hit_tokens_l2']} computed {r['stats']['computed_prompt_tokens']} tokens",
                flush=True,
            )
        free_memory()
    _rows(results, rows)


def _serve(rt: Any, roots: list[RequestSpec], follow_ups: list[FollowUp], prefix_cache: bool, two_phase: bool, prefill_tokens: int) -> dict[str, Any]:
    """Serve the workload once; per-turn TTFT, ITL samples and throughput."""
    source = TimedSource(ChainedSource(roots, follow_ups))
    token_times: dict[str, list[float]] = defaultdict(list)

    def on_token(request_id: str, prefix: tuple[int, ...], token: int | None) -> None:
        token_times[request_id].append(time.perf_counter())

    scheduler = Scheduler(rt, source, max_prefill_tokens=prefill_tokens, on_token=on_token, prefix_cache=prefix_cache, lookahead=two_phase)
    t0 = time.perf_counter()
    stats = scheduler.run()
    seconds = time.perf_counter() - t0
    ttft: dict[int, list[float]] = defaultdict(list)
    itl: list[float] = []
    for request_id, times in token_times.items():
        ttft[int(request_id.rpartition("t")[2])].append(times[0] - source.arrived[request_id])
        itl.extend(b - a for a, b in itertools.pairwise(times))
    everything = [t for turn in ttft.values() for t in turn]
    milliseconds = lambda values: [round(v * 1e3, 3) for v in values]  # noqa: E731
    return {
        "samples": {"ttft_ms": {turn: milliseconds(values) for turn, values in sorted(ttft.items())}, "itl_ms": milliseconds(itl)},
        "seconds": seconds,
        "tokens_per_s": stats.generated_tokens / seconds,
        "ttft": {turn: _p50_p99(values) + (len(values),) for turn, values in sorted(ttft.items())},
        "ttft_all": _p50_p99(everything) + (len(everything),),
        "itl": _p50_p99(itl) + (len(itl),),
        "stats": {
            "turns_served": stats.turns_served,
            "generated_tokens": stats.generated_tokens,
            "prompt_tokens": stats.prompt_tokens,
            "computed_prompt_tokens": stats.computed_prompt_tokens,
            "hit_tokens_l1": stats.hit_tokens_l1,
            "hit_tokens_l2": stats.hit_tokens_l2,
            "restored_pages": stats.restored_pages,
            "backed_up_pages": stats.backed_up_pages,
            "steps": stats.steps,
            "out_of_pages": stats.out_of_pages,
        },
    }


def _p50_p99(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (0.0, 0.0)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


def _rows(results: dict[str, dict[str, Any]], rows: list[Row]) -> None:
    base = results.get("recompute")
    if base is None:
        return
    for name, r in results.items():
        if name == "recompute":
            continue
        detail = {
            "stats": r["stats"],
            "baseline_stats": base["stats"],
            "seconds": r["seconds"],
            "baseline_seconds": base["seconds"],
            "samples": r["samples"],  # every TTFT (per turn) and ITL, for the plots
            "baseline_samples": base["samples"],
        }
        for turn, (p50, p99, n) in r["ttft"].items():
            b50, b99, _ = base["ttft"].get(turn, (0.0, 0.0, 0))
            rows.append(Row(SECTION, f"{name}: TTFT p50 turn {turn}", "ms", p50 * 1e3, b50 * 1e3, "recompute", detail={"samples": n}))
            rows.append(Row(SECTION, f"{name}: TTFT p99 turn {turn}", "ms", p99 * 1e3, b99 * 1e3, "recompute", detail={"samples": n}))
        (p50, p99, n), (b50, b99, bn) = r["itl"], base["itl"]
        rows.append(Row(SECTION, f"{name}: ITL p50", "ms", p50 * 1e3, b50 * 1e3, "recompute", detail={"samples": n, "baseline_samples": bn}))
        rows.append(Row(SECTION, f"{name}: ITL p99", "ms", p99 * 1e3, b99 * 1e3, "recompute", detail={"samples": n, "baseline_samples": bn}))
        rows.append(Row(SECTION, f"{name}: throughput", "tokens/s", r["tokens_per_s"], base["tokens_per_s"], "recompute", detail=detail))
    l1, l2 = results.get("l1"), results.get("l1+l2")
    if l1 is not None and l2 is not None:  # write-back (L2's backups) against none, same workload
        for index, (quantile, target) in enumerate((("p50", 1.03), ("p99", 1.10))):
            rows.append(
                Row(
                    SECTION,
                    f"ITL {quantile} with write-back (l1+l2) against without (l1)",
                    "ms",
                    l2["itl"][index] * 1e3,
                    l1["itl"][index] * 1e3,
                    "l1 (no L2, no backups)",
                    "ratio",
                    "<=",
                    target,
                    detail={
                        "samples": l2["itl"][2],
                        "baseline_samples": l1["itl"][2],
                        "prefill_tokens_l1": l1["stats"]["computed_prompt_tokens"],
                        "prefill_tokens_l1_l2": l2["stats"]["computed_prompt_tokens"],
                    },
                )
            )


def _probe(args: Any, rt: Any, vocab: int, rows: list[Row]) -> None:
    """TTFT of one request at an idle runtime: prefix from L2 (restored in its plan), from L1, or computed whole."""
    page = rt.info().page_size
    rng = random.Random(args.seed + 1)
    prefix = tuple(rng.randrange(vocab) for _ in range(args.e2e_probe_prefix))
    suffix = tuple(rng.randrange(vocab) for _ in range(args.e2e_probe_suffix))
    owner = rt.open_request()
    rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(owner, prefix),), ())))
    extent = rt.publish(owner, 0, len(prefix) // page)
    rt.close_request(owner)
    rt.submit((Backup(extent),))
    rt.wait_completions()

    def first_token(attach: bool, restore: bool) -> float:
        handle = rt.open_request()
        tokens, intents = (suffix, (Restore(extent),) if restore else ()) if attach else (prefix + suffix, ())
        t0 = time.perf_counter()
        rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(handle, tokens, (extent,) if attach else ()),), intents)))
        seconds = time.perf_counter() - t0
        rt.close_request(handle)
        rt.wait_completions()
        return seconds

    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.e2e_probe_reps + 1):  # the first rep warms each path up and is dropped
        rt.submit((Demote(extent),))
        rt.wait_completions()
        times["l2"].append(first_token(attach=True, restore=True))
        times["l1"].append(first_token(attach=True, restore=False))
        times["recompute"].append(first_token(attach=False, restore=False))
        rt.submit((Demote(extent),))
        rt.wait_completions()
        t0 = time.perf_counter()  # the prefix's restore alone: what an L2 hit adds, unless it overlaps
        rt.submit((Restore(extent),))
        rt.wait_completions()
        times["restore"].append(time.perf_counter() - t0)
    l2, l1, whole, restore = (median(times[key][1:]) for key in ("l2", "l1", "recompute", "restore"))
    what = f"{len(prefix)}-token prefix + {len(suffix)} new"
    print(
        f"  TTFT at idle, {what}: L2 hit {l2 * 1e3:.1f} ms, L1 hit {l1 * 1e3:.1f} ms, recompute {whole * 1e3:.1f} ms; "
        f"the prefix's restore alone {restore * 1e3:.1f} ms",
        flush=True,
    )
    detail = {"reps": args.e2e_probe_reps, "pages": len(prefix) // page, "samples_ms": {k: [round(t * 1e3, 3) for t in v[1:]] for k, v in times.items()}}
    targeted = len(prefix) == 8192
    rows.append(
        Row(
            SECTION,
            f"TTFT L2 hit, {what}",
            "ms",
            l2 * 1e3,
            whole * 1e3,
            "recompute",
            *(("ratio", "<=", 0.15) if targeted else (None, None, None)),
            detail=detail,
        )
    )
    rows.append(Row(SECTION, f"TTFT L1 hit, {what}", "ms", l1 * 1e3, whole * 1e3, "recompute", detail=detail))
