"""A stream whose worker died: how the death is raised, and what its queued work answers.

A stream's worker dies (FaultKind.LOST, or anything that stops it for good) by a job
raising `StreamWorkerDied`. From then on the stream runs nothing: every step already
queued and every later one is abandoned (`abandon`), so that whoever waits on it wakes
at once and finds `StreamDead` in the result, and the runtime turns that into
`RuntimeFault` on every call until `restart` (spec/protocol.md §4.15). Detection is
direct, never a wall-clock timeout. Shared by the thread, simulated and CUDA streams.
"""

from __future__ import annotations

from typing import Any

import torch


class StreamWorkerDied(BaseException):
    """Raised by a job to stop its stream's worker for good (FaultKind.LOST): the stream is dead.

    A `BaseException`, so that the job wrapper, which keeps every error for the result's
    reader, lets this one through to the worker.
    """


class StreamDead(RuntimeError):
    """What a dead stream answers for work it will never run: the runtime's machinery is gone."""


class DeviceBroken(StreamDead):
    """The CUDA context is broken: an asynchronous error (an illegal address, a device-side
    assert) is sticky, so every later CUDA call in this process fails too. Unlike a dead
    worker, `restart` cannot recover it: only a new process can (spec/protocol.md §4.15)."""

    @classmethod
    def of(cls, error: BaseException) -> DeviceBroken:
        """The CUDA error `error`, said as the broken device it means (first line of CUDA's message)."""
        return cls(f"the CUDA device is broken ({type(error).__name__}: {str(error).splitlines()[0]})")


def device_broken(error: BaseException) -> bool:
    """Whether `error` is CUDA reporting a broken context (torch raises `AcceleratorError` for
    it, a `RuntimeError` whose message names the CUDA error, on older versions)."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and not isinstance(error, StreamDead) and "CUDA error" in str(error)


def abandon(entry: Any, stream: str) -> None:
    """A queued step of a stream that died: a job's result fails with `StreamDead`, an event is
    set (its waiters wake and find the stream dead), a wait or a sleep is dropped. So no one
    blocks forever on a dead worker (spec/faults.md: stream worker death)."""
    result = getattr(entry, "result", None)
    if result is not None:
        result._error = StreamDead(f"the {stream} stream's worker died before running this")
        result.set()
    elif getattr(entry, "__name__", "") == "set":
        entry()
