"""Where the process runtime's extra host time per decode step goes, on the real model: a diagnostic, not a row.

The `process` section's decode loop (the Llama runner, B rows of `--context` tokens, prepare +
execute + poll per step) runs on `LocalGPURuntime` in-process and on `ProcessGPURuntime`
(once per `--spin-us` value), one after the other. Every boundary operation and every runner
forward is stamped with `time.perf_counter_ns()` where it runs; on Linux that is
CLOCK_MONOTONIC, one clock for both processes, so a call's stamps in control and in the runtime
process can be subtracted. Printed per configuration, the mean microseconds per step of:

- step: one whole step in control; <op> client: the call as control sees it;
- <op> op: the operation itself where it runs; <op> replayed poll: the polls the client answered
  without a message, made by the runtime process before the operation (`client.py`);
- <op> c.dumps, c.loads, s.dumps, s.loads: encoding and decoding in control (c) and in the
  runtime process (s); c.send, c.recv, s.send, s.recv: writing and reading a message
  (`link.py`); c.c_of_plan, s.c_on_plan, c.immutable_items: the short forms' rebuilding,
  taking apart and check (`wire.py`); <op> gc: the collector's pauses inside the call, in either process;
  execute c.warm: the client's warm-ups while it waits (`client.py`, `_warm`), beside the
  runtime process's work and so, like gc, not a part;
- <op> rest: the call less all of the above but gc: each side noticing the other's message,
  the socket's crossing, and each side's code around the parts;
- pre-fwd: execute's start to the runner's forward call; fwd-call: the forward call's host time
  (launching the model); post-fwd: the forward's return to execute's end (the wait for the GPU,
  reading the tokens, committing).

    PYTHONPATH=src python3 -m benchmarks.diagnostics.processgap --batches 16,64 --spin-us 0,1000,20000
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

OPERATIONS = ("prepare_batch", "execute_batch", "poll_completions")
FACTORY = "benchmarks.diagnostics.processgap:stamped_runtime"


class StampedRunner:
    """The runner it wraps, with each forward's host call stamped (start, end) in `stamps`."""

    def __init__(self, inner: Any, stamps: list[tuple[str, int, int]]):
        self.inner, self.stamps = inner, stamps

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, *args: Any) -> Any:
        t = time.perf_counter_ns()
        out = self.inner.forward(*args)
        self.stamps.append(("forward", t, time.perf_counter_ns()))
        return out


def stamp_operations(target: Any, stamps: list[tuple[str, int, int]]) -> None:
    """Replace `target`'s decode-step operations by ones that stamp each call into `stamps`."""
    for name in OPERATIONS:
        fn = getattr(target, name)

        def call(*args: Any, _fn: Any = fn, _name: str = name) -> Any:
            t = time.perf_counter_ns()
            try:
                return _fn(*args)
            finally:
                stamps.append((_name, t, time.perf_counter_ns()))

        setattr(target, name, call)


#: What `StampedWire` stamps: the coding, and the short forms' taking apart and rebuilding.
WIRE_STAMPED = ("dumps_request", "loads_request", "dumps_reply", "loads_reply", "completion_on_plan", "completion_of_plan", "immutable_items")


class StampedWire:
    """A process's `wire` module with the functions `WIRE_STAMPED` stamped as `<side>.<name>`."""

    def __init__(self, wire: Any, stamps: list[tuple[str, int, int]], side: str):
        self._wire, self._stamps, self._side = wire, stamps, side
        for name in WIRE_STAMPED:
            setattr(self, name, self._stamped(name))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wire, name)

    def _stamped(self, name: str) -> Any:
        short = name.partition("_")[0] if name.startswith(("dumps", "loads")) else name.replace("completion_", "c_")
        fn, key = getattr(self._wire, name), f"{self._side}.{short}"

        def call(*args: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                self._stamps.append((key, t, time.perf_counter_ns()))

        return call


def stamp_link(stamps: list[tuple[str, int, int]], side: str) -> None:
    """Stamp this process's `Link.send` and `Link.recv` as `<side>.send`/`<side>.recv` (the system calls and framing)."""
    from cacheruntime.runtime.process.link import Link

    for name in ("send", "recv"):
        fn = getattr(Link, name)

        def call(self: Any, *args: Any, _fn: Any = fn, _key: str = f"{side}.{name}") -> Any:
            t = time.perf_counter_ns()
            try:
                return _fn(self, *args)
            finally:
                stamps.append((_key, t, time.perf_counter_ns()))

        setattr(Link, name, call)


def stamp_collections(stamps: list[tuple[str, int, int]]) -> Any:
    """Stamp each of this process's garbage collections as `gc`; returns the callback (to remove it)."""
    started = [0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
        else:
            stamps.append(("gc", started[0], time.perf_counter_ns()))

    gc.callbacks.append(callback)
    return callback


def stamped_runtime(stamps_path: str, in_runtime_process: bool = False, **options: Any) -> Any:
    """The `process` section's Llama runtime with its operations and forwards stamped; the stamps
    are written to `stamps_path` at close (the runtime process has no other way out)."""
    from benchmarks.processmodel import llama_runtime

    stamps: list[tuple[str, int, int]] = []
    runtime = llama_runtime(**options)
    runtime.device_layer.runner = StampedRunner(runtime.device_layer.runner, stamps)
    stamp_operations(runtime, stamps)
    if in_runtime_process:  # the runtime process's side of the link, and its collector
        from cacheruntime.runtime.process import server

        server.wire = StampedWire(server.wire, stamps, "s")  # type: ignore[attr-defined]
        stamp_link(stamps, "s")
        stamp_collections(stamps)
    close = runtime.close

    def close_and_write() -> None:
        Path(stamps_path).write_text(json.dumps(stamps))
        close()

    runtime.close = close_and_write
    return runtime


def sleeping_client(base: Any, margin_us: float) -> Any:
    """`base` (ProcessGPURuntime) whose `execute_batch` sleeps in the kernel until `margin_us`
    before the fastest of its last 8 replies is due, then waits as `base` does."""

    class SleepingExecute(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any):
            self.recent: list[float] = []
            self.sleep_s = 0.0
            super().__init__(*args, **kwargs)

        def execute_batch(self, batch: Any) -> Any:
            t = time.perf_counter()
            self.sleep_s = max(0.0, min(self.recent) - margin_us / 1e6) if len(self.recent) >= 8 else 0.0
            try:
                return super().execute_batch(batch)
            finally:
                self.sleep_s = 0.0
                self.recent = [*self.recent[-7:], time.perf_counter() - t]

        def _wait_reply(self, timeout_s: float | None) -> Any:
            if self.sleep_s:
                ready = self._poller.poll(self.sleep_s * 1e3)
                if ready:
                    return ready
            return super()._wait_reply(timeout_s)

    return SleepingExecute


def stamp_warming(rt: Any, stamps: list[tuple[str, int, int]], client_module: Any, wire: Any) -> None:
    """Stamp the client's warm-ups (`client.py`, `_warm`) as `c.warm`, their own calls unstamped:
    they run while the runtime process computes, not on the step's path."""
    warm, stamped = rt._warm, client_module.wire

    def call() -> None:
        client_module.wire = wire
        t = time.perf_counter_ns()
        try:
            warm()
        finally:
            stamps.append(("c.warm", t, time.perf_counter_ns()))
            client_module.wire = stamped

    rt._warm = call


def machine() -> str:
    """What decides a sleeping thread's wake-up: CPUs, governor, idle states and their exit latencies."""
    import torch

    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "?"

    states = []
    for state in sorted(Path("/sys/devices/system/cpu/cpu0/cpuidle").glob("state*")):
        states.append(f"{read(str(state / 'name'))}:{read(str(state / 'latency'))}us")
    return (
        f"cpus {os.cpu_count()}, affinity {len(os.sched_getaffinity(0))}, torch threads {torch.get_num_threads()}, "
        f"governor {read('/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor')}, "
        f"idle driver {read('/sys/devices/system/cpu/cpuidle/current_driver')}, idle states {' '.join(states) or '?'}"
    )


def run_steps(rt: Any, batch: int, context: int, warmup: int, steps: int, control: list[tuple[str, int, int]], frozen: bool = False) -> None:
    """Fill `batch` rows of `context` tokens, then `warmup` + `steps` decode steps; the last `steps` stamped in `control`
    (with `frozen`, control's heap collected and frozen before them)."""
    from benchmarks.harness import steady_gc
    from cacheruntime.protocol import BatchItem, BatchPlan

    requests = [rt.open_request() for _ in range(batch)]
    for i in range(0, batch, 8):
        rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * context) for r in requests[i : i + 8]))))
    plan = BatchPlan(tuple(BatchItem(r, (1,)) for r in requests))
    for _ in range(warmup):
        rt.execute_batch(rt.prepare_batch(plan))
        rt.poll_completions()
    with steady_gc() if frozen else contextlib.nullcontext():  # as the bench's windows run
        for _ in range(steps):
            t = time.perf_counter_ns()
            handle = rt.prepare_batch(plan)
            t1 = time.perf_counter_ns()
            rt.execute_batch(handle)
            t2 = time.perf_counter_ns()
            rt.poll_completions()
            t3 = time.perf_counter_ns()
            control += [("step", t, t3), ("prepare_batch", t, t1), ("execute_batch", t1, t2), ("poll_completions", t2, t3)]


def split(control: list[tuple[str, int, int]], stamps: list[tuple[str, int, int]], steps: int) -> dict[str, float]:
    """Mean microseconds per step of each part (the module's docstring): every stamp, in either
    process, that lies inside a control call counts for that call."""
    sums: dict[str, float] = {}

    def add(key: str, ns: int) -> None:
        sums[key] = sums.get(key, 0.0) + ns / 1e3 / steps

    stamps = sorted(stamps, key=lambda s: s[1])
    for name, start, end in control:
        if name == "step":
            add("step", end - start)
            continue
        short = name[:7]
        add(f"{short} client", end - start)
        parts = 0
        for kind, s0, s1 in (s for s in stamps if start <= s[1] and s[2] <= end):
            if kind == "forward":
                continue
            key = "op" if kind == name else "replayed poll" if kind == "poll_completions" else kind
            add(f"{short} {key}", s1 - s0)
            parts += 0 if kind in ("gc", "c.warm") else s1 - s0
        add(f"{short} rest", end - start - parts)
        if name == "execute_batch":
            ops = [s for s in stamps if s[0] == name and start <= s[1] and s[2] <= end]
            forwards = [s for s in stamps if s[0] == "forward" and start <= s[1] and s[2] <= end]
            if ops and forwards:
                (_, os_, oe), (_, fs, fe) = ops[0], forwards[0]
                add("pre-fwd", fs - os_)
                add("fwd-call", fe - fs)
                add("post-fwd", oe - fe)
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", default="llama3-8b")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--spin-us", default="0,1000,20000", help="spin windows (us) of the process runs")
    parser.add_argument("--steady-gc", action="store_true", help="collect and freeze control's heap before the timed steps, as the bench does")
    parser.add_argument("--keep-local", action="store_true", help="keep the local runtime open while the process runtimes run (the bench holds all at once)")
    parser.add_argument("--page-size", type=int, default=128, help="128 on CUDA: the compiled attention kernel's page")
    parser.add_argument(
        "--sleep-execute-us",
        default="",
        help="also run each spin window with the client asleep in the kernel through an execute_batch, until this many us before "
        "the fastest of the last 8 replies, then spinning (a spinning client may slow the runtime process's core)",
    )
    args = parser.parse_args()
    from benchmarks.harness import close_runtime
    from cacheruntime.runtime.process import ProcessGPURuntime, wire
    from cacheruntime.runtime.process import client as client_module

    print(f"# {machine()}", flush=True)
    control_link: list[tuple[str, int, int]] = []  # this process's link stamps, taken by the process runs
    stamp_link(control_link, "c")
    workdir = Path(tempfile.mkdtemp(prefix="cacheruntime-processgap-"))
    for batch in (int(b) for b in args.batches.split(",")):
        page = args.page_size
        max_tokens = -(-(args.context + args.warmup + args.steps + 1) // page) * page + page
        options = dict(
            device=args.device,
            seed=0,
            config_name=args.config,
            page_size=page,
            max_requests=batch,
            max_request_tokens=max_tokens,
            l1_pages=batch * (max_tokens // page) + 2,
            l2_pages=0,
        )
        results: dict[str, dict[str, float]] = {}
        held: Any = None
        labels = [f"process spin {s} us" for s in args.spin_us.split(",")]
        labels += [f"{label} sleep {margin}" for label in labels for margin in args.sleep_execute_us.split(",") if margin]
        for label in ["local", *labels]:
            path = str(workdir / f"stamps-B{batch}-{len(results)}.json")
            control: list[tuple[str, int, int]] = []
            mine: list[tuple[str, int, int]] = []  # this process's own stamps: its collector, its side of the link
            collections = stamp_collections(mine)
            if label == "local":
                rt = stamped_runtime(path, **options)
                run_steps(rt, batch, args.context, args.warmup, args.steps, control, args.steady_gc)
                if args.keep_local:  # alive (its model, its CUDA context) while the process runtimes run, as in the bench
                    held = (rt, path, control, mine)
                    gc.callbacks.remove(collections)
                    results[label] = {}
                    continue
                close_runtime(rt)
            else:
                client_module.wire = StampedWire(wire, mine, "c")  # type: ignore[attr-defined]
                spin = float(label.split()[2])
                kind = ProcessGPURuntime if "sleep" not in label else sleeping_client(ProcessGPURuntime, float(label.split()[-1]))
                rt = kind(FACTORY, spin_us=spin, stamps_path=path, in_runtime_process=True, **options)
                stamp_warming(rt, mine, client_module, wire)
                run_steps(rt, batch, args.context, args.warmup, args.steps, control, args.steady_gc)
                rt.close()
                client_module.wire = wire  # type: ignore[attr-defined]
                mine += control_link
            control_link.clear()
            gc.callbacks.remove(collections)
            results[label] = split(control, json.loads(Path(path).read_text()) + mine, args.steps)
            print(f"B={batch} {label}: " + json.dumps({k: round(v, 1) for k, v in results[label].items()}), flush=True)
        if args.keep_local:
            close_runtime(held[0])
            results["local"] = split(held[2], json.loads(Path(held[1]).read_text()) + held[3], args.steps)
        keys = list(results["local"]) + [k for r in results.values() for k in r if k not in results["local"]]
        keys = list(dict.fromkeys(keys))
        print(f"B={batch}, mean us per step over {args.steps} steps:")
        width = max(14, *(len(label) - 6 for label in results))
        print("  " + "part".ljust(22) + "".join(label.replace("process spin ", "spin ").rjust(width) for label in results))
        for key in keys:
            print("  " + key.ljust(22) + "".join(f"{results[label].get(key, float('nan')):{width}.1f}" for label in results))
        print(flush=True)


if __name__ == "__main__":
    main()
