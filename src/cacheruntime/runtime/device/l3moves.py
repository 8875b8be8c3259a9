"""The device side of L3: staging copies on the transfer streams, store I/O on the storage worker.

A persist or fetch is a chain of steps on streams, ordered by events as every transfer is:

- persist, resident: a store put reading the host copies, on the `storage` stream;
- persist, buffer_only: a D2H of the device copies into staging on the D2H stream, after the
  latest compute (O2), then the put reading staging on the `storage` stream;
- fetch: one step on the `storage` stream that reads the objects into staging chunk by chunk
  and copies each chunk to its device pages as soon as its read is in (on CUDA: issues the H2D
  on a CUDA stream of its own, the `fetch` stream), so the copies overlap the reads still
  running; compute waits for the step and its last copy (KV_READY, O1).

The `storage` stream is a host queue (a CPU worker thread, or a simulated stream whose turn the
schedule picks): its step hands the batch to the `StorageWorker`, whose threads do the I/O, and
waits for the completion, so the store I/O never runs on the caller's thread or the compute
stream. A fetch's H2D is issued by that step too, not by the caller: a CUDA stream cannot wait
for a host event, so an H2D the caller issued would have to block the caller until the read is
in, and `prepare_batch` never blocks (§9.4). The step's end is an `AfterHostStep`; only
`execute_batch`, whose compute reads the pages, waits for it. A step's result raises `L3Miss` (a
key had no object) or `L3StoreFailed`; the transfer then fails with `TransferFailure.MISS` or
`STORE` (`failure`). Staging is a host page the ledger deferred behind the transfer, freed only
after the last step (S2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cacheruntime.protocol import TransferFailure, TransferKind
from cacheruntime.runtime.device.memory import KVMemory
from cacheruntime.runtime.device.simulated import Schedule
from cacheruntime.runtime.device.streams import AfterHostStep, Event, Result, Stream, make_stream, on_stream
from cacheruntime.runtime.ledger.records import Transfer
from cacheruntime.storage import InvalidStoreArgument, StorageWorker, Store
from cacheruntime.storage.arguments import check_keys
from cacheruntime.storage.results import Status
from cacheruntime.storage.worker import StoreCompletion

#: Bytes a fetch reads per store request: each chunk's H2D starts once its read is in, so all
#: but the last chunk's copy overlap the reads, and the worker's threads read chunks side by side.
FETCH_CHUNK_BYTES = 16 << 20


class L3Miss(RuntimeError):
    """A fetch found no object under one of its keys (the hint was stale): `TransferFailure.MISS`."""


class L3StoreFailed(RuntimeError):
    """The store failed a persist's write or a fetch's read: `TransferFailure.STORE`."""


def failure(error: BaseException) -> TransferFailure:
    """The outcome an L3 step's error gives its transfer."""
    return TransferFailure.MISS if isinstance(error, L3Miss) else TransferFailure.STORE


class L3Moves:
    """Issues a runtime's persists and fetches; owns the storage worker and the `storage` stream."""

    def __init__(self, store: Store, memory: KVMemory, schedule: Schedule | None, threads: int = 2):
        self.store = store
        self.worker = StorageWorker(store, threads=threads)
        self.memory = memory
        self.schedule = schedule
        self.stream: Stream = make_stream("storage", torch.device("cpu"), schedule=schedule)
        #: pages per store request of a fetch (FETCH_CHUNK_BYTES)
        self.fetch_chunk_pages = max(1, FETCH_CHUNK_BYTES // memory.page_bytes)
        #: the CUDA stream the storage step issues fetch H2Ds on (None on CPU, where it copies)
        self.fetch_stream = torch.cuda.Stream(memory.device) if memory.cuda else None

    def host_views(self, phys: list[int]) -> list[Any]:
        """Host pages `phys` as flat writable byte arrays over the pool (no copy)."""
        l2 = self.memory.l2
        return [l2[p].view(torch.uint8).numpy() for p in phys]

    def launch(self, record: Transfer, d2h: Stream, wait_compute: Callable[[Stream], None]) -> tuple[Event, Result]:
        """Issue one L3 transfer's steps; the event after its last step and that step's result."""
        keys = record.keys
        storage = self.stream
        if record.kind is TransferKind.PERSIST:
            sources = [src for _, src, _ in record.pages]
            staging = [s for _, _, s in record.pages]
            if staging[0] < 0:  # resident: the host copies are the sources
                result = storage.submit(lambda: self._put(keys, self.host_views(sources)))
                return storage.record(), result
            wait_compute(d2h)  # O2: the D2H reads device pages after the compute that wrote them
            copied = d2h.submit(lambda: self.memory.backup(sources, staging))
            copy_event = d2h.record()
            storage.wait(copy_event)
            result = storage.submit(lambda: (copied.result(), self._put(keys, self.host_views(staging))))
            return storage.record(), result
        staging = [s for _, s, _ in record.pages]
        device = [d for _, _, d in record.pages]
        if self.fetch_stream is None:
            result = storage.submit(lambda: self._fetch(keys, staging, device, None))
            return storage.record(), result
        end = AfterHostStep()
        end.step = storage.submit(lambda: self._fetch(keys, staging, device, end))
        return end, end.step

    def _put(self, keys: tuple[str, ...], sources: list[Any]) -> None:
        """Write the objects through the worker and wait for its completion (on the storage stream)."""
        try:
            request = self.worker.submit_put(keys, sources)
        except InvalidStoreArgument as error:
            raise L3StoreFailed(f"the store refused the keys: {error}") from error
        done = self.worker.wait(request)
        bad = [r for r in done.results if r.status is not Status.STORED]
        if bad:
            raise L3StoreFailed(f"the store write failed for {[r.key for r in bad]}: {bad[0].error}")

    def _fetch(self, keys: tuple[str, ...], staging: list[int], device: list[int], end: AfterHostStep | None) -> None:
        """Read the objects into staging, a chunk per store request, and copy each chunk to its
        device pages once its read is in and every earlier one was a hit (on CUDA: issue its H2D
        on the fetch stream, and give `end` the event after the last). Every request is waited
        for before the step ends, a failed one too: the worker writes staging until then (S2).
        """
        try:
            check_keys(keys)
        except InvalidStoreArgument as error:
            raise L3StoreFailed(f"the store refused the keys: {error}") from error
        views, n = self.host_views(staging), self.fetch_chunk_pages
        spans = [(lo, min(lo + n, len(keys))) for lo in range(0, len(keys), n)]
        requests = [self.worker.submit_get(keys[lo:hi], views[lo:hi]) for lo, hi in spans]
        read: list[StoreCompletion] = []
        all_hits = True
        try:
            for (lo, hi), request in zip(spans, requests):
                read.append(done := self.worker.wait(request))
                all_hits = all_hits and all(r.status is Status.HIT for r in done.results)
                if all_hits:
                    self._copy(staging[lo:hi], device[lo:hi])
        finally:
            if end is not None and self.fetch_stream is not None:  # the copies issued write device pages: a failed fetch's too
                end.cuda = self.fetch_stream.record_event()
        results = [r for done in read for r in done.results]
        missing = [r.key for r in results if r.status is Status.MISS]
        if missing:
            raise L3Miss(f"no object under {missing} (removed since l3_exists answered)")
        bad = [r for r in results if r.status is not Status.HIT]
        if bad:
            raise L3StoreFailed(f"the store read failed for {[r.key for r in bad]}: {bad[0].error}")

    def _copy(self, staging: list[int], device: list[int]) -> None:
        """Staging -> device pages: on CPU a copy now; on CUDA an H2D issued on the fetch stream."""
        if self.fetch_stream is None:
            self.memory.restore(staging, device)
            return
        with torch.cuda.device(self.memory.device), on_stream(self.fetch_stream):
            self.memory.restore(staging, device)

    def exists(self, keys: tuple[str, ...]) -> tuple[bool, ...]:
        """Per key, whether the store holds an object now (a hint; a failed query answers False)."""
        try:
            request = self.worker.submit_exists(keys)
        except InvalidStoreArgument:
            return (False,) * len(keys)  # a key the store cannot hold names no object there
        return tuple(r.status is Status.PRESENT for r in self.worker.wait(request).results)

    def read_objects(self, keys: list[str], page_bytes: int) -> dict[str, bytearray]:
        """The objects the store holds under `keys`, read now (for `probe()`)."""
        present = [key for key, there in zip(keys, self.exists(tuple(keys))) if there] if keys else []
        if not present:
            return {}
        buffers = [bytearray(page_bytes) for _ in present]
        done = self.worker.wait(self.worker.submit_get(present, buffers))
        return {r.key: buffer for r, buffer in zip(done.results, buffers) if r.status is Status.HIT}

    def close(self) -> None:
        """Finish the steps queued, then stop the worker (the store stays open: it is the caller's)."""
        self.stream.close()
        self.worker.close()
