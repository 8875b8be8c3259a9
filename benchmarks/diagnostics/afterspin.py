"""What waiting costs the code that runs next: a decode step's client work timed after each way of waiting, a diagnostic.

On the H200 host the client's share of a decode step (encoding a 60-byte request, rebuilding
a completion of 16 items) took several times what the same calls take in a loop. Between
two steps the client waits about 7 ms for the runtime process. This times control's codings
of one step's four messages (a short prepare and an execute encoded, the handle and a short
completion decoded and rebuilt), pickled and in the step's layouts (`wire.py`), in
microseconds, median over `--rounds`, right after each way of waiting `--wait-us`:

- none: the calls run twice back to back, the second timed (warm);
- poll: busy-polling a socket with `select.poll().poll(0)` (the client's spin today);
- memory: busy-reading a byte of shared memory, no system call;
- sleep: asleep in the kernel (`time.sleep`);
- warm 100, warm 500: busy-polling, running the laid-out calls every 100 or 500 us meanwhile
  (what a spinning client does while it waits for an `execute_batch`: `client.py`, `_warm`).

Only the laid-out calls are warmed by the warming waits, as the client warms them.

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


def _client_calls(batch: int, laid_out: bool) -> Any:
    """Control's calls of one decode step's messages: pickled (`wire.dumps`/`wire.loads`, as before
    the layouts) or in the step's layouts (`wire.dumps_request`/`wire.loads_reply`, as the client runs them)."""
    from cacheruntime.protocol import BatchCompletion, ItemResult, PreparedBatchHandle, RequestRuntimeHandle
    from cacheruntime.runtime.process import wire

    requests = [RequestRuntimeHandle("rt", 0, slot, 0) for slot in range(batch)]
    batch_handle = PreparedBatchHandle("rt", 0, 1)
    completion = BatchCompletion(batch_handle, tuple(ItemResult(r, 1, 7) for r in requests), (), ())
    reply = (wire.ON_PLAN, wire.completion_on_plan(completion, requests), True)
    if laid_out:
        handle_bytes, reply_bytes = wire.dumps_reply((wire.OK, batch_handle)), wire.dumps_reply(reply)

        def calls() -> None:
            wire.dumps_request(wire.PREPARE_AGAIN, ((),), {}, 1)
            wire.loads_reply(handle_bytes)
            wire.dumps_request("execute_batch", (batch_handle,), {}, 0)
            wire.completion_of_plan(wire.loads_reply(reply_bytes)[1], requests)

        return calls
    handle_bytes, reply_bytes = wire.dumps((wire.OK, batch_handle)), wire.dumps(reply)

    def pickled() -> None:
        wire.dumps((wire.PREPARE_AGAIN, ((),), {}, 1))
        wire.loads(handle_bytes)
        wire.dumps(("execute_batch", (batch_handle,), {}, 0))
        wire.completion_of_plan(wire.loads(reply_bytes)[1], requests)

    return pickled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--wait-us", type=float, default=7000)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    codings = {"pickled": _client_calls(args.batch, False), "laid out": _client_calls(args.batch, True)}
    calls = codings["laid out"]  # what a warming wait runs
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
    times: dict[tuple[str, str], list[float]] = {(wait, coding): [] for wait in waits for coding in codings}
    for _ in range(args.rounds):
        for name, wait in waits.items():
            for coding, run in codings.items():
                wait()
                if name == "none":  # back to back: the same calls just ran
                    run()
                t = time.perf_counter()
                run()
                times[name, coding].append(time.perf_counter() - t)
    print(f"control's codings of one decode step, B={args.batch}, after waiting {args.wait_us:.0f} us, median (p90) of {args.rounds}, us:")
    print("  wait      " + "".join(coding.rjust(18) for coding in codings))
    for name in waits:
        cells = (times[name, coding] for coding in codings)
        print(f"  {name:9} " + "".join(f"{statistics.median(v) * 1e6:9.1f} ({statistics.quantiles(v, n=10)[-1] * 1e6:5.1f})" for v in cells))
    theirs.close()


if __name__ == "__main__":
    main()
