"""Whether a busy-polling process slows another process's Python on this host, per pair of CPUs: a diagnostic.

A host may present each CPU as a core of its own (`lscpu`: one thread a core) while a
hypervisor runs two of them on one physical core's hardware threads; a process spinning on
one then slows whatever runs on the other. The process runtime's client spins while the
runtime process launches the model, so this decides whether that spin costs the runtime
process host time. Printed: for each probe CPU, the time of a fixed Python workload pinned
there alone, then with a spinning process pinned to each other CPU, as a ratio to alone.

    python3 -m benchmarks.diagnostics.cpusiblings --probes 0,1 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from multiprocessing import get_context


def _spin(cpu: int, stop: float) -> None:
    os.sched_setaffinity(0, {cpu})
    while time.monotonic() < stop:
        pass


def _work(loops: int) -> float:
    start = time.perf_counter()
    total = 0
    for i in range(loops):
        total += i & 7
    return time.perf_counter() - start


def timed(cpu: int, loops: int, repeats: int) -> float:
    """The median time of `_work(loops)` pinned to `cpu`."""
    os.sched_setaffinity(0, {cpu})
    return statistics.median(_work(loops) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", default="0", help="CPUs to time the workload on")
    parser.add_argument("--loops", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# cpus {cpus}", flush=True)
    context = get_context("fork")
    for probe in (int(p) for p in args.probes.split(",")):
        timed(probe, args.loops, 1)  # warm
        alone = timed(probe, args.loops, args.repeats)
        ratios = {}
        for other in (c for c in cpus if c != probe):
            spinner = context.Process(target=_spin, args=(other, time.monotonic() + 60))
            spinner.start()
            time.sleep(0.02)
            ratios[other] = timed(probe, args.loops, args.repeats) / alone
            spinner.kill()
            spinner.join()
        print(f"probe cpu {probe}: alone {alone * 1e3:.1f} ms; with a spinner on cpu: " + " ".join(f"{c}:{r:.2f}" for c, r in ratios.items()), flush=True)
    os.sched_setaffinity(0, set(cpus))


if __name__ == "__main__":
    main()
