"""Streams and events: the runtime's ordering primitives, on CUDA and emulated on CPU.

The runtime orders its work the way CUDA does: work submitted to one stream runs in
submission order, an event marks a point in a stream, and a stream can be told to wait
for an event recorded on another. On CUDA these are `torch.cuda.Stream`/`Event`. On CPU
each stream is one worker thread running its queue in FIFO order and an event is a lock
released when the worker reaches it, so work on different streams really runs concurrently: a missing
`wait` is a real race there too, not a no-op, and the test-only delay knob makes it a
sure one.

Nothing here crosses to control (B2): streams and events stay inside the runtime.
"""

from __future__ import annotations

import queue
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable
from typing import Any, Protocol

import torch

from cacheruntime.runtime.device.deadstreams import DeviceBroken, StreamDead, StreamWorkerDied, abandon, device_broken
from cacheruntime.runtime.device.simulated import Schedule, SimStream


class Event(Protocol):
    """A point in a stream: done once everything submitted before it has run."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class Result(Protocol):
    """The value a submitted function returned, available once it has run."""

    def result(self) -> Any: ...


class CpuEvent:
    """An event on a CPU stream: set by the stream's worker when it reaches it.

    A lock held from creation until `set` (cheaper than a `threading.Event`, which the
    runtime would build once per batch): done once it is free.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _allocate_lock()
        self._lock.acquire()

    def query(self) -> bool:
        return not self._lock.locked()

    def synchronize(self) -> None:
        lock = self._lock
        if lock.locked():
            lock.acquire()
            lock.release()

    def set(self) -> None:
        if self._lock.locked():
            self._lock.release()


class CpuResult(CpuEvent):
    """What a CPU stream's job returned or raised: an event set once the worker has run it (a light Future)."""

    __slots__ = ("_value", "_error")

    def __init__(self) -> None:
        super().__init__()
        self._value: Any = None
        self._error: BaseException | None = None

    def result(self) -> Any:
        self.synchronize()
        if self._error is not None:
            raise self._error
        return self._value


class AfterHostStep:
    """The end of a host step that issues CUDA work: done once the step has run and the CUDA
    event it recorded at its end is done.

    A CUDA stream cannot wait for a host event, so GPU work that must follow host work (a fetch's
    H2D after the store read that fills its staging) is issued by that host step itself, on a
    CUDA stream of its own, which then records `cuda`. Until the step has run there is no CUDA
    event to wait for: a CUDA stream told to wait for this blocks the host until the step has run,
    which only `execute_batch` does (its compute reads the pages, and it blocks anyway), never
    the call that started the work. A step that issued nothing leaves `cuda` None.
    """

    __slots__ = ("step", "cuda")

    def __init__(self) -> None:
        self.step: CpuResult = CpuResult()  # replaced by the host step's result when it is queued
        self.cuda: torch.cuda.Event | None = None

    def query(self) -> bool:
        return self.step.query() and (self.cuda is None or self.cuda.query())

    def synchronize(self) -> None:
        self.step.synchronize()
        if self.cuda is not None:
            self.cuda.synchronize()


class CpuStream:
    """A CUDA-like stream on CPU: one daemon worker thread running submitted work in order.

    A function that raises does not stop the stream (as an asynchronous CUDA error would
    not stop later launches from being queued); its exception is kept in the result that
    `submit` returns.
    """

    def __init__(self, name: str):
        self.name = name
        self.alive = True  # False once the worker died (StreamWorkerDied): it runs nothing more
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders a submit's liveness check against the worker's death
        self._thread = threading.Thread(target=self._work, name=f"cacheruntime-{name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                job()
            except StreamWorkerDied:
                self._die()
                return

    def _die(self) -> None:
        """The worker stops for good: everything queued is abandoned, so its waiters wake."""
        with self._lock:
            self.alive = False
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                return
            abandon(entry, self.name)

    def _put(self, entry: Callable[[], None]) -> None:
        with self._lock:
            if self.alive:
                self._queue.put(entry)
                return
        abandon(entry, self.name)

    def submit(self, fn: Callable[[], Any]) -> CpuResult:
        """Queue `fn` after everything submitted before; its value (or error) arrives in the result."""
        result = CpuResult()

        def job() -> None:
            try:
                result._value = fn()
            except StreamWorkerDied:
                result._error = StreamDead(f"the {self.name} stream's worker died running this")
                result.set()
                raise
            except BaseException as error:  # kept for whoever reads the result
                result._error = error
            result.set()

        job.result = result  # type: ignore[attr-defined]  # for `abandon`
        self._put(job)
        return result

    def record(self) -> CpuEvent:
        """An event that is set when the worker has run everything submitted so far."""
        event = CpuEvent()
        self._put(event.set)
        return event

    def wait(self, event: Event) -> None:
        """Work submitted from now on starts only after `event` (from any stream) is done."""
        self._put(event.synchronize)

    def sleep(self, seconds: float) -> None:
        """Hold the stream for `seconds` before later work (the delay knob)."""
        self._put(lambda: time.sleep(seconds))

    def synchronize(self) -> None:
        """Block until everything submitted so far has run."""
        self.record().synchronize()

    def close(self) -> None:
        """Stop the worker after the work already queued, and wait for it.

        Waiting matters at interpreter exit: a worker killed inside a torch kernel aborts
        the process.
        """
        self._put(lambda: None)  # a dead worker has nothing to stop
        if self.alive:
            self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()


class Ready:
    """The result of work launched on a CUDA stream: the (device) value, ordered by events."""

    def __init__(self, value: Any):
        self._value = value

    def result(self) -> Any:
        return self._value


class Failed:
    """The result of work that raised when it was issued (a CUDA launch, or a copy failed at
    issue): kept for whoever reads the result, as a CPU stream keeps its job's error."""

    def __init__(self, error: BaseException):
        self._error = error

    def result(self) -> Any:
        raise self._error


class on_stream:
    """`with on_stream(s):` makes the CUDA stream `s` current for the block, as `torch.cuda.stream(s)`.

    `torch.cuda.stream` is Python that looks the device up several times per use (tens of
    microseconds on an H200 host, measured by `benchmarks/diagnostics/hostprof.py`), and the runtime switches
    streams a few times per batch and per transfer chunk. This sets and restores the
    current stream with the two calls that context manager ends in. Where torch lacks them,
    or `s` is not on the current device, it is `torch.cuda.stream(s)` itself. One object
    per `with`: the stream it restores is the calling thread's.
    """

    __slots__ = ("_stream", "_saved")

    def __init__(self, stream: torch.cuda.Stream):
        self._stream = stream
        self._saved: Any = None  # the stream to restore, or torch's own context

    def __enter__(self) -> None:
        stream = self._stream
        index = stream.device_index
        if _FAST_SWITCH and torch._C._cuda_getDevice() == index:
            self._saved = torch._C._cuda_getCurrentStream(index)
            _set_stream(stream.stream_id, index, stream.device_type)
        else:
            self._saved = torch.cuda.stream(stream)
            self._saved.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if isinstance(self._saved, tuple):
            _set_stream(*self._saved)
        else:
            self._saved.__exit__(*exc)


def _set_stream(stream_id: int, device_index: int, device_type: int) -> None:
    torch._C._cuda_setStream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_cuda_stream(device_index: int) -> torch.cuda.Stream:
    """`torch.cuda.current_stream(device_index)`, without its device lookups where torch allows."""
    if _FAST_SWITCH:
        stream_id, index, device_type = torch._C._cuda_getCurrentStream(device_index)
        return torch.cuda.Stream(stream_id=stream_id, device_index=index, device_type=device_type)
    return torch.cuda.current_stream(device_index)


_FAST_SWITCH = all(hasattr(torch._C, name) for name in ("_cuda_getCurrentStream", "_cuda_setStream", "_cuda_getDevice"))


class CudaStream:
    """A `torch.cuda.Stream`: functions run at once on the host and launch their kernels on it."""

    _cycles_per_second: float | None = None

    def __init__(self, name: str, device: torch.device, priority: int = 0):
        self.name = name
        self.device = device
        self.alive = True  # False once a launch raised StreamWorkerDied (an injected LOST fault), or the device broke
        self.broken = False  # a sticky CUDA error was seen on this stream (DeviceBroken)
        self._stream = torch.cuda.Stream(device, priority=priority)

    def submit(self, fn: Callable[[], Any]) -> Ready | Failed:
        """Run `fn` with this stream current, so every kernel it launches is queued here; an error
        it raises at launch is kept in the result, as on a CPU stream."""
        if not self.alive:
            return Failed(StreamDead(f"the {self.name} stream is dead"))
        with on_stream(self._stream):
            try:
                return Ready(fn())
            except StreamWorkerDied:
                self.alive = False  # the next call finds it (the runtime checks every stream's liveness)
                return Failed(StreamDead(f"the {self.name} stream died launching this"))
            except Exception as error:
                return Failed(self._broken(error) if device_broken(error) else error)

    def _broken(self, error: BaseException) -> DeviceBroken:
        """A sticky CUDA error seen on this stream: it is dead, and the device with it."""
        self.alive = False
        self.broken = True
        return DeviceBroken.of(error)

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        try:
            event.record(self._stream)
        except RuntimeError as error:
            raise (self._broken(error) if device_broken(error) else error) from error
        return event

    def wait(self, event: torch.cuda.Event | AfterHostStep) -> None:
        if isinstance(event, AfterHostStep):
            event.step.synchronize()  # the host step has issued its CUDA work (see AfterHostStep)
            if event.cuda is None:
                return
            event = event.cuda
        try:
            self._stream.wait_event(event)
        except RuntimeError as error:
            raise (self._broken(error) if device_broken(error) else error) from error

    def sleep(self, seconds: float) -> None:
        """Spin the stream for about `seconds` (`torch.cuda._sleep`), delaying later work on it."""
        with on_stream(self._stream):
            torch.cuda._sleep(int(seconds * self._calibrate(self.device)))

    def synchronize(self) -> None:
        try:
            self._stream.synchronize()
        except RuntimeError as error:
            raise (self._broken(error) if device_broken(error) else error) from error

    def close(self) -> None:
        """Nothing to stop: CUDA streams need no worker."""

    @classmethod
    def _calibrate(cls, device: torch.device) -> float:
        """GPU cycles per second, measured once, so the delay knob speaks seconds."""
        if cls._cycles_per_second is None:
            cycles = 20_000_000
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(device):
                start.record()
                torch.cuda._sleep(cycles)
                end.record()
                end.synchronize()
            cls._cycles_per_second = cycles / (start.elapsed_time(end) / 1000.0)
        return cls._cycles_per_second


Stream = CpuStream | CudaStream | SimStream


def to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a device tensor, without blocking the host on the current stream.

    A copy from pageable memory makes CUDA synchronize the stream first, so a transfer
    stream's pending work (the delay knob's sleep, an earlier copy) would be absorbed by the
    host thread: every later launch would then run after it, and the stream ordering the
    runtime is built on would go untested. A pinned buffer copied with `non_blocking` stays
    in stream order (the caching host allocator keeps the buffer until the copy is done).
    """
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def make_stream(name: str, device: torch.device, priority: int = 0, schedule: Schedule | None = None) -> Stream:
    """A stream of the kind the device needs; on CUDA, a lower `priority` number is served first.

    With a `schedule` (CPU only), a simulated stream whose interleaving that schedule picks.
    """
    if schedule is not None:
        return SimStream(name, schedule)
    return CudaStream(name, device, priority) if device.type == "cuda" else CpuStream(name)
