"""What one message costs on this host: the link's floor beside the process runtime's calls, a diagnostic.

Medians in microseconds, each over `--calls` calls after a warm-up, per spin window:

- floor: two processes passing 8 bytes back and forth over a Unix socket pair with raw
  `os.read`/`os.write`, the receiver busy-polling a non-blocking descriptor (spin > 0) or
  blocking in the kernel (spin 0): what any transport on this host pays per round trip;
- framed: a 200-byte message back and forth with each framing the link had: the standard
  library's `multiprocessing.connection.Connection` (the first) and the runtime's `Link` (`link.py`);
- call: `ProcessGPURuntime.poll_completions` with nothing in flight (after a call other than
  `execute_batch`, so it crosses): one request and one reply through the whole client and server;
- step B: a decode step of B one-token requests (prepare + execute + poll) on the bench's null
  runtime, in the runtime process and, for the baseline, in this process.

    PYTHONPATH=src:. python3 -m benchmarks.diagnostics.processrtt --spin-us 0,20000 --batches 16,64
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import time
from multiprocessing import get_context
from typing import Any


def _echo(sock: socket.socket, spin: bool, calls: int) -> None:
    fd = sock.fileno()
    os.set_blocking(fd, not spin)
    for _ in range(calls):
        while True:
            try:
                data = os.read(fd, 64)
                break
            except BlockingIOError:
                continue
        os.write(fd, data)


def floor_us(spin: bool, calls: int) -> float:
    """Median round trip of 8 bytes between two processes over a socket pair."""
    ours, theirs = socket.socketpair()
    child = get_context("fork").Process(target=_echo, args=(theirs, spin, calls + 200))
    child.start()
    fd = ours.fileno()
    os.set_blocking(fd, not spin)
    times = []
    for _ in range(calls + 200):
        start = time.perf_counter()
        os.write(fd, b"12345678")
        while True:
            try:
                os.read(fd, 64)
                break
            except BlockingIOError:
                continue
        times.append(time.perf_counter() - start)
    child.join()
    return statistics.median(times[200:]) * 1e6


def _echo_framed(sock: socket.socket, framing: str, spin: bool, calls: int) -> None:
    link = _framed(sock, framing)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    for _ in range(calls):
        while spin and not poller.poll(0):
            pass
        link[0](link[1]())


def _framed(sock: socket.socket, framing: str) -> tuple[Any, Any]:
    """(send, recv) of whole messages over `sock`: the standard library's `Connection` or the runtime's `Link`."""
    if framing == "connection":
        from multiprocessing.connection import Connection

        connection = Connection(os.dup(sock.fileno()))
        return connection.send_bytes, connection.recv_bytes
    from cacheruntime.runtime.process.link import Link

    link = Link(sock)
    return link.send, link.recv


def framed_us(framing: str, spin: bool, calls: int) -> float:
    """Median round trip of a 200-byte message between two processes, framed by `framing`, each side
    busy-polling its socket before it reads (spin) or reading at once (blocking in the kernel)."""
    ours, theirs = socket.socketpair()
    child = get_context("fork").Process(target=_echo_framed, args=(theirs, framing, spin, calls + 200))
    child.start()
    send, recv = _framed(ours, framing)
    poller = select.poll()
    poller.register(ours.fileno(), select.POLLIN)
    message, times = b"x" * 200, []
    for _ in range(calls + 200):
        start = time.perf_counter()
        send(message)
        while spin and not poller.poll(0):
            pass
        recv()
        times.append(time.perf_counter() - start)
    child.join()
    return statistics.median(times[200:]) * 1e6


def _median_us(fn: Any, calls: int) -> float:
    for _ in range(min(calls, 100)):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spin-us", default="0,20000")
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from benchmarks.cpucost import CALLS, timed_step
    from benchmarks.harness import close_runtime
    from benchmarks.processcost import FACTORY, null_runtime
    from cacheruntime.protocol import BatchItem, BatchPlan
    from cacheruntime.runtime.process import ProcessGPURuntime

    print(f"# cpus {os.cpu_count()}, affinity {len(os.sched_getaffinity(0))}, calls {args.calls}")
    for spin in (int(s) for s in args.spin_us.split(",")):
        framing = " ".join(f"{kind} {framed_us(kind, spin > 0, args.calls):.1f} us" for kind in ("connection", "link"))
        print(f"spin {spin} us: floor {floor_us(spin > 0, args.calls):.1f} us; 200 bytes framed: {framing}", flush=True)
        for batch in (int(b) for b in args.batches.split(",")):
            sizes = dict(page_size=16, max_requests=batch, max_request_tokens=-(-(args.calls * 2 + 400) // 16) * 16 + 16, l2_pages=0)
            sizes["l1_pages"] = batch * (sizes["max_request_tokens"] // 16) + 8
            process = ProcessGPURuntime(FACTORY, spin_us=spin, device=args.device, seed=0, **sizes)
            local = null_runtime(args.device, 0, **sizes)
            try:
                figures = {}
                for name, rt in (("process", process), ("local", local)):
                    plan = BatchPlan(tuple(BatchItem(rt.open_request(), (1,)) for _ in range(batch)))
                    split = dict.fromkeys(CALLS, 0.0)
                    figures[name] = _median_us(lambda rt=rt, plan=plan, split=split: timed_step(rt, plan, split), args.calls)
                process.probe()  # a call other than execute_batch: the next polls cross
                call = _median_us(process.poll_completions, args.calls)
                print(f"  B={batch}: call {call:.1f} us, step process {figures['process']:.1f} us, local {figures['local']:.1f} us", flush=True)
            finally:
                process.close()
                close_runtime(local)


if __name__ == "__main__":
    main()
