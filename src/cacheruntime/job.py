"""`cacheruntime run`: serve a workload end to end through the boundary and check the outputs.

Control (Scheduler + TreeCore) drives a runtime only through `RuntimeInterface`. By default
the runtime is `LocalGPURuntime` on the CPU with the tiny model and an L1 small enough that
prefixes are demoted to L2 and restored. Every generated token is checked against the
runtime's recomputation without cache (`reference_next_token`, D1 on real bytes); the
summary says how many differ, and the job fails if any does.

`--runtime process` runs the same LocalGPURuntime in a runtime process of its own
(`ProcessGPURuntime`): control imports no torch, the output check's recomputation runs in
the runtime process, and the summary adds the request messages per batch beside the calls.

`--runtime model` runs the same control on the reference model (no torch): its tokens
are tag digests, so the output check is the model's invariants (D1 on copies among them)
after every step, and the model's transfers complete at the end of each step.

`--transfer-fault-rate P` and `--compute-fault-rate P` make about that share of the
transfers (backups and restores that move a page) and of the computes fail on
LocalGPURuntime, in this process or a runtime process (FAULT_INJECTION, `FaultInjector`); control retries the turns they hit
(issue 17, item 7). `--lost-fault-rate P` kills the stream worker of about that share of
transfer launches: the runtime raises RuntimeFault until control restarts it and rebuilds. The summary reports the faults injected and seen, and the turns
served, retried and abandoned; the output check covers every token served.

`--l3 file:DIR` (or `mooncake`, a cluster on loopback for the run, or
`mooncake:MASTER,METADATA_URL`, a running one) gives LocalGPURuntime an L3 store, and
`--host-mode buffer_only` makes its host pages staging only: control persists tree nodes
under content keys and fetches prefix hits from the store (the scheduler's docstring, L3), so
a second run against the store the first one filled serves from L3 as a restarted server
would; the summary counts `hit_tokens_l3`, `fetched_bytes` and `persisted_bytes`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import random
import sys
import time
from collections import Counter
from typing import Any

from cacheruntime.cliargs import input_file, output_file, positive_int
from cacheruntime.control.scheduler import MAX_STEP_CALLS, STEP_CALLS, Scheduler, Stats
from cacheruntime.control.tree import WritePolicy
from cacheruntime.control.workload import SyntheticConfig, read_trace, synthetic
from cacheruntime.protocol import ComputeFailed, FaultKind, TransferCompletion


def fault_rate(text: str) -> float:
    """A share of operations that fail: a number from 0 (none) to 1 (every one)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rate between 0 and 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a rate between 0 and 1, got {text}")
    return value


class FaultInjector:
    """A runtime seen through an injector that keeps one fault of each kind pending on it.

    Each pending fault picks the `nth` operation of its kind from the moment it is injected,
    `nth` drawn from the geometric distribution of rate P (seeded): the number of trials up
    to the first failure when each fails with probability P. When it is seen to have fired
    (a failed completion of its kind, or `ComputeFailed` raised by the injected runner
    error), the next one is drawn and injected. The geometric distribution is memoryless,
    so a fresh draw at any moment makes every operation from then on fail with
    probability P, independently: the operations between a copy's failure and its report
    (a poll later) are merely fault-free, so the realized transfer rate is a little under P.
    Re-arming on sight rather than pre-injecting every fault keeps one pending injection per
    kind, whatever the length of the run. A compute that fails because a restore it reads
    failed does not spend the pending compute fault (the runtime does not count it), hence
    the check of the error's cause. Each fault's site (spec/faults.md) is drawn too.
    """

    def __init__(self, runtime: Any, *, transfer_rate: float, compute_rate: float, lost_rate: float = 0.0, seed: int):
        from cacheruntime.runtime.device.layer import COMPUTE_FAULT_SITES, COPY_FAULT_SITES, InjectedFault

        self._runtime = runtime
        self._rng = random.Random(f"fault-injection/{seed}")
        self._rates = {FaultKind.BACKUP: transfer_rate, FaultKind.RESTORE: transfer_rate, FaultKind.COMPUTE: compute_rate, FaultKind.LOST: lost_rate}
        self._sites = {FaultKind.BACKUP: COPY_FAULT_SITES, FaultKind.RESTORE: COPY_FAULT_SITES, FaultKind.COMPUTE: COMPUTE_FAULT_SITES, FaultKind.LOST: (None,)}
        self._injected_error = InjectedFault
        self.fired: Counter[str] = Counter()  # faults that struck, by kind
        for kind in self._rates:
            self._arm(kind)

    def _arm(self, kind: FaultKind) -> None:
        rate = self._rates[kind]
        if rate == 0:
            return
        u = 1.0 - self._rng.random()  # in (0, 1]
        nth = 1 if rate == 1 else 1 + int(math.log(u) / math.log1p(-rate))
        self._runtime.inject_fault(kind, nth, site=self._rng.choice(self._sites[kind]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def execute_batch(self, batch: Any) -> Any:
        try:
            return self._runtime.execute_batch(batch)
        except ComputeFailed as failure:
            if isinstance(failure.__cause__, self._injected_error):
                self.fired[FaultKind.COMPUTE.value] += 1
                self._arm(FaultKind.COMPUTE)
            raise

    def restart(self) -> Any:
        """Control restarts the runtime on RuntimeFault, which on this CPU runtime only a LOST
        fault causes: it fired. The stream worker it killed took the pending count with it."""
        info = self._runtime.restart()
        if self._rates[FaultKind.LOST]:
            self.fired[FaultKind.LOST.value] += 1
            self._arm(FaultKind.LOST)
        return info

    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        return self._seen(self._runtime.poll_completions())

    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        return self._seen(self._runtime.wait_completions())

    def _seen(self, completions: tuple[TransferCompletion, ...]) -> tuple[TransferCompletion, ...]:
        for done in completions:
            if done.failure is not None:  # on this CPU runtime only an injected fault fails a copy
                kind = FaultKind(done.ticket.kind.value)
                self.fired[kind.value] += 1
                self._arm(kind)
        return completions


def l3_store(text: str) -> str:
    """An L3 store spec: `file:DIR` (a FileStore in DIR, created if missing), `mooncake` (a
    Mooncake cluster on loopback started for the run: its objects end with it), or
    `mooncake:MASTER,METADATA_URL` (a running cluster: its master's host:port and metadata URL)."""
    kind, _, where = text.partition(":")
    master, _, metadata = where.partition(",")
    if text != "mooncake" and not (kind == "file" and where) and not (kind == "mooncake" and master and metadata):
        raise argparse.ArgumentTypeError(f"expected file:DIR, mooncake or mooncake:MASTER,METADATA_URL, got {text!r}")
    return text


def _faulty(args: argparse.Namespace) -> bool:
    """Whether the run injects faults."""
    return args.transfer_fault_rate > 0 or args.compute_fault_rate > 0 or args.lost_fault_rate > 0


def _rss_kib() -> int | None:
    """This process's resident set size now (Linux /proc), for the soak's memory figures."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device of LocalGPURuntime (cpu, cuda, cuda:1, ...)")
    parser.add_argument(
        "--runtime",
        choices=("local", "process", "model"),
        default="local",
        help="LocalGPURuntime in this process, in a runtime process of its own (ProcessGPURuntime: control imports no torch), or the reference model",
    )
    parser.add_argument(
        "--runner", choices=("tiny", "llama-small"), default="tiny", help="LocalGPURuntime's model: the tiny decoder or the small Llama-architecture one"
    )
    parser.add_argument("--trace", type=input_file, metavar="FILE", help="replay a JSONL trace (docs/workload.md) instead of the synthetic workload")
    parser.add_argument("--requests", type=positive_int, default=36, help="synthetic: number of requests (turns)")
    parser.add_argument("--turns", type=positive_int, default=3, help="synthetic: turns per conversation")
    parser.add_argument("--new-tokens", type=int, nargs=2, default=(4, 10), metavar=("MIN", "MAX"), help="synthetic: tokens generated per turn")
    parser.add_argument("--seed", type=int, default=0, help="synthetic workload, model weights and fault injection")
    parser.add_argument("--page-size", type=positive_int, default=4, help="tokens per KV page")
    parser.add_argument("--l1-pages", type=positive_int, default=64, help="device pool pages (small, to force eviction to L2)")
    parser.add_argument("--l2-pages", type=positive_int, default=512, help="host pool pages")
    parser.add_argument("--max-requests", type=positive_int, default=4, help="request slots")
    parser.add_argument("--max-request-tokens", type=positive_int, default=256, help="tokens one request row can hold")
    parser.add_argument("--write-policy", choices=[p.value for p in WritePolicy], default=WritePolicy.WRITE_THROUGH.value)
    parser.add_argument("--max-prefill-tokens", type=positive_int, default=256, help="prompt tokens computed per batch")
    parser.add_argument(
        "--transfer-fault-rate", type=fault_rate, default=0.0, metavar="P", help="share of backups and restores made to fail (local or process runtime)"
    )
    parser.add_argument("--compute-fault-rate", type=fault_rate, default=0.0, metavar="P", help="share of computes made to fail (local or process runtime)")
    parser.add_argument(
        "--lost-fault-rate",
        type=fault_rate,
        default=0.0,
        metavar="P",
        help="share of transfer launches whose stream worker dies: RuntimeFault, control restarts the runtime (local or process runtime)",
    )
    parser.add_argument(
        "--l3",
        type=l3_store,
        metavar="file:DIR|mooncake[:MASTER,METADATA_URL]",
        help="an L3 store (local runtime): control persists published pages under content keys and fetches prefix hits from it; "
        "mooncake alone starts a Mooncake cluster on loopback for the run",
    )
    parser.add_argument(
        "--host-mode",
        choices=("resident", "buffer_only"),
        default="resident",
        help="host pages as an L2 cache tier (resident) or only as staging between the device and L3 (buffer_only, needs --l3)",
    )
    parser.add_argument("--json", type=output_file, metavar="PATH", help="write the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def local_runtime(device: str, runner: str, seed: int, l3: str | None = None, host_mode: str = "resident", **sizes: int):
    """The job's LocalGPURuntime: `runner`'s decoder (a preset fixes its own sizes: runtime/device/llama.py).

    Named by `--runtime process` as the factory its runtime process calls, so the decoder's
    configuration (torch) is built there, never in control.
    """
    from cacheruntime.runtime.device.runner import DecoderConfig
    from cacheruntime.runtime.factories import local

    if runner == "tiny":
        config = DecoderConfig()
    else:
        from cacheruntime.runtime.device.llama import LLAMA_CONFIGS

        config = LLAMA_CONFIGS[runner]
    return local(device=device, runner=runner, config=config, seed=seed, l3=l3, host_mode=host_mode, **sizes)


def _runtime(args: argparse.Namespace, l3: Any = None):
    sizes = dict(
        page_size=args.page_size,
        max_requests=args.max_requests,
        max_request_tokens=args.max_request_tokens,
        l1_pages=args.l1_pages,
        l2_pages=args.l2_pages,
    )
    if args.runtime == "model":
        from cacheruntime.model import ReferenceModel

        return ReferenceModel(**sizes), None
    options: dict[str, Any] = dict(device=args.device, runner=args.runner, seed=args.seed, **sizes)
    if args.l3 is not None:
        options.update(l3=l3 or args.l3, host_mode=args.host_mode)
    if args.runtime == "process":
        from cacheruntime.runtime.process import ProcessGPURuntime

        runtime = ProcessGPURuntime("cacheruntime.job:local_runtime", **options)
    else:
        runtime = local_runtime(**options)
    return runtime, runtime.info().vocab_size


def summary(stats: Stats, calls: dict[str, int], page_bytes: int, mismatches: int, check: str, seconds: float, faults: dict[str, Any] | None = None) -> dict:
    """The job's result: what was served, where prefixes came from, what crossed the boundary,
    and (`faults`: injected, turns, memory) what the faults did."""
    steps = max(stats.steps, 1)
    batch_calls = sum(n for op, n in calls.items() if op in STEP_CALLS)
    return {
        "requests": stats.requests,
        "turns_served": stats.turns_served,
        "turns_retried": stats.turns_retried,
        "retries": stats.retries,
        "turns_abandoned": stats.turns_abandoned,
        "turns_never_started": stats.turns_never_started,
        "tokens": stats.generated_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "computed_prompt_tokens": stats.computed_prompt_tokens,
        "hit_tokens_l1": stats.hit_tokens_l1,
        "hit_tokens_l2": stats.hit_tokens_l2,
        "hit_tokens_l3": stats.hit_tokens_l3,
        "miss_tokens": stats.computed_prompt_tokens,
        "restored_pages": stats.restored_pages,
        "backed_up_pages": stats.backed_up_pages,
        "restored_bytes": stats.restored_pages * page_bytes,
        "backed_up_bytes": stats.backed_up_pages * page_bytes,
        "fetched_bytes": stats.fetched_pages * page_bytes,
        "persisted_bytes": stats.persisted_pages * page_bytes,
        "batches": stats.batches,
        "steps": stats.steps,
        "boundary_calls_per_batch": max(stats.step_calls),
        "boundary_calls_per_batch_mean": round(batch_calls / steps, 3),
        "boundary_calls_per_batch_bound": MAX_STEP_CALLS,
        "boundary_calls_per_request": round(sum(n for op, n in calls.items() if op not in STEP_CALLS) / max(stats.requests, 1), 3),
        "boundary_calls": dict(sorted(calls.items())),
        "boundary_operations": sum(calls.values()),
        "out_of_pages_retries": stats.out_of_pages,
        "transfers": {"backups": stats.backups, "restores": stats.restores, "persists": stats.persists, "fetches": stats.fetches},
        "faults_seen": {
            "failed_backups": stats.failed_backups,
            "failed_restores": stats.failed_restores,
            "failed_persists": stats.failed_persists,
            "failed_fetches": stats.failed_fetches,
            "compute_failures": stats.compute_failures,
            "failed_batches": stats.failed_batches,
            "cancelled_batches": stats.cancelled_batches,
            "unresident_prepares": stats.unresident_prepares,
            "ladders_undone": stats.ladders_undone,
            "runtime_faults": stats.runtime_faults,
        },
        "recomputed_tokens": stats.recomputed_tokens,
        **(faults or {}),
        "output_check": check,
        "output_mismatches": mismatches,
        "seconds": round(seconds, 3),
    }


def main(args: argparse.Namespace) -> int:
    low, high = args.new_tokens
    if not 1 <= low <= high:
        print(f"cacheruntime run: error: argument --new-tokens: MIN must be at least 1 and MAX at least MIN, got {low} {high}", file=sys.stderr)
        return 2
    faulty = _faulty(args)
    if faulty and args.runtime == "model":
        print("cacheruntime run: --transfer-fault-rate, --compute-fault-rate and --lost-fault-rate need --runtime local or process", file=sys.stderr)
        return 2
    if (args.l3 is not None or args.host_mode != "resident") and args.runtime != "local":
        print("cacheruntime run: --l3 and --host-mode need --runtime local", file=sys.stderr)
        return 2
    if args.host_mode == "buffer_only" and args.l3 is None:
        print("cacheruntime run: --host-mode buffer_only stages between the device and L3: give --l3 file:DIR or --l3 mooncake", file=sys.stderr)
        return 2
    if args.l3 is not None and args.l3.startswith("mooncake") and importlib.util.find_spec("mooncake") is None:
        print("cacheruntime run: --l3 mooncake needs the [mooncake] extra: pip install 'cacheruntime[mooncake]'", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as cluster:
        store = None
        if args.l3 is not None and args.l3.startswith("mooncake"):
            from cacheruntime.storage.master import LocalMooncake
            from cacheruntime.storage.mooncake import MooncakeConfig, MooncakeStore

            master, _, metadata = args.l3.partition(":")[2].partition(",")
            config = MooncakeConfig(master_address=master, metadata_url=metadata) if master else cluster.enter_context(LocalMooncake()).config()
            store = MooncakeStore(config)
            cluster.callback(store.close)
        return _serve(args, _runtime(args, store))


def _serve(args: argparse.Namespace, built: tuple[Any, int | None]) -> int:
    """Serve the workload on the runtime `_runtime` built and print (and write) the summary."""
    runtime, vocab = built
    faulty = _faulty(args)
    source = (
        read_trace(args.trace)
        if args.trace
        else synthetic(SyntheticConfig(requests=args.requests, turns=args.turns, new_tokens=tuple(args.new_tokens), vocab=vocab or 97, seed=args.seed))
    )
    mismatches = 0
    if vocab is not None:
        check = "reference_next_token"

        def on_token(request_id: str, prefix: tuple[int, ...], token: int | None) -> None:
            nonlocal mismatches
            if max(prefix) >= vocab:
                raise ValueError(f"request {request_id}: token id {max(prefix)} is outside the model's vocabulary of {vocab}")
            if runtime.reference_next_token(list(prefix)) != token:
                mismatches += 1
                print(f"D1 mismatch: request {request_id} at position {len(prefix)}", file=sys.stderr)
    else:
        check = "model invariants after every step"
        on_token = None

    injector = (
        FaultInjector(runtime, transfer_rate=args.transfer_fault_rate, compute_rate=args.compute_fault_rate, lost_rate=args.lost_fault_rate, seed=args.seed)
        if faulty
        else None
    )
    scheduler = Scheduler(
        injector or runtime,
        source,
        write_policy=WritePolicy(args.write_policy),
        max_prefill_tokens=args.max_prefill_tokens,
        on_token=on_token,
    )
    started = time.perf_counter()
    rss_start = _rss_kib()  # torch, the model and the pools are loaded: what the run adds is the run's

    def on_step(s: Scheduler) -> None:
        nonlocal mismatches
        if vocab is None:  # the model: act as the hardware, then judge the state
            while runtime.completable():
                for transfer in runtime.completable():
                    runtime.complete_transfer(transfer)
            from cacheruntime.invariants import InvariantViolation

            try:
                runtime.check_invariants()
            except InvariantViolation as violation:
                mismatches += 1
                print(f"invariant {violation.invariant} violated: {violation}", file=sys.stderr)
        if not args.quiet and s.stats.steps % 10 == 0:
            st = s.stats
            print(
                f"step {st.steps:4d}  batches {st.batches:4d}  requests {st.requests:3d} (running {len(s.running)}, "
                f"waiting {len(s.waiting)})  tokens {st.generated_tokens:5d}  hits L1 {st.hit_tokens_l1} L2 {st.hit_tokens_l2}",
                flush=True,
            )

    try:
        stats = scheduler.run(on_step=on_step)
    finally:
        if hasattr(runtime, "close"):  # LocalGPURuntime's stream workers
            runtime.close()
    turns = getattr(source, "total", None)
    faults = {
        "transfer_fault_rate": args.transfer_fault_rate,
        "compute_fault_rate": args.compute_fault_rate,
        "lost_fault_rate": args.lost_fault_rate,
        "faults_injected": {kind.value: injector.fired[kind.value] if injector else 0 for kind in FaultKind},
        "turns": turns,
        "rss_kib_start": rss_start,
        "rss_kib_end": _rss_kib(),
    }
    messages = getattr(runtime, "messages", None)  # ProcessGPURuntime: request messages sent, per operation (B1)
    if messages is not None:
        faults["boundary_messages_per_batch_mean"] = round(sum(n for op, n in messages.items() if op in STEP_CALLS) / max(stats.steps, 1), 3)
        faults["boundary_messages"] = dict(sorted(messages.items()))
    result = summary(stats, dict(scheduler.runtime.calls), scheduler.info.page_bytes, mismatches, check, time.perf_counter() - started, faults)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(f"output check ({check}): {'ok' if mismatches == 0 else f'{mismatches} mismatches'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0 if mismatches == 0 else 1
