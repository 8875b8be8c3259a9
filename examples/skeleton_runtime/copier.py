"""The copy streams: worker threads that move pages between the two memories, truly asynchronously.

One stream per direction (D2H for backups, H2D for restores), each a thread working
through its queue in order, like a CUDA copy stream. A copy that reads a page another
transfer is still writing waits for that transfer's event first (the restore behind a
backup: scenario 1), so ordering across streams is explicit, not an accident of one
queue. `set_delay` holds each transfer back for a while before it copies (DELAY_KNOB):
a restore that forgot to wait for its backup, or a compute that forgot KV_READY, then
reads old bytes for sure, and the conformance suite's `ordering` check sees it.

The copier knows transfers by id and moves bytes only; the ledger decides when a
transfer is complete (`transfers.py`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cacheruntime.protocol import TransferKind

from .ledger import DIRECTION, Transfer
from .memory import Memory


@dataclass
class Job:
    """One transfer's copies, the events it waits for, and the event it sets when its bytes have landed."""

    kind: TransferKind
    pages: tuple[tuple[int, int], ...]  # (source phys, destination phys)
    waits: tuple[threading.Event, ...]
    delay: float
    done: threading.Event


class Copier:
    """Two copy streams over one `Memory`, started with the first transfer."""

    def __init__(self, memory: Memory):
        self._memory = memory
        self._delay = dict.fromkeys(DIRECTION, 0.0)  # the kinds it moves: no L3 (no Persist, no Fetch)
        self._done: dict[int, threading.Event] = {}  # by transfer id, until the ledger completes it
        self._queues: dict[TransferKind, queue.SimpleQueue[Job | None]] = {kind: queue.SimpleQueue() for kind in DIRECTION}
        self._threads: list[threading.Thread] = []

    def set_delay(self, seconds: float, kind: TransferKind | None = None) -> None:
        """Seconds each later transfer of `kind` (None: both) waits before copying."""
        for each in DIRECTION if kind is None else (kind,):
            self._delay[each] = seconds

    def sync(self, transfers: Mapping[int, Transfer]) -> None:
        """Start the transfers the ledger has and the streams have not, in id order; forget the completed ones."""
        for transfer_id in sorted(transfers.keys() - self._done.keys()):
            self._start(transfer_id, transfers[transfer_id])
        for transfer_id in self._done.keys() - transfers.keys():
            del self._done[transfer_id]

    def landed(self, transfer_id: int) -> bool:
        """Whether the transfer's bytes have all been copied."""
        return self._done[transfer_id].is_set()

    def wait(self, transfer_ids: Iterable[int]) -> None:
        """Block until these transfers' bytes have landed."""
        for transfer_id in transfer_ids:
            self._done[transfer_id].wait()

    def drain(self) -> None:
        """Block until every transfer's bytes have landed, then forget them all (restart)."""
        self.wait(self._done)
        self._done.clear()

    def close(self) -> None:
        """Let every queued copy finish, then stop the streams."""
        for kind in DIRECTION:
            self._queues[kind].put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _start(self, transfer_id: int, transfer: Transfer) -> None:
        if not self._threads:
            self._threads = [threading.Thread(target=self._stream, args=(kind,), name=f"skeleton-{kind.value}", daemon=True) for kind in DIRECTION]
            for thread in self._threads:
                thread.start()
        kind = transfer.ticket.kind
        done = self._done[transfer_id] = threading.Event()
        waits = tuple(self._done[other] for other in sorted(transfer.waits_for))
        pages = tuple((src, dst) for _, src, dst in transfer.moves)
        self._queues[kind].put(Job(kind, pages, waits, self._delay[kind], done))

    def _stream(self, kind: TransferKind) -> None:
        source, destination = DIRECTION[kind]
        while (job := self._queues[kind].get()) is not None:
            for event in job.waits:
                event.wait()
            if job.delay:
                time.sleep(job.delay)
            for src, dst in job.pages:
                self._memory.copy(source, src, destination, dst)
            job.done.set()
