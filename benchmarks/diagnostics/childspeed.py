"""Whether the same Python runs slower in a runtime process than in control, and why: a diagnostic.

On the H200 host the runtime process ran every part of a decode step about twice as long as
the same part in-process (`processgap`: the ledger's prepare 24 against 49 us, the model's
launch 140 against 283), with control asleep or spinning alike. This times two workloads,
on an otherwise quiet host (then beside a process busy-polling a socket, as a waiting client does), in this process and in a child started each way
`multiprocessing` can (the fork server preloaded as `ProcessGPURuntime`'s is, a plain fork,
a fresh interpreter), and prints each one's median microseconds and the minor page faults
taken while timing (copy-on-write faults of memory shared with its parent would show there):

- loop: a fixed pure-Python loop;
- prepare: the bench's null runtime (CPU, bookkeeping only) preparing a decode plan of B one-token
  requests and cancelling it, the ledger's work in a decode step's `prepare_batch`.

    PYTHONPATH=src:. python3 -m benchmarks.diagnostics.childspeed --batch 16 --calls 2000 [--cuda]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import select
import socket
import statistics
import time
from pathlib import Path
from typing import Any


def _loop() -> None:
    total = 0
    for i in range(2000):
        total += i & 7


def _prepare_workload(batch: int) -> Any:
    from benchmarks.processcost import null_runtime
    from cacheruntime.protocol import BatchItem, BatchPlan

    rt = null_runtime("cpu", 0, page_size=16, max_requests=batch, max_request_tokens=64, l1_pages=batch * 4 + 8, l2_pages=0)
    plan = BatchPlan(tuple(BatchItem(rt.open_request(), (1,)) for _ in range(batch)))

    def step() -> None:
        rt.cancel_batch(rt.prepare_batch(plan))

    return step


def measure(batch: int, calls: int, cuda: bool) -> dict[str, tuple[float, int]]:
    """Each workload's median microseconds per call and the minor faults while timing it
    (with `cuda`, after this process made its CUDA context and ran a kernel, as a runtime process has)."""
    if cuda:
        import torch

        torch.ones(1, device="cuda").add_(1).item()
    out = {}
    for name, fn in (("loop", _loop), ("prepare", _prepare_workload(batch))):
        for _ in range(200):
            fn()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = (statistics.median(times) * 1e6, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    return out


def _spin(sock: Any) -> None:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    while not poller.poll(0):
        pass


def _child(queue: Any, batch: int, calls: int, cuda: bool) -> None:
    queue.put(measure(batch, calls, cuda))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cuda", action="store_true", help="each process makes a CUDA context first (this one after its children)")
    args = parser.parse_args()
    import torch  # noqa: F401  (control of the bench has torch loaded: the parent of a plain fork)

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"# cpus {os.cpu_count()}, transparent huge pages: {thp.read_text().strip() if thp.exists() else '?'}", flush=True)
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["cacheruntime.runtime.process.server", "benchmarks.processcost"])
    for round_ in range(2 * args.rounds):
        spinner, ours, theirs = None, *socket.socketpair()
        if round_ >= args.rounds:  # a process busy-polling a socket throughout, as the client waits for a reply
            spinner = multiprocessing.get_context("fork").Process(target=_spin, args=(theirs,))
            spinner.start()
        results = {}
        contexts = [
            ("fork server child", forkserver),
            ("fork child", multiprocessing.get_context("fork")),
            ("spawn child", multiprocessing.get_context("spawn")),
        ]
        for name, context in contexts[::2] if args.cuda else contexts:  # a plain fork of a CUDA process cannot use CUDA
            queue = context.Queue()
            child = context.Process(target=_child, args=(queue, args.batch, args.calls, args.cuda))
            child.start()
            results[name] = queue.get()
            child.join()
        results["this process"] = measure(args.batch, args.calls, args.cuda)
        if spinner is not None:
            ours.send(b"x")
            spinner.join()
        ours.close()
        theirs.close()
        for name, figures in results.items():
            print(
                f"round {round_}{' spinner' if spinner else ''} {name:18}: "
                + ", ".join(f"{w} {us:.1f} us ({faults} faults)" for w, (us, faults) in figures.items()),
                flush=True,
            )


if __name__ == "__main__":
    main()
