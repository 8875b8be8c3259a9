"""`FaultyStore`: a store the tests (and the conformance suite) slow down and make fail, deterministically.

It wraps a real store and adds three controls, none of which uses time to decide anything:

- a gate per operation: `hold(op)` closes it, and calls of that operation then wait (on
  the worker's thread) until `release(op)`; `arrivals(op, count)` waits until `count`
  calls reached the gate, so a test knows a call is in flight without sleeping;
- failures by position: `fail_nth(op, n)` makes the n-th key of that operation (counted
  over all calls, from 1) answer FAILED with `InjectedFault` without reaching the inner
  store, the other keys of its batch go through;
- eviction: `evict(keys)` removes objects behind the caller's back, as a store that evicts
  (or another runtime's remove) would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from cacheruntime.storage.arguments import byte_views, check_keys
from cacheruntime.storage.errors import InjectedFault
from cacheruntime.storage.results import KeyResult, Op, failed
from cacheruntime.storage.store import Store

#: how long a gate or an arrival wait may block before the test is told it hung (never a verdict)
HANG_SECONDS = 60.0


class FaultyStore:
    """A wrapper around `inner` with gates, positional failures and eviction (see the module docstring)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.name = f"faulty({inner.name})"
        self._lock = threading.Condition()
        self._held: set[Op] = set()
        self._arrived = dict.fromkeys(Op, 0)
        self._seen = dict.fromkeys(Op, 0)
        self._fail_at: dict[Op, set[int]] = {op: set() for op in Op}

    def hold(self, op: Op) -> None:
        """Close `op`'s gate: its calls wait until `release(op)`."""
        with self._lock:
            self._held.add(op)

    def release(self, op: Op) -> None:
        """Open `op`'s gate and let the waiting calls through."""
        with self._lock:
            self._held.discard(op)
            self._lock.notify_all()

    def arrivals(self, op: Op, count: int) -> None:
        """Wait until `count` calls of `op` reached its gate (since the store was made)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._arrived[op] >= count, HANG_SECONDS):
                raise TimeoutError(f"{count} {op.value} calls never arrived ({self._arrived[op]} did): the caller hung")

    def fail_nth(self, op: Op, n: int) -> None:
        """Make the n-th key of `op` (from 1, over all calls) fail with `InjectedFault`."""
        if n < 1:
            raise ValueError(f"n counts keys from 1, got {n}")
        with self._lock:
            self._fail_at[op].add(n)

    def evict(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        """Remove the objects behind the caller's back (an eviction), ungated and never failed.

        The inner store answers: over Mooncake an object read within its lease answers LEASED
        and stays until the lease ends, so evict before a get, not after one.
        """
        return self.inner.remove(keys)

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        return self._run(Op.PUT, keys, sources, self.inner.put)

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        return self._run(Op.GET, keys, targets, self.inner.get)

    def exists(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        return self._run(Op.EXISTS, keys, None, lambda ks, _: self.inner.exists(ks))

    def remove(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        return self._run(Op.REMOVE, keys, None, lambda ks, _: self.inner.remove(ks))

    def close(self) -> None:
        self.inner.close()

    def _run(
        self,
        op: Op,
        keys: Sequence[str],
        buffers: Sequence[Any] | None,
        call: Callable[[Sequence[str], Sequence[Any]], tuple[KeyResult, ...]],
    ) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        if buffers is not None:
            byte_views(checked, buffers, writable=op is Op.GET)
        with self._lock:
            self._arrived[op] += 1
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: op not in self._held, HANG_SECONDS):
                raise TimeoutError(f"the {op.value} gate stayed closed for {HANG_SECONDS}s: the test never released it")
            first = self._seen[op] + 1
            self._seen[op] += len(checked)
            doomed = {i for i in range(len(checked)) if first + i in self._fail_at[op]}
        through = [i for i in range(len(checked)) if i not in doomed]
        passed = call([checked[i] for i in through], [buffers[i] for i in through] if buffers is not None else [])
        answers = dict(zip(through, passed))
        return tuple(
            answers[i] if i in answers else failed(checked[i], InjectedFault(f"{op.value} #{first + i} of {checked[i]!r} failed on purpose"))
            for i in range(len(checked))
        )
