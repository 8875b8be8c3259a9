"""The device layer: KV memory, ReqToToken, streams and events, the runner, the D2H throttle.

It does what the ledger has decided, after the call committed: writes ReqToToken, issues
transfers on their streams, runs compute. Ordering (the reason the runtime exists):

- restores start on the H2D stream; a restore whose host source a backup still fills
  waits for that backup's event (scenario 1);
- compute waits for the KV_READY event of every restore of a page it reads (O1), then
  runs, then records a compute event;
- a backup's D2H waits for the latest compute event before it reads device pages (O2);
- the ledger frees a physical page only once every transfer on it completed (O3), and
  compute never outlives `execute_batch`, which returns with the outputs on the host.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from cacheruntime.protocol import Tier, TransferFailure, TransferKind
from cacheruntime.runtime.device.deadstreams import StreamDead, StreamWorkerDied, device_broken
from cacheruntime.runtime.device.l3moves import L3Miss, L3Moves, L3StoreFailed
from cacheruntime.runtime.device.l3moves import failure as l3_failure
from cacheruntime.runtime.device.memory import KVMemory
from cacheruntime.runtime.device.ordering import Ordering
from cacheruntime.runtime.device.reqtotoken import ReqToToken
from cacheruntime.runtime.device.runner import ComputeBatch, DecoderConfig, Runner, make_runner
from cacheruntime.runtime.device.simulated import Schedule, SimResult
from cacheruntime.runtime.device.streams import CpuResult, Event, Failed, Result, Stream, make_stream
from cacheruntime.runtime.device.throttle import D2H_ISSUE_POINTS, D2HThrottle, Piece, Results
from cacheruntime.runtime.ledger.l3 import L3_KINDS
from cacheruntime.runtime.ledger.records import Transfer
from cacheruntime.storage.store import Store

#: Where the streams' work runs: "threads" (one worker per stream on CPU; CUDA streams on a
#: GPU) or "simulated" (CPU: the interleaving picked by a seeded schedule, `simulated.py`).
STREAM_KINDS = ("threads", "simulated")


#: Where an injected copy fault strikes (spec/faults.md): when the copy is issued (it never
#: reaches its stream) or on the stream while it runs. The protocol outcome is the same.
COPY_FAULT_SITES = ("issue", "stream")
#: Where an injected compute fault strikes: the runner raises before it writes KV, or after.
COMPUTE_FAULT_SITES = ("before_writes", "after_writes")


class InjectedFault(RuntimeError):
    """The error an injected fault raises where a real copy or runner error would (FAULT_INJECTION)."""


@attrs.frozen
class Launched:
    """A transfer issued to its stream: the event after its copy, and the copy's result."""

    event: Event
    result: Result | Results | Failed


class DeviceLayer:
    """Everything physical of a `LocalGPURuntime`; the ledger's records are read here, never changed."""

    def __init__(
        self,
        *,
        device: str,
        page_size: int,
        max_requests: int,
        max_request_tokens: int,
        l1_pages: int,
        l2_pages: int,
        runner: str | Runner,
        config: DecoderConfig,
        seed: int,
        d2h_bytes_per_batch: int | None,
        d2h_issue: str,
        memory_class: type[KVMemory] = KVMemory,
        ordering_class: type[Ordering] = Ordering,
        streams: str = "threads",
        schedule_seed: int = 0,
        store: Store | None = None,
    ):
        if d2h_issue not in D2H_ISSUE_POINTS:
            raise ValueError(f"d2h_issue must be one of {', '.join(D2H_ISSUE_POINTS)}, not {d2h_issue!r}")
        if streams not in STREAM_KINDS:
            raise ValueError(f"streams must be one of {', '.join(STREAM_KINDS)}, not {streams!r}")
        self.device = torch.device(device)
        if streams == "simulated" and self.device.type != "cpu":
            raise ValueError(f"simulated streams run on the CPU only, not on {device!r}: use streams='threads' there")
        self.runner: Runner = make_runner(runner, config, max_request_tokens, self.device, seed) if isinstance(runner, str) else runner
        try:
            self.memory = memory_class(
                device=self.device,
                l1_pages=l1_pages,
                l2_pages=l2_pages,
                page_size=page_size,
                layers=config.layers,
                heads=config.heads,
                head_dim=config.head_dim,
                dtype=config.torch_dtype,
            )
        except (RuntimeError, MemoryError) as error:  # the host pool is pinned: the OS may refuse it
            raise ValueError(
                f"the KV pools could not be allocated (l1_pages={l1_pages} on {device}, l2_pages={l2_pages} pinned on the host): {error}; "
                "lower l1_pages or l2_pages"
            ) from error
        self.req_to_token = ReqToToken(max_requests, max_request_tokens, page_size, self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # weights and pools were filled on the default stream
        #: The seeded interleaving of simulated streams (None on thread and CUDA streams).
        self.schedule = Schedule(schedule_seed) if streams == "simulated" else None
        self.compute: Stream = make_stream("compute", self.device, schedule=self.schedule)
        self.h2d: Stream = make_stream("h2d", self.device, schedule=self.schedule)
        self.d2h: Stream = make_stream("d2h", self.device, schedule=self.schedule)
        self._finalizer = weakref.finalize(self, _close_streams, (self.compute, self.h2d, self.d2h))
        self.ordering = ordering_class()
        self.launched: dict[int, Launched] = {}
        self.compute_event: Event | None = None
        self.delay = {TransferKind.BACKUP: 0.0, TransferKind.RESTORE: 0.0}
        piece_pages = None if d2h_bytes_per_batch is None else max(1, d2h_bytes_per_batch // self.memory.page_bytes)
        self.throttle = None if piece_pages is None else D2HThrottle(piece_pages, self._issue_piece, self._backup_issued)
        self.d2h_issue = d2h_issue
        self.executed_since_pump = False
        #: Injected faults (FAULT_INJECTION): where a doomed copy fails, per kind; launches left
        #: until a stream worker dies (LOST); where an injected compute fault strikes.
        self.copy_fault_site = {TransferKind.BACKUP: "stream", TransferKind.RESTORE: "stream"}
        self.launches_until_lost: int | None = None
        self.compute_fault_site = "before_writes"
        self._piece_pages = piece_pages
        #: The L3 tier's steps and store I/O (None without a store).
        self.l3 = None if store is None else L3Moves(store, self.memory, self.schedule)

    # -- transfers ---------------------------------------------------------------------

    def launch_all(self, transfer_ids: list[int], transfers: dict[int, Transfer], doomed: set[int] | frozenset[int] = frozenset()) -> None:
        """Issue the transfers a call started, in id order, each on its stream; the `doomed` ones fail."""
        for transfer_id in transfer_ids:
            self.launch(transfer_id, transfers[transfer_id], transfer_id in doomed)

    def launch(self, transfer_id: int, record: Transfer, doomed: bool = False) -> None:
        """Issue one transfer after the transfers it waits for (a backup: through the throttle).

        A `doomed` copy (an injected fault) fails at the site `copy_fault_site` names, and
        the stream worker running the launch that `launches_until_lost` counts down to dies.
        """
        if record.kind in L3_KINDS:
            assert self.l3 is not None, "the ledger starts L3 transfers only on a runtime with a store"
            event, result = self.l3.launch(record, self.d2h, self._wait_compute)
            self.launched[transfer_id] = Launched(event, result)
            return
        backup = record.kind is TransferKind.BACKUP
        throttle = self.throttle
        if throttle is not None and throttle.queued and not record.waits_for.isdisjoint(throttle.queued):
            throttle.pump(until=max(record.waits_for & throttle.queued))  # a restore reads a queued backup's host copy
        deps = [self.launched[w].event for w in sorted(record.waits_for) if w in self.launched]
        sources = [src for _, src, _ in record.pages]
        destinations = [dst for _, _, dst in record.pages]
        dies = self._count_launch_toward_lost()
        if backup and throttle is not None and not (doomed or dies):
            throttle.enqueue(transfer_id, sources, destinations, deps)
            return
        stream = self.d2h if backup else self.h2d
        self.ordering.wait_transfer_deps(stream, deps)
        if backup:
            self.ordering.wait_compute(stream, self.compute_event)
        delay = self.delay[record.kind]
        if delay:
            stream.sleep(delay)
        move = self.memory.backup if backup else self.memory.restore
        result: Result | Failed
        if dies:
            result = stream.submit(_die)
        elif doomed and self.copy_fault_site[record.kind] == "issue":
            result = Failed(InjectedFault(f"injected: the copy of transfer {transfer_id} failed at issue"))
        elif doomed:
            result = stream.submit(functools.partial(_fail, f"injected: the copy of transfer {transfer_id} failed on its stream"))
        else:
            result = stream.submit(lambda: move(sources, destinations))
        self.launched[transfer_id] = Launched(stream.record(), result)

    def _wait_compute(self, stream: Stream) -> None:
        self.ordering.wait_compute(stream, self.compute_event)

    def failures(self, transfer_ids: Iterable[int]) -> dict[int, TransferFailure]:
        """The outcome of each of `transfer_ids` (launched, failed) that is an L3 transfer: MISS or STORE."""
        found: dict[int, TransferFailure] = {}
        if self.l3 is None:
            return found
        for t in transfer_ids:
            launched = self.launched.get(t)
            if launched is None:
                continue
            try:
                launched.result.result()
            except (L3Miss, L3StoreFailed) as error:
                found[t] = l3_failure(error)
            except Exception:
                continue
        return found

    def _count_launch_toward_lost(self) -> bool:
        """One more launch: whether it is the one whose stream worker dies (an injected LOST fault)."""
        if self.launches_until_lost is None:
            return False
        self.launches_until_lost -= 1
        if self.launches_until_lost:
            return False
        self.launches_until_lost = None
        return True

    def _issue_piece(self, piece: Piece) -> Result:
        """Put one throttled backup piece on the D2H stream, after its dependencies and the latest compute (O2)."""
        stream = self.d2h
        if piece.deps is not None:
            self.ordering.wait_transfer_deps(stream, piece.deps)
        self.ordering.wait_compute(stream, self.compute_event)  # after the latest compute, hence after the one that wrote the pages
        if piece.deps is not None and self.delay[TransferKind.BACKUP]:
            stream.sleep(self.delay[TransferKind.BACKUP])
        backup, sources, destinations = self.memory.backup, piece.sources, piece.destinations
        return stream.submit(lambda: backup(sources, destinations))

    def _backup_issued(self, transfer_id: int, results: Results) -> None:
        self.launched[transfer_id] = Launched(self.d2h.record(), results)

    def pump(self, pieces: int | None = None) -> None:
        """Issue `pieces` queued backup pieces (all of them by default)."""
        if self.throttle is not None and self.throttle.queue:
            self.throttle.pump(pieces)

    def pump_after_submit(self) -> None:
        """After a submit: one queued backup piece, so that backups submitted between batches move on."""
        if self.throttle is not None and self.throttle.queue:
            self.pump(1)
            self.executed_since_pump = False

    def pump_idle(self) -> None:
        """At a poll: if no batch ran since the last one, one piece, so that the D2H still moves on."""
        if not self.executed_since_pump:
            self.pump(1)
        self.executed_since_pump = False

    def done(self, transfer_ids: list[int]) -> tuple[set[int], set[int], dict[int, TransferFailure]]:
        """Which of `transfer_ids` have finished on their streams: (landed, failed, the L3 ones' outcomes).

        A copy that raised (at issue, or on its stream) failed; a dead stream raises `StreamDead`.
        """
        launched = self.launched
        done = {t for t in transfer_ids if t in launched and launched[t].event.query()}
        return done - (failed := self.failed_of(done)), failed, self.failures(failed)

    def outcomes(self, transfer_ids: Iterable[int]) -> tuple[set[int], bool, dict[int, TransferFailure]]:
        """(failed, not abandoned, the L3 ones' outcomes) of launched transfers, for `Ledger.restart`."""
        failed = self.failed_of(transfer_ids)
        return failed, False, self.failures(failed)

    def failed_of(self, transfer_ids: Iterable[int]) -> set[int]:
        """Those of `transfer_ids` (launched) whose copy raised; blocks until each has run.

        `StreamDead` (the machinery is gone) propagates: it is not a failed copy.
        """
        failed = set()
        for t in transfer_ids:
            try:
                self.launched[t].result.result()
            except StreamDead:
                raise
            except Exception as error:
                if device_broken(error):
                    raise  # not this copy's failure: the device's (RuntimeFault)
                failed.add(t)
        return failed

    def wait_all(self, transfer_ids: list[int]) -> tuple[list[Launched], set[int], dict[int, TransferFailure]]:
        """Issue everything queued; the launches, to synchronize on, those whose copy failed, the L3 ones' outcomes."""
        self.pump()
        pending = [self.launched[t] for t in transfer_ids]
        failed = self.failed_of(transfer_ids)
        return pending, failed, self.failures(failed)

    def alive(self) -> bool:
        """Whether every stream's worker still runs (a dead one is found directly, never by a timeout)."""
        return self.compute.alive and self.h2d.alive and self.d2h.alive

    def broken(self) -> bool:
        """Whether a stream saw the CUDA device break (a sticky error: `DeviceBroken`)."""
        return any(getattr(stream, "broken", False) for stream in (self.compute, self.h2d, self.d2h))

    def replace_streams(self) -> None:
        """After RuntimeLost: new streams and an empty throttle; every launch is forgotten (restart)."""
        self._finalizer()
        piece_pages = self._piece_pages
        if self.schedule is not None:
            self.schedule.streams.clear()
        self.compute = make_stream("compute", self.device, schedule=self.schedule)
        self.h2d = make_stream("h2d", self.device, schedule=self.schedule)
        self.d2h = make_stream("d2h", self.device, schedule=self.schedule)
        self._finalizer = weakref.finalize(self, _close_streams, (self.compute, self.h2d, self.d2h))
        if self.l3 is not None:
            self.l3.stream.close()
            self.l3.stream = make_stream("storage", torch.device("cpu"), schedule=self.schedule)
        self.throttle = None if piece_pages is None else D2HThrottle(piece_pages, self._issue_piece, self._backup_issued)
        self.launched = {}
        self.compute_event = None

    def forget(self, in_flight: dict[int, Transfer]) -> None:
        """Drop the launches of transfers the ledger completed."""
        self.launched = {t: launched for t, launched in self.launched.items() if t in in_flight}

    def drain(self) -> None:
        """Finish every queued and issued piece of work (a restart discards the transfers afterwards)."""
        self.pump()
        for stream in (self.compute, self.h2d, self.d2h):
            stream.synchronize()
        if self.l3 is not None:
            self.l3.stream.synchronize()
            for stream in (self.h2d, self.d2h):  # a fetch's H2D and a persist's put follow their storage step
                stream.synchronize()
            self.l3.stream.synchronize()
        self.compute_event = None

    # -- ReqToToken and compute --------------------------------------------------------

    def write_req_to_token(self, slots: list[int], page_index: list[int], phys: list[int]) -> None:
        """Map pages into ReqToToken on the compute stream (compute reads it in stream order)."""
        self.req_to_token.write(self.compute, slots, page_index, phys)

    def run_compute(
        self,
        items: ComputeBatch,
        kv_ready: dict[int, Launched],
        started: list[int],
        transfers: dict[int, Transfer],
        doomed: set[int] | frozenset[int] = frozenset(),
        fault: str | None = None,
    ) -> list[int]:
        """Run the batch after its restores (O1); record the compute event; launch the transfers `started`.

        A runner that raises (at once on CUDA, at its result on CPU) raises here before any
        of `started` is launched, so the failed batch's intents never reach a stream.
        """
        self.ordering.wait_kv_ready(self.compute, [launched.event for launched in kv_ready.values()])
        runner, memory, table = self.runner, self.memory, self.req_to_token.table
        reads = {t: launched.result for t, launched in kv_ready.items()}
        result = self.compute.submit(functools.partial(_forward, runner, memory, table, items, functools.partial(self.ordering.failed_reads, reads), fault))
        issue, queued = self.d2h_issue, self.throttle is not None and bool(self.throttle.queue)
        if issue == "under_compute" and queued:
            # Every queued piece belongs to a backup started before this batch, so the compute
            # event its D2H waits for (O2) is still the previous batch's: it runs under this compute.
            self.pump(1)
        # On a CPU (or simulated) stream the forward's result is itself an event, set when the
        # worker has run it: the point a record here would mark, as nothing else is queued on
        # the compute stream in between. Using it saves the worker a second wake-up per batch.
        self.compute_event = result if isinstance(result, CpuResult | SimResult) else self.compute.record()
        if started:
            result.result()  # the runner's error, if any, before the batch's backups are issued
        self.launch_all(started, transfers, doomed)
        if issue == "after_compute":
            self.pump(1)  # waits for this batch's compute event
        self.executed_since_pump = True
        # Read the outputs in the compute stream's order: that one wait covers the batch.
        # On CPU the forward's own result is that point (its worker ran it in order).
        if self.device.type == "cuda":
            outputs = self.compute.submit(lambda: result.result().tolist()).result()
        else:
            outputs = result.result().tolist()
        if issue == "after_outputs":
            self.pump(1)  # the copy engine is free of this batch's output read
        return runner.finish(outputs, items)

    def read_tags(self) -> dict[Tier, list[int]]:
        """Every physical page's tags, decoded from the bytes after the compute stream's work (flat, as `Pool.tags`)."""
        runner, memory = self.runner, self.memory
        l1, l2 = memory.l1.shape[2], memory.l2.shape[0]
        result = self.compute.submit(
            lambda: {
                Tier.L1: runner.page_tags(memory.read_l1(list(range(l1)))),  # type: ignore[attr-defined]
                Tier.L2: runner.page_tags(memory.read_l2(list(range(l2)))),  # type: ignore[attr-defined]
            }
        )
        self.compute.record().synchronize()
        values: dict[Tier, Any] = result.result()
        return {tier: tensor.flatten().tolist() for tier, tensor in values.items()}

    def close(self) -> None:
        """Drain the streams and stop their workers (and the storage worker)."""
        self._finalizer()
        if self.l3 is not None:
            self.l3.close()


def _die() -> None:
    """An injected LOST fault: the stream worker running this dies."""
    raise StreamWorkerDied


def _fail(what: str) -> None:
    """An injected copy fault on the stream: the copy raises where a real one would."""
    raise InjectedFault(what)


class ReadsFailed(RuntimeError):
    """Compute found, once its KV_READY waits were done, that a restore it reads failed: it does not run."""

    def __init__(self, transfer_ids: list[int]):
        self.transfer_ids = transfer_ids
        super().__init__(f"restores {transfer_ids} that compute reads failed")


def _forward(runner: Runner, memory: KVMemory, table: torch.Tensor, items: ComputeBatch, failed_reads: Callable[[], list[int]], fault: str | None) -> Any:
    """Compute on its stream: first the outcome of the restores it waited for (KV_READY,
    `Ordering.failed_reads`), then the runner; an injected compute fault raises before the
    runner writes KV, or after (its writes then lie only where no executed batch wrote: the
    failed batch's own positions, spec §4.5)."""
    failed = failed_reads()
    if failed:
        raise ReadsFailed(failed)
    if fault == "before_writes":
        raise InjectedFault("injected: the runner raised before writing KV")
    output = runner.forward(memory, table, items)
    if fault == "after_writes":
        raise InjectedFault("injected: the runner raised after writing KV")
    return output


def _close_streams(streams: tuple[Stream, ...]) -> None:
    """Stop the streams after their queued work (at `close`, collection or interpreter exit)."""
    for stream in streams:
        stream.close()
