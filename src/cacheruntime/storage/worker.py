"""`StorageWorker`: runs store operations off the caller's thread and reports their completions.

Store I/O blocks (a disk read, a round trip to the Mooncake master); the GPU loop must not.
The runtime submits a request and gets a `RequestId` at once; the worker's threads run
it; the runtime learns the outcome by `poll()` (every completion not yet reported, never
blocking: what the GPU loop calls between steps) or `wait(request)` (block for one: for
shutdown and tests).

The caller's buffers are the store's for as long as the request runs: a staging page under
a put must not be reused, nor one under a get read, until its completion is reported
(scenario 11's rule; the runtime keeps the page held until then). Requests run
concurrently and may complete in any order; a get submitted after a put of the same key
sees it only if the put's completion was reported first.

A store that raises instead of answering (a bug, or a backend exception the adapter did not
map) does not lose the request: its completion answers FAILED for every key with the
exception as the `StoreError`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NewType

import attrs

from cacheruntime.storage.arguments import byte_views, check_keys
from cacheruntime.storage.errors import StoreError
from cacheruntime.storage.results import KeyResult, Op, Status, failed
from cacheruntime.storage.store import Store

RequestId = NewType("RequestId", int)

#: the statuses whose `nbytes` moved data between the store and a caller's buffer
_MOVED = frozenset({Status.STORED, Status.HIT})


@attrs.frozen
class StoreCompletion:
    """A finished request: its id and operation, one `KeyResult` per key in order, and the bytes moved."""

    request: RequestId
    op: Op
    results: tuple[KeyResult, ...]

    @property
    def bytes_moved(self) -> int:
        """Bytes moved between the store and the caller's buffers (STORED and HIT keys)."""
        return sum(result.nbytes for result in self.results if result.status in _MOVED)

    @property
    def ok(self) -> bool:
        """No key FAILED (a MISS or an ABSENT is an answer, not a failure)."""
        return all(result.status is not Status.FAILED for result in self.results)


class StorageWorker:
    """A pool of `threads` threads running one store's operations; see the module docstring."""

    def __init__(self, store: Store, *, threads: int = 2) -> None:
        if threads < 1:
            raise ValueError(f"a storage worker needs at least one thread, got {threads}")
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"store-{store.name}")
        self._done = threading.Condition()
        self._finished: dict[RequestId, StoreCompletion] = {}
        self._next = 0
        self._pending = 0

    def submit_put(self, keys: Sequence[str], sources: Sequence[Any]) -> RequestId:
        """Start storing the sources under the keys; the sources stay untouched until the completion."""
        checked = check_keys(keys)
        byte_views(checked, sources, writable=False)
        return self._submit(Op.PUT, checked, lambda: self.store.put(checked, sources))

    def submit_get(self, keys: Sequence[str], targets: Sequence[Any]) -> RequestId:
        """Start reading the objects into the targets; read the targets only after the completion."""
        checked = check_keys(keys)
        byte_views(checked, targets, writable=True)
        return self._submit(Op.GET, checked, lambda: self.store.get(checked, targets))

    def submit_exists(self, keys: Sequence[str]) -> RequestId:
        """Start asking which objects are there (hints)."""
        checked = check_keys(keys)
        return self._submit(Op.EXISTS, checked, lambda: self.store.exists(checked))

    def submit_remove(self, keys: Sequence[str]) -> RequestId:
        """Start removing the objects."""
        checked = check_keys(keys)
        return self._submit(Op.REMOVE, checked, lambda: self.store.remove(checked))

    def poll(self) -> tuple[StoreCompletion, ...]:
        """Every completion not reported yet, in request order; never blocks."""
        with self._done:
            ready = tuple(self._finished.pop(request) for request in sorted(self._finished))
        return ready

    def wait(self, request: RequestId, timeout: float | None = None) -> StoreCompletion:
        """Block until `request` completes and report it (it is then not in a later `poll`)."""
        with self._done:
            if not self._done.wait_for(lambda: request in self._finished, timeout):
                raise TimeoutError(f"store request {request} did not complete within {timeout}s")
            return self._finished.pop(request)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not completed yet."""
        with self._done:
            return self._pending

    def close(self) -> None:
        """Finish the requests in flight, then stop the threads (the completions stay pollable)."""
        self._pool.shutdown(wait=True)

    def _submit(self, op: Op, keys: tuple[str, ...], run: Any) -> RequestId:
        with self._done:
            request = RequestId(self._next)
            self._next += 1
            self._pending += 1
        future = self._pool.submit(run)
        future.add_done_callback(lambda done: self._finish(request, op, keys, done))
        return request

    def _finish(self, request: RequestId, op: Op, keys: tuple[str, ...], done: Future[tuple[KeyResult, ...]]) -> None:
        error = done.exception()
        if error is None:
            results = done.result()
        else:
            wrapped = error if isinstance(error, StoreError) else StoreError(f"the {self.store.name} store raised on {op.value}: {error!r}")
            results = tuple(failed(key, wrapped) for key in keys)
        with self._done:
            self._finished[request] = StoreCompletion(request, op, results)
            self._pending -= 1
            self._done.notify_all()
