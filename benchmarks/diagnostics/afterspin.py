"""What waiting costs the code that runs next: a decode step's client work timed after each way of waiting, a diagnostic.

On the H200 host the client's share of a decode step (encoding a 60-byte request, rebuilding
a completion of 16 items) took several times what the same calls take in a loop. Between
two steps the client waits about 7 ms for the runtime process, busy-polling the socket
with `poll(0)`, a system call each time round. This times the client's calls of one step
(`wire.dumps` of a short prepare, `wire.loads` and `wire.completion_of_plan` of a short
completion), in microseconds, median over `--rounds`, right after each way of waiting
`--wait-us`:

- none: the calls back to back (warm);
- poll: busy-polling a socket with `select.poll().poll(0)` (the client's spin today);
- memory: busy-reading a byte of shared memory, no system call;
- sleep: asleep in the kernel (`time.sleep`).

    PYTHONPATH=src:. python3 -m benchmarks.diagnostics.afterspin --batch 16 --wait-us 7000
"""

from __future__ import annotations

import argparse
import mmap
import select
import socket
import statistics
import time
from typing import Any


def _client_calls(batch: int) -> Any:
    from cacheruntime.protocol import BatchCompletion, ItemResult, PreparedBatchHandle, RequestRuntimeHandle
    from cacheruntime.runtime.process import wire

    requests = [RequestRuntimeHandle("rt", 0, slot, 0) for slot in range(batch)]
    completion = BatchCompletion(PreparedBatchHandle("rt", 0, 1), tuple(ItemResult(r, 1, 7) for r in requests), (), ())
    reply = wire.dumps((wire.ON_PLAN, wire.completion_on_plan(completion, requests), True))

    def calls() -> None:
        wire.dumps((wire.PREPARE_AGAIN, ((),), {}, 1))
        wire.completion_of_plan(wire.loads(reply)[1], requests)

    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--wait-us", type=float, default=7000)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    calls = _client_calls(args.batch)
    ours, theirs = socket.socketpair()
    poller = select.poll()
    poller.register(ours.fileno(), select.POLLIN)
    flag = mmap.mmap(-1, mmap.PAGESIZE)
    wait_s = args.wait_us / 1e6

    def poll() -> None:
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline:
            poller.poll(0)

    def memory() -> None:
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline:
            flag[0]

    def warm(every_s: float) -> None:
        deadline = time.perf_counter() + wait_s
        due = time.perf_counter()
        while (now := time.perf_counter()) < deadline:
            poller.poll(0)
            if now >= due:
                calls()
                due = now + every_s

    waits = {
        "none": lambda: None,
        "poll": poll,
        "memory": memory,
        "sleep": lambda: time.sleep(wait_s),
        "warm 100": lambda: warm(100e-6),
        "warm 500": lambda: warm(500e-6),
    }
    times: dict[str, list[float]] = {name: [] for name in waits}
    for _ in range(args.rounds):
        for name, wait in waits.items():
            wait()
            t = time.perf_counter()
            calls()
            times[name].append(time.perf_counter() - t)
    print(f"client calls of one decode step, B={args.batch}, after waiting {args.wait_us:.0f} us, median of {args.rounds}:")
    for name, values in times.items():
        print(f"  {name:7} {statistics.median(values) * 1e6:8.1f} us   (p90 {statistics.quantiles(values, n=10)[-1] * 1e6:.1f})")
    theirs.close()


if __name__ == "__main__":
    main()
