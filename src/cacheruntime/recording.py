"""A recorder of boundary calls: what control sent a runtime and what came back, call by call.

`Recorder` wraps any object with the `RuntimeInterface` operations (a runtime, the
reference model) and stands in for it: every boundary call is forwarded unchanged and
logged as a frozen `Call` (operation, arguments, the value returned or the error raised),
and everything else (`probe()`, the delay knob, the model's state) passes through
unrecorded, read and written, so a recorder can replace the object wherever it was held.
The conformance suite records every case this way and prints the calls of a failing one
(`format_calls`) as the protocol calls they were; a trace validator can read the same log.

Recording is cheap enough to leave on: one record per call, holding the values the call
already made (protocol values are frozen, so nothing is copied). `keep` bounds the log
for long runs, keeping the latest calls. Recorders that share a `clock` number their calls
in one sequence, so the calls of a runtime and of the model driven beside it can be paired.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

import attrs

from cacheruntime.protocol import (
    BatchCompletion,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    RuntimeInfo,
    RuntimeInterface,
    TierIntent,
    TransferCompletion,
    TransferTicket,
)

#: The operations of `RuntimeInterface`, the calls a recorder logs.
BOUNDARY_OPERATIONS = tuple(name for name in RuntimeInterface.__dict__ if not name.startswith("_") and callable(RuntimeInterface.__dict__[name]))

_Target = TypeVar("_Target")


@attrs.frozen
class Call:
    """One boundary call: its place in the sequence, the operation and arguments, and its outcome.

    Exactly one of `value` and `error` describes the outcome: `error` is the exception the
    call raised (a typed `CacheRuntimeError`, or anything else a broken runtime throws),
    else the call returned `value`.
    """

    index: int  # position in the recorder's clock (shared clocks interleave recorders)
    operation: str
    args: tuple[object, ...]
    value: object = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        """Whether the call raised instead of returning."""
        return self.error is not None

    def __str__(self) -> str:
        return format_call(self)


class Recorder(Generic[_Target]):
    """Stands in for `target`, logging each boundary call it forwards (see the module docstring)."""

    __slots__ = ("_clock", "calls", "target")

    def __init__(self, target: _Target, *, keep: int | None = None, clock: Iterator[int] | None = None):
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "calls", collections.deque[Call](maxlen=keep))
        object.__setattr__(self, "_clock", itertools.count() if clock is None else clock)

    target: _Target
    calls: collections.deque[Call]  # the latest calls, oldest first (at most `keep`)
    _clock: Iterator[int]

    # -- everything else passes through, read and written ---------------------------------

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.target, name, value)

    def __repr__(self) -> str:
        return f"Recorder({self.target!r}, {len(self.calls)} calls)"

    # -- recording ---------------------------------------------------------------------------

    def _record(self, operation: str, args: tuple[Any, ...]) -> Any:
        """Forward one call to the target and log it, whether it returns or raises."""
        method = getattr(self.target, operation)
        try:
            value = method(*args)
        except Exception as error:
            self.calls.append(Call(next(self._clock), operation, args, error=error))
            raise
        self.calls.append(Call(next(self._clock), operation, args, value))
        return value

    # -- the boundary (RuntimeInterface), forwarded and logged -------------------------------

    def info(self) -> RuntimeInfo:
        info: RuntimeInfo = self._record("info", ())
        return info

    def open_request(self) -> RequestRuntimeHandle:
        handle: RequestRuntimeHandle = self._record("open_request", ())
        return handle

    def close_request(self, request: RequestRuntimeHandle) -> None:
        self._record("close_request", (request,))

    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        handle: PreparedBatchHandle = self._record("prepare_batch", (plan,))
        return handle

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        completion: BatchCompletion = self._record("execute_batch", (batch,))
        return completion

    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        self._record("cancel_batch", (batch,))

    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        ref: CacheExtentRef = self._record("publish", (request, first_page, page_count))
        return ref

    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        halves: tuple[CacheExtentRef, CacheExtentRef] = self._record("split", (extent, at_page))
        return halves

    def retain(self, extent: CacheExtentRef) -> None:
        self._record("retain", (extent,))

    def release(self, extent: CacheExtentRef) -> None:
        self._record("release", (extent,))

    def submit(self, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
        tickets: tuple[TransferTicket, ...] = self._record("submit", (intents,))
        return tickets

    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        reported: tuple[TransferCompletion, ...] = self._record("poll_completions", ())
        return reported

    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        reported: tuple[TransferCompletion, ...] = self._record("wait_completions", ())
        return reported

    def restart(self) -> RuntimeInfo:
        info: RuntimeInfo = self._record("restart", ())
        return info


# --------------------------------------------------------------------------------------
# Printing: one call a line, values in the protocol's own repr
# --------------------------------------------------------------------------------------


def format_error(error: BaseException) -> str:
    """An error as `Type: what` (a typed error without its fix text, which says nothing about this call)."""
    what = error.what if isinstance(error, CacheRuntimeError) else str(error)
    return f"{type(error).__name__}: {what}" if what else type(error).__name__


def format_call(call: Call) -> str:
    """`operation(arg, ...) -> value` or `operation(arg, ...) raises Type: what`."""
    head = f"{call.operation}({', '.join(repr(a) for a in call.args)})"
    if call.error is not None:
        return f"{head} raises {format_error(call.error)}"
    return f"{head} -> {call.value!r}"


def format_calls(calls: Iterable[Call], *, last: int | None = None, marker: str = "") -> str:
    """The calls one a line, numbered from 1 in the order sent; `marker` ends the last line.

    With `last`, only the latest `last` calls are printed, after a line saying how many
    earlier ones are left out.
    """
    calls = list(calls)
    shown = calls if last is None or len(calls) <= last else calls[-last:]
    width = len(str(len(calls)))
    lines = [f"  ... {len(calls) - len(shown)} earlier calls left out"] if len(shown) < len(calls) else []
    first = len(calls) - len(shown) + 1
    for number, call in enumerate(shown, start=first):
        lines.append(f"  {number:>{width}}  {format_call(call)}")
    if lines and marker:
        lines[-1] += f"  {marker}"
    return "\n".join(lines)
