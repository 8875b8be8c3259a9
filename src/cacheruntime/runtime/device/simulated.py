"""Simulated streams: the CPU streams' ordering, with the interleaving picked by a seeded schedule.

On the thread streams (`streams.CpuStream`) the operating system picks the interleaving of
copies, compute and completions, so what a conformance case meets (a transfer still in
flight at a restart, OutOfPages while a deferred free waits) depends on the machine's load:
a coverage floor met on one machine is missed on another, and a failure may not replay.

Here nothing runs concurrently. Each stream is a queue; the work runs on the caller's
thread whenever the runtime looks at an event (`query`, `synchronize`, a result), and at
each such point a `Schedule` seeded by the caller picks which stream moves next, one queued
step at a time. The same calls with the same seed give the same interleaving on any
machine; another seed gives another. What the ordering points promise still holds, and
only that: a stream runs its queue in order, and a `wait` holds its stream until the
event is done. A missing wait is therefore a race the schedule wins or loses by seed, not
by the clock.

The delay knob (`sleep`) becomes a step that runs only when no other stream can move:
everything else that is ready runs first, which is the race the knob makes sure on
threads, without the wall-clock time.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from cacheruntime.runtime.device.deadstreams import StreamDead, StreamWorkerDied, abandon

#: The most steps a `query` lets the schedule take before it answers (it picks 0 .. QUERY_STEPS):
#: an event may or may not be done when the runtime polls, as on threads, and all the
#: work queued is still run at the next `synchronize`.
QUERY_STEPS = 3


class SimEvent:
    """A point in a simulated stream: done once the schedule has run everything queued before it."""

    __slots__ = ("_done", "_schedule")

    def __init__(self, schedule: Schedule):
        self._schedule = schedule
        self._done = False

    def query(self) -> bool:
        """Let the schedule take a few steps (how many: its seed's choice), then say whether this is done."""
        if not self._done:
            self._schedule.advance()
        return self._done

    def synchronize(self) -> None:
        """Run the schedule until this is done."""
        self._schedule.run_until(self)

    def set(self) -> None:
        self._done = True


class SimResult(SimEvent):
    """What a simulated stream's job returned or raised, once the schedule has run it."""

    __slots__ = ("_error", "_value")

    def __init__(self, schedule: Schedule):
        super().__init__(schedule)
        self._value: Any = None
        self._error: BaseException | None = None

    def result(self) -> Any:
        self.synchronize()
        if self._error is not None:
            raise self._error
        return self._value


class _Sleep:
    """A delay-knob step: it runs only once no other stream can move."""


class _Wait:
    """A step that holds its stream until `event` is done."""

    __slots__ = ("event",)

    def __init__(self, event: Any):
        self.event = event


class Schedule:
    """The seeded choice of which stream moves next, shared by the streams of one runtime."""

    def __init__(self, seed: int = 0):
        self.streams: list[SimStream] = []
        self._rng = random.Random(seed)
        self.seed = seed

    def reseed(self, seed: int) -> None:
        """Pick later interleavings from `seed` (the conformance suite draws one per case)."""
        self._rng = random.Random(seed)
        self.seed = seed

    def _movable(self) -> list[SimStream]:
        """The streams whose next step can run now; a delay step only where nothing else can."""
        ready = [s for s in self.streams if s.queue and not _blocked(s.queue[0])]
        eager = [s for s in ready if not isinstance(s.queue[0], _Sleep)]
        return eager or ready

    def step(self) -> bool:
        """Run one step of a stream the seed picks; False when no stream can move."""
        movable = self._movable()
        if not movable:
            return False
        stream = movable[self._rng.randrange(len(movable))] if len(movable) > 1 else movable[0]
        stream.run_next()
        return True

    def advance(self) -> None:
        """Take between 0 and `QUERY_STEPS` steps, as the seed picks (what a poll may find done)."""
        for _ in range(self._rng.randint(0, QUERY_STEPS)):
            if not self.step():
                return

    def run_until(self, event: SimEvent) -> None:
        """Step until `event` is done (other streams move too, as the seed picks)."""
        while not event._done:
            if not self.step():
                raise RuntimeError(f"simulated streams deadlocked: nothing can move and the event awaited is not done (schedule seed {self.seed})")

    def drain(self) -> None:
        """Run every queued step."""
        while self.step():
            pass


def _blocked(step: Any) -> bool:
    return isinstance(step, _Wait) and not step.event._done


class SimStream:
    """A stream whose queued steps run when its `Schedule` picks it; the interface of `CpuStream`."""

    def __init__(self, name: str, schedule: Schedule):
        self.name = name
        self.alive = True  # False once a step raised StreamWorkerDied: its queue was abandoned
        self.schedule = schedule
        self.queue: deque[Callable[[], None] | _Wait | _Sleep] = deque()
        schedule.streams.append(self)

    def run_next(self) -> None:
        step = self.queue.popleft()
        if callable(step):
            try:
                step()
            except StreamWorkerDied:
                self.alive = False
                while self.queue:
                    abandon(self.queue.popleft(), self.name)

    def _put(self, step: Callable[[], None] | _Wait | _Sleep) -> None:
        if self.alive:
            self.queue.append(step)
        else:
            abandon(step, self.name)

    def submit(self, fn: Callable[[], Any]) -> SimResult:
        """Queue `fn` after everything submitted before; its value (or error) arrives in the result."""
        result = SimResult(self.schedule)

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

    def record(self) -> SimEvent:
        """An event that is done once the schedule has run everything queued here so far."""
        event = SimEvent(self.schedule)
        self._put(event.set)
        return event

    def wait(self, event: Any) -> None:
        """Steps queued from now on run only after `event` (from any simulated stream) is done."""
        self._put(_Wait(event))

    def sleep(self, seconds: float) -> None:
        """The delay knob: later steps here run only once no other stream can move (no time passes)."""
        self._put(_Sleep())

    def synchronize(self) -> None:
        """Run the schedule until everything queued here so far has run."""
        self.record().synchronize()

    def close(self) -> None:
        """Run what is queued, as a thread stream finishes its queue before it stops."""
        self.schedule.drain()
