"""The `storage` mutants: `LocalGPURuntime` with L3 whose ledger gets one step of §9 wrong.

Each is the L3 conformance configuration (`cacheruntime.runtime.factories.conformance_l3`, in
the host mode the bug needs) with a `ledger_class` that overrides one public method of the
ledger's L3 section (`cacheruntime.runtime.ledger.l3`); the device layer moves bytes as the
ledger's records say, so a wrong record is a wrong move. The `storage` check kills them: it is
the one that gives a runtime its store and persists and fetches (`KILLED_BY`).
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from cacheruntime.conformance.storage import SuiteStore
from cacheruntime.protocol import Persist, Tier, TransferFailure, TransferKind, TransferTicket
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, suite_streams
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.ledger.l3 import NO_STAGING
from cacheruntime.runtime.ledger.pages import new_copy
from cacheruntime.runtime.ledger.records import VALID, Copy
from cacheruntime.runtime.local import LocalGPURuntime


class _Mutant(LocalGPURuntime):
    """The L3 conformance runtime in `host_mode` with the seams a mutant names."""

    invariant = ""
    host_mode_name = "buffer_only"
    parts: ClassVar[dict[str, Any]] = {}

    def __init__(self, device: str = "cpu", store: str = "file", l3: Any = None, **options: Any):
        own = SuiteStore(store) if l3 is None else None
        super().__init__(
            device=device,
            **{**CONFORMANCE_OPTIONS, **suite_streams(device), **self.parts, **options},
            host_mode=self.host_mode_name,
            l3=l3 if own is None else own,
        )
        if own is not None:  # a runtime leaves its store open (the store is the caller's): this one is ours
            weakref.finalize(self, own.close)


class _StagingFreedAtStartLedger(Ledger):
    def start_l3_transfer(self, kind: TransferKind, generation: int, moves: list[tuple[int, int, int]], keys: tuple[str, ...]) -> TransferTicket:
        ticket = super().start_l3_transfer(kind, generation, moves, keys)
        if kind is TransferKind.PERSIST:
            pool = self.state.pools[Tier.L2]
            for _, _, staging in moves:
                if staging != NO_STAGING and pool.deferred.pop(staging, None) is not None:
                    pool.free.append(staging)
        return ticket


class _StoreFailureDropsDeviceLedger(Ledger):
    def fail_l3(self, transfer_id: int, failure: TransferFailure) -> None:
        record = self.state.transfers[transfer_id]
        super().fail_l3(transfer_id, failure)
        if record.kind is TransferKind.PERSIST:
            for name, _, _ in record.pages:
                page = self.state.pages.get(name)
                if page is not None and Tier.L1 in page.copies:
                    self.drop_copy(name, Tier.L1)


class _MissTakenForHitLedger(Ledger):
    def fail_l3(self, transfer_id: int, failure: TransferFailure) -> None:
        if failure is TransferFailure.MISS:
            self.complete_l3(transfer_id)
            return
        super().fail_l3(transfer_id, failure)


class _ReadFailureTakenForHitLedger(Ledger):
    def fail_l3(self, transfer_id: int, failure: TransferFailure) -> None:
        if failure is TransferFailure.STORE and self.state.transfers[transfer_id].kind is TransferKind.FETCH:
            self.complete_l3(transfer_id)
            return
        super().fail_l3(transfer_id, failure)


class _PersistRotatesSourcesLedger(Ledger):
    def start_persist(self, intent: Persist, pages: tuple[int, ...]) -> TransferTicket:
        ticket = super().start_persist(intent, pages)
        moves = self.state.transfers[ticket.transfer_id].pages
        sources = [src for _, src, _ in moves]
        moves[:] = [(name, src, staging) for (name, _, staging), src in zip(moves, sources[1:] + sources[:1])]
        return ticket


class _HostCopyKeptLedger(Ledger):
    def complete_l3(self, transfer_id: int) -> None:
        record = self.state.transfers[transfer_id]
        super().complete_l3(transfer_id)
        if record.kind is not TransferKind.PERSIST:
            return
        free = self.state.pools[Tier.L2].free
        for name, _, staging in record.pages:
            page = self.state.pages.get(name)
            if staging != NO_STAGING and page is not None and Tier.L2 not in page.copies and staging in free:
                free.remove(staging)
                page.copies[Tier.L2] = new_copy(Copy, (staging, VALID))


class _DeviceFreesSkippedOnLandingLedger(Ledger):
    def complete_l3(self, transfer_id: int) -> None:
        device = self.state.pools[Tier.L1]
        deferred, device.deferred = device.deferred, {}  # out of the landing's reach: only the host pool's frees run
        try:
            super().complete_l3(transfer_id)
        finally:
            device.deferred = deferred


class StagingReusedBeforeStoreWrite(_Mutant):
    """A buffer_only persist's staging host pages go back on the free list when it starts, not after its store write."""

    invariant = "S2"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _StagingFreedAtStartLedger}


class StoreFailureDropsDeviceCopy(_Mutant):
    """A buffer_only persist whose store write fails drops the device copies it read (the only ones)."""

    invariant = "F1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _StoreFailureDropsDeviceLedger}


class FetchMissReportedAsHit(_Mutant):
    """A fetch whose object is gone lands as a hit, with the bytes the runtime last knew under that key."""

    invariant = "S3"
    host_mode_name = "resident"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _MissTakenForHitLedger}


class FetchReadFailureReportedAsHit(_Mutant):
    """A fetch whose store read failed lands as a hit: its pages take whatever staging held, and its batch computes."""

    invariant = "S3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ReadFailureTakenForHitLedger}


class PersistWritesAnotherPage(_Mutant):
    """A persist writes each object from the next page's copy: every key holds another page's bytes."""

    invariant = "S3"
    host_mode_name = "resident"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _PersistRotatesSourcesLedger}


class BufferOnlyKeepsHostCopy(_Mutant):
    """In buffer_only mode a landed persist keeps its staging host page as the page's host copy."""

    invariant = "S1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _HostCopyKeptLedger}


class DeviceFreesSkippedOnLanding(_Mutant):
    """A landed L3 transfer runs the host pool's deferred frees only: device pages whose names ended under it stay deferred forever."""

    invariant = "R1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _DeviceFreesSkippedOnLandingLedger}


class DeviceFreesSkippedOnFetchLanding(DeviceFreesSkippedOnLanding):
    """The same in resident mode, where only a fetch uses device pages: a cancelled fetch's device pages stay deferred forever."""

    host_mode_name = "resident"


#: name -> mutant class
MUTANTS = {
    "staging_reused_before_store_write": StagingReusedBeforeStoreWrite,
    "store_failure_drops_device_copy": StoreFailureDropsDeviceCopy,
    "fetch_miss_reported_as_hit": FetchMissReportedAsHit,
    "fetch_read_failure_reported_as_hit": FetchReadFailureReportedAsHit,
    "persist_writes_another_page": PersistWritesAnotherPage,
    "buffer_only_keeps_host_copy": BufferOnlyKeepsHostCopy,
    "device_frees_skipped_on_landing": DeviceFreesSkippedOnLanding,
    "device_frees_skipped_on_fetch_landing": DeviceFreesSkippedOnFetchLanding,
}
