"""Where a decode step's time goes across the process boundary: a diagnostic, not a benchmark row.

Per boundary call of a decode step (prepare, execute, poll) on `ProcessGPURuntime` over the
bench's bookkeeping-only runtime, the mean microseconds of: the client's encoding and
decoding, the runtime process's decoding, the operation itself and its encoding of the
reply (timed inside the runtime process by wrapping them there), and what is left, the
link: the socket, the two processes waking up, and each side's untimed work around those
parts (the client's call, the server's loop and the polls it replays first).

    PYTHONPATH=src:. python3 -m benchmarks.diagnostics.processsplit --device cpu --batches 16,64 --spin-us 20000
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

OPERATIONS = ("prepare_batch", "execute_batch", "poll_completions")


def timed_runtime(stats_path: str, **options: Any) -> Any:
    """The bench's null runtime, with its operations and the server's wire timed; stats written at close."""
    from benchmarks.processcost import null_runtime
    from cacheruntime.runtime.process import server

    runtime = null_runtime(**options)
    totals: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()

    def timed(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - t
                counts[name] += 1

        return call

    for op in OPERATIONS:
        setattr(runtime, op, timed("server " + op, getattr(runtime, op)))
    server.wire = _TimedWire(server.wire, totals, counts)  # type: ignore[attr-defined]
    close = runtime.close

    def close_and_write() -> None:
        Path(stats_path).write_text(json.dumps({name: [totals[name], counts[name]] for name in totals}))
        close()

    runtime.close = close_and_write  # type: ignore[method-assign]
    return runtime


class _TimedWire:
    """The server's wire, its decoding and encoding timed per operation."""

    def __init__(self, wire: Any, totals: Any, counts: Any):
        self._wire = wire
        self._totals, self._counts, self._operation = totals, counts, ""

    def __getattr__(self, name: str) -> Any:  # everything but the two timed functions, as the wire has it
        return getattr(self._wire, name)

    def loads_request(self, data: bytes) -> Any:
        t = time.perf_counter()
        message = self._wire.loads_request(data)
        self._operation = message[0].partition(" ")[0]  # wire.PREPARE_AGAIN is a prepare_batch
        self._add("server loads " + self._operation, t)
        return message

    def dumps_reply(self, message: Any) -> bytes:
        t = time.perf_counter()
        data = self._wire.dumps_reply(message)
        self._add("server dumps " + self._operation, t)
        return data

    def _add(self, name: str, start: float) -> None:
        self._totals[name] += time.perf_counter() - start
        self._counts[name] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--spin-us", type=float, default=0.0, help="each side busy-polls this long before it sleeps (client.py)")
    args = parser.parse_args()
    for batch in [int(b) for b in args.batches.split(",")]:
        _one(batch, args)


def _one(batch: int, args: argparse.Namespace) -> None:
    """Time `args.steps` decode steps of `batch` rows, per call and part, and print the table."""
    from cacheruntime.protocol import BatchItem, BatchPlan
    from cacheruntime.runtime.process import ProcessGPURuntime, client

    stats = tempfile.mktemp(suffix=".json")
    sizes = dict(page_size=16, max_requests=batch, max_request_tokens=2048, l1_pages=batch * 128 + 8, l2_pages=0)
    rt = ProcessGPURuntime("benchmarks.diagnostics.processsplit:timed_runtime", stats_path=stats, spin_us=args.spin_us, device=args.device, seed=0, **sizes)
    requests = [rt.open_request() for _ in range(batch)]
    rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * 256) for r in requests))))
    plan = BatchPlan(tuple(BatchItem(r, (1,)) for r in requests))
    wire = client.wire
    totals: collections.Counter[str] = collections.Counter()
    dumps, loads = wire.dumps_request, wire.loads_reply

    def timed_dumps(operation: str, *message: Any) -> bytes:
        t = time.perf_counter()
        out = dumps(operation, *message)
        totals["client dumps " + operation.partition(" ")[0]] += time.perf_counter() - t
        return out

    current = [""]

    def timed_loads(data: bytes) -> Any:
        t = time.perf_counter()
        out = loads(data)
        totals["client loads " + current[0]] += time.perf_counter() - t
        return out

    for _ in range(20):
        rt.execute_batch(rt.prepare_batch(plan))
        rt.poll_completions()
    client.wire.dumps_request, client.wire.loads_reply = timed_dumps, timed_loads
    try:
        for _ in range(args.steps):
            for op in OPERATIONS:
                current[0] = op
                t = time.perf_counter()
                if op == "prepare_batch":
                    handle = rt.prepare_batch(plan)
                elif op == "execute_batch":
                    rt.execute_batch(handle)
                else:
                    rt.poll_completions()
                totals["client " + op] += time.perf_counter() - t
    finally:
        client.wire.dumps_request, client.wire.loads_reply = dumps, loads
    rt.close()
    server = json.loads(Path(stats).read_text())  # the server's means include the warm-up steps
    print(f"B={batch} ({args.device}, spin {args.spin_us:g} us), mean us per call over {args.steps} steps:")
    print("  call               client  c.dumps  c.loads  s.loads  s.op   s.dumps  link")
    for op in OPERATIONS:
        n = args.steps
        # a poll the client answers itself (client.py) has no message: its server parts are 0 then
        s_op, s_loads, s_dumps = (total / max(count, 1) for total, count in (server.get(f"server {part}{op}", (0.0, 0)) for part in ("", "loads ", "dumps ")))
        c = totals["client " + op] / n
        cd, cl = totals["client dumps " + op] / n, totals["client loads " + op] / n
        link = c - cd - cl - s_loads - s_op - s_dumps
        print(f"  {op:18} {c * 1e6:6.1f}  {cd * 1e6:7.1f}  {cl * 1e6:7.1f}  {s_loads * 1e6:7.1f}  {s_op * 1e6:5.1f}  {s_dumps * 1e6:7.1f}  {link * 1e6:5.1f}")


if __name__ == "__main__":
    main()
