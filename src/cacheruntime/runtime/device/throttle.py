"""The D2H throttle: write-back issued in pieces, so that backups do not crowd decode's copies.

Backups are queued in pieces of at most `piece_pages` pages and issued one piece per
`execute_batch` (where `d2h_issue` says), per `submit`, and per `poll_completions` when no
batch ran since the last one; `wait_completions`, a restore reading a backup's host copy
and `restart` issue what they need at once. Only when the D2H runs changes; what is
reported, and in which order, does not.

`submit` and `poll_completions` issue one piece even when no compute runs at that moment:
compute runs only inside `execute_batch`, and the next one may start as soon as the call
returns, so a whole backup issued there would be on the copy engine ahead of that batch's
copies, which is what the pieces prevent. Where the caller blocks until the backups are done
(`wait_completions`), nothing is left to protect, and the rest of each backup goes as one
call. The pieces cost the copies nothing on the device: each piece's page index is read in
place by a kernel (`KVMemory`), so a piece issued behind a restore's H2D copies starts when
the piece before it ends, not after the restore.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from cacheruntime.runtime.device.streams import Event, Result

#: Where `execute_batch` issues the throttle's piece: launched right after the batch's
#: compute, so that it runs under it ("under_compute"); after the compute's event, so that
#: it starts when the compute ends ("after_compute"); or once the batch's outputs are on
#: the host ("after_outputs"). Only the timing differs; the benchmark's ITL variants
#: measure them, and docs/bench-h200/history/benchmarks-2026-11-29.md gives the H200's figures behind the default.
D2H_ISSUE_POINTS = ("under_compute", "after_compute", "after_outputs")


class Piece(NamedTuple):
    """A queued piece of a backup: its pages, the events it waits for (first piece only), whether last."""

    transfer: int
    sources: list[int]
    destinations: list[int]
    deps: list[Event] | None
    last: bool


class Results:
    """The results of a backup's pieces: `result()` surfaces the first error of any."""

    def __init__(self, results: list[Result]):
        self._results = results

    def result(self) -> None:
        for result in self._results:
            result.result()


class D2HThrottle:
    """The queue of backup pieces, and which backups still have pieces in it."""

    def __init__(self, piece_pages: int, issue: Callable[[Piece], Result], issued: Callable[[int, Results], None]):
        self.piece_pages = piece_pages
        self.queue: deque[Piece] = deque()
        self.queued: set[int] = set()  # transfers with pieces still queued
        self._results: dict[int, list[Result]] = {}  # their issued pieces' results
        self._issue = issue  # puts one piece on the D2H stream
        self._issued = issued  # told when a backup's last piece is on the stream

    def enqueue(self, transfer_id: int, sources: list[int], destinations: list[int], deps: list[Event]) -> None:
        """Queue backup `transfer_id` in pieces; the first waits for `deps`."""
        size, count = self.piece_pages, len(sources)
        for first in range(0, count, size):
            piece = Piece(transfer_id, sources[first : first + size], destinations[first : first + size], deps if first == 0 else None, first + size >= count)
            self.queue.append(piece)
        self.queued.add(transfer_id)
        self._results[transfer_id] = []

    def pump(self, pieces: int | None = None, until: int | None = None) -> None:
        """Issue queued pieces in order: `pieces` of them, through transfer `until`, or all."""
        queue = self.queue
        while queue and (pieces is None or pieces > 0):
            piece = queue.popleft()
            if pieces is None:  # draining: the rest of this backup goes as one copy, not piece by piece
                while queue and queue[0].transfer == piece.transfer:
                    more = queue.popleft()
                    piece = piece._replace(sources=piece.sources + more.sources, destinations=piece.destinations + more.destinations, last=more.last)
            results = self._results[piece.transfer]
            results.append(self._issue(piece))
            if piece.last:
                del self._results[piece.transfer]
                self.queued.discard(piece.transfer)
                self._issued(piece.transfer, Results(results))
                if until is not None and piece.transfer >= until:
                    return
            if pieces is not None:
                pieces -= 1
