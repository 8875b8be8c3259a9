"""The process boundary's cost: the same runtime in this process and in a runtime process, side by side.

Per batch size B (`process_batches`): the host time of one decode step through the
boundary (`prepare_batch` + `execute_batch` + `poll_completions` of B one-token items on
rows holding `cpu_context` tokens), on `LocalGPURuntime` called in-process and on
`ProcessGPURuntime` driving the same runtime (same factory, same sizes, the bench's
`NullRunner`, so the time is bookkeeping plus, for the process, the messages); and once,
the round trip of the cheapest call (`poll_completions` with nothing in flight), which is
the link's fixed cost per call. Both sides run in alternating blocks (`cpucost.alternating`).

Then the essay's reason to split (`process_interference_batch`, default B = 16): a control
thread doing heavy CPU work alongside the step loop (prefix matching of waiting requests'
prompts on a tree of `TREE_SEQUENCES` cached sequences, `control.tree.TreeCore`) competes
with the runtime's host work for the interpreter in one process, but not across the
boundary. Per topology, the decode step's wall time with the matcher running against the
same steps without it (alternating blocks), and how many prefixes the matcher matched per
second meanwhile. This measures host time per step; the GPU's idle time between steps with
CUDA events is not measured here.

These rows carry no target. The issue's target (decode ITL with the real model, process over
local <= 1.03) and the GPU's idle time between steps with CUDA events, both ways, are the
rows of `benchmarks.processmodel`, which this section runs last.

Runs on CPU in CI-sized form and on CUDA unchanged (scripts/gpu_all.sh); the GPU machine
needs no wheels: the process runtime uses the standard library only.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from typing import Any

import torch

from benchmarks.cpucost import CALLS, alternating, timed_step
from benchmarks.harness import NullRunner, close_runtime, kv_config
from benchmarks.hooks import new_runtime
from benchmarks.report import Row
from cacheruntime.control.tree import TreeCore, WritePolicy
from cacheruntime.protocol import BatchItem, BatchPlan, CacheExtentRef, PageRun

SECTION = "process"
FACTORY = "benchmarks.processcost:null_runtime"
#: The control thread's tree in the interference rows: this many cached sequences of this many pages.
TREE_SEQUENCES, SEQUENCE_PAGES = 2000, 32
INTERFERENCE_BLOCKS = 3


def link_counts(process: Any) -> dict[str, int]:
    """A process runtime's messages sent, calls answered without one, and messages in short form, so far."""
    return {"messages": sum(process.messages.values()), "unsent": sum(process.unsent.values()), "short": sum(process.short.values())}


def null_runtime(device: str, seed: int, **sizes: Any) -> Any:
    """The bench's bookkeeping-only runtime (tiny KV, `NullRunner`); the runtime process calls it too."""
    return new_runtime(kv_config(None, tiny=True), torch.device(device), seed=seed, runner=NullRunner(torch.device(device)), **sizes)


def _both(args: Any, device: torch.device, **sizes: Any) -> dict[str, Any]:
    from cacheruntime.runtime.process import ProcessGPURuntime

    local = null_runtime(str(device), args.seed, **sizes)
    try:
        process = ProcessGPURuntime(FACTORY, device=str(device), seed=args.seed, **sizes)
    except BaseException:
        close_runtime(local)
        raise
    return {"process": process, "local": local}


def _close(runtimes: dict[str, Any]) -> None:
    runtimes["process"].close()
    close_runtime(runtimes["local"])


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    ps = args.cpu_page_size
    total = args.cpu_context + args.cpu_warmup + args.cpu_steps
    for batch in args.process_batches:
        with guard(SECTION, f"B={batch}"):
            max_tokens = -(-total // ps) * ps + ps
            pages = batch * (max_tokens // ps) + 8
            runtimes = _both(args, device, page_size=ps, max_requests=batch, max_request_tokens=max_tokens, l1_pages=pages, l2_pages=0)
            try:
                steps, splits = {}, {}
                for name, rt in runtimes.items():
                    requests = [rt.open_request() for _ in range(batch)]
                    if args.cpu_context:
                        rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * args.cpu_context) for r in requests))))
                    splits[name] = dict.fromkeys(CALLS, 0.0)
                    steps[name] = functools.partial(timed_step, rt, BatchPlan(tuple(BatchItem(r, (1,)) for r in requests)), splits[name])
                    for _ in range(args.cpu_warmup):
                        steps[name]()
                    splits[name].update(dict.fromkeys(CALLS, 0.0))
                process = runtimes["process"]
                sent = link_counts(process)
                timed = alternating(steps, args.cpu_steps)
                messages, unsent, short = ((v - sent[k]) / args.cpu_steps for k, v in link_counts(process).items())
                rows.append(
                    Row(
                        SECTION,
                        f"host time per decode step B={batch}, process runtime (prepare+execute+poll)",
                        "us",
                        timed["process"]["seconds"] * 1e6,
                        timed["local"]["seconds"] * 1e6,
                        "LocalGPURuntime in-process",
                        detail={
                            "batch": batch,
                            "page_size": ps,
                            "steps": args.cpu_steps,
                            "context": args.cpu_context,
                            "messages_per_step": messages,
                            "calls_without_message_per_step": unsent,  # polls that must report nothing (client.py)
                            "short_messages_per_step": short,  # the accepted plan again, its completion as tokens (client.py)
                            "per_call_us": {name: {k: v / args.cpu_steps * 1e6 for k, v in split.items()} for name, split in splits.items()},
                            "block_means_us": {name: [round(m * 1e6, 2) for m in side["block_means"]] for name, side in timed.items()},
                        },
                    )
                )
                if batch == args.process_batches[0]:
                    # After execute_batch the process runtime answers polls itself (nothing in flight:
                    # client.py); any other call's reply ends that, so each poll below crosses.
                    runtimes["process"].wait_completions()
                    round_trip = {name: _mean_seconds(rt.poll_completions, args.cpu_steps) for name, rt in runtimes.items()}
                    rows.append(
                        Row(
                            SECTION,
                            "round trip of one call (poll_completions, nothing in flight)",
                            "us",
                            round_trip["process"] * 1e6,
                            round_trip["local"] * 1e6,
                            "LocalGPURuntime in-process",
                            detail={"calls": args.cpu_steps},
                        )
                    )
            finally:
                _close(runtimes)
    interference(args, device, rows, guard)
    from benchmarks import processmodel  # it imports Matcher from here

    processmodel.run(args, device, rows, guard)


class Matcher(threading.Thread):
    """Control's heavy CPU work: match every waiting prompt against the prefix tree, again and again."""

    def __init__(self, page_size: int, seed: int):
        super().__init__(daemon=True)
        rng = random.Random(seed)
        self.tree = TreeCore(None, page_size=page_size, l2_pages=0, write_policy=WritePolicy.WRITE_BACK)  # type: ignore[arg-type]  # never calls it
        self.prompts = []
        for g in range(TREE_SEQUENCES):
            tokens = (g, *(rng.randrange(32000) for _ in range(SEQUENCE_PAGES * page_size - 1)))  # distinct first tokens: no split
            self.tree.insert(tokens, 0, CacheExtentRef("control", 0, g + 1, (PageRun(g * SEQUENCE_PAGES, SEQUENCE_PAGES),)))
            self.prompts.append(tokens + (1,) * page_size)  # a next turn: the cached prefix and a page of new tokens
        self.running = threading.Event()
        self.stopped = False
        self.matched = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        """Match until stopped; a failure is re-raised by `check` (a thread's exception is otherwise lost)."""
        try:
            self._match()
        except BaseException as error:
            self.error = error

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the control thread's matching failed: {self.error!r}") from self.error

    def _match(self) -> None:
        while not self.stopped:
            self.running.wait()
            for prompt in self.prompts:
                if not self.running.is_set():
                    break
                self.tree.match_prefix(prompt)
                self.matched += 1


def interference(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    """Decode steps with and without a control thread matching prefixes, in each topology."""
    batch, ps = args.process_interference_batch, args.cpu_page_size
    with guard(SECTION, f"interference B={batch}"):
        total = args.cpu_context + args.cpu_warmup + 2 * args.cpu_steps
        max_tokens = -(-total // ps) * ps + ps
        pages = batch * (max_tokens // ps) + 8
        runtimes = _both(args, device, page_size=ps, max_requests=batch, max_request_tokens=max_tokens, l1_pages=pages, l2_pages=0)
        matcher = Matcher(ps, args.seed)
        matcher.start()
        try:
            for name, rt in runtimes.items():
                requests = [rt.open_request() for _ in range(batch)]
                if args.cpu_context:
                    rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * args.cpu_context) for r in requests))))
                plan = BatchPlan(tuple(BatchItem(r, (1,)) for r in requests))
                split = dict.fromkeys(CALLS, 0.0)
                step = functools.partial(timed_step, rt, plan, split)
                for _ in range(args.cpu_warmup):
                    step()
                seconds = {"quiet": 0.0, "busy": 0.0}
                matched = 0
                per_block = max(1, args.cpu_steps // INTERFERENCE_BLOCKS)
                for _ in range(INTERFERENCE_BLOCKS):
                    seconds["quiet"] += _mean_seconds(step, per_block)
                    before = matcher.matched
                    matcher.running.set()
                    # the thread must be matching when the window opens, not still waking up (on a
                    # loaded machine a short window could otherwise close before it ran at all)
                    while matcher.matched == before:
                        matcher.check()
                        time.sleep(0.0005)
                    busy = _mean_seconds(step, per_block)
                    matcher.running.clear()
                    seconds["busy"] += busy
                    matched += matcher.matched - before
                matcher.check()
                quiet, busy = seconds["quiet"] / INTERFERENCE_BLOCKS, seconds["busy"] / INTERFERENCE_BLOCKS
                rows.append(
                    Row(
                        SECTION,
                        f"decode step B={batch} while a control thread matches prefixes, {name} runtime",
                        "us",
                        busy * 1e6,
                        quiet * 1e6,
                        f"the same steps without it ({name})",
                        detail={
                            "batch": batch,
                            "steps": per_block * INTERFERENCE_BLOCKS,
                            "tree_sequences": TREE_SEQUENCES,
                            "sequence_pages": SEQUENCE_PAGES,
                            "prefixes_matched_per_s": matched / (busy * per_block * INTERFERENCE_BLOCKS),
                        },
                    )
                )
        finally:
            matcher.stopped = True
            matcher.running.set()
            matcher.join()
            _close(runtimes)


def _mean_seconds(call: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls
