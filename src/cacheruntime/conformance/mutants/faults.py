"""Mutants on the failure paths of `LocalGPURuntime` (issue 17): each mishandles one fault.

A fault is a typed outcome that loses nothing (spec/protocol.md §4.11, §4.15, §5.3): a
failed copy leaves its destination absent and its source readable; write-back keeps the
device copy until the backup lands; a failed batch leaves nothing visible; a lost
machinery refuses every call until restart. Each mutant here breaks one of those on one
seam (a `ledger_class` with one wrong public method, or the runtime's fault handling), the
way an engine's error path goes wrong. The `faults` check, which injects faults
(FAULT_INJECTION), must kill every one; the write-back mutant dies wherever a Demote meets
a backup in flight.
"""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from cacheruntime.protocol import PreparedBatchHandle, RuntimeFault, Tier
from cacheruntime.runtime.device.ordering import Ordering
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, suite_streams
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.local import LocalGPURuntime


class _Mutant(LocalGPURuntime):
    """The conformance runtime with the seams a mutant names."""

    invariant = ""
    parts: ClassVar[dict[str, Any]] = {}

    def __init__(self, device: str = "cpu", **options: Any):
        super().__init__(device=device, **{**CONFORMANCE_OPTIONS, **suite_streams(device), **self.parts, **options})


class _FailedCopyValidLedger(Ledger):
    def fail_transfer(self, transfer_id: int) -> None:
        self.complete_transfer(transfer_id)  # the failed copy is taken for landed


class _DemoteDropsAtOnceLedger(Ledger):
    def drop_or_keep_until_landed(self, name: int, tier: Tier) -> None:
        if tier in self.state.pages[name].copies:
            self.drop_copy(name, tier)  # write-back as it was: the source goes before its copy lands


class _FailureKeepsDroppingLedger(Ledger):
    def fail_transfer(self, transfer_id: int) -> None:
        record = self.state.transfers[transfer_id]
        src_tier, _ = record.tiers
        dropping = [(name, self.state.pages[name].copies.get(src_tier)) for name, _, _ in record.pages if name in self.state.pages]
        super().fail_transfer(transfer_id)
        for name, copy in dropping:  # the demote (or drop) stays in force: the copy is still to go
            if copy is not None and name in self.state.pages:
                self.state.pages[name].copies[src_tier] = copy


class FailedCopyMarkedValid(_Mutant):
    """A copy that failed is completed as if it had landed: its destination is marked valid, unwritten."""

    invariant = "D1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _FailedCopyValidLedger}


class DemoteDropsAtOnce(_Mutant):
    """Demote drops the device copy at once while its backup is still in flight (write-back loses the page if it fails)."""

    invariant = "F1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _DemoteDropsAtOnceLedger}


class FailureKeepsDropping(_Mutant):
    """A failed backup leaves the demoted device copy dropping, as if a later landing would still come."""

    invariant = "F1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _FailureKeepsDroppingLedger}


class FailedBatchCommitted(_Mutant):
    """A batch whose compute failed keeps what the call changed (rows advanced) and is reported failed."""

    invariant = "F2"

    def fail_batch(self, batch: PreparedBatchHandle, cause: str, lost_reads: set[int], injected: bool, error: BaseException | None = None) -> NoReturn:
        self.ledger.txn.journal = None  # nothing is undone
        super().fail_batch(batch, cause, lost_reads, injected, error)


class _ReadsNeverFailOrdering(Ordering):
    def failed_reads(self, restores: dict[int, Any]) -> list[int]:
        return []


class ReadsOfFailedRestoreServed(_Mutant):
    """Compute runs over pages whose restore failed, as if KV_READY meant landed (O1 on a failed copy)."""

    invariant = "O1"
    parts: ClassVar[dict[str, Any]] = {"ordering_class": _ReadsNeverFailOrdering}


class ReadsOfReportedFailureServed(_Mutant):
    """A batch attaching pages whose restore failed, and was reported, before it executes computes over them."""

    invariant = "O1"

    def fail_if_unreadable(self, batch: PreparedBatchHandle, unreadable: tuple[int, ...]) -> None:
        return None


class LostMachineryServes(_Mutant):
    """A dead stream worker goes unnoticed: calls are served, and what waits on it fails untyped."""

    invariant = "F1"

    def check_machinery(self, operation: str) -> None:
        return None

    def machinery_fault(self, error: BaseException) -> RuntimeFault | None:
        return None


#: name -> mutant class
MUTANTS = {
    "failed_copy_marked_valid": FailedCopyMarkedValid,
    "demote_drops_at_once": DemoteDropsAtOnce,
    "failure_keeps_dropping": FailureKeepsDropping,
    "failed_batch_committed": FailedBatchCommitted,
    "reads_of_failed_restore_served": ReadsOfFailedRestoreServed,
    "reads_of_reported_failure_served": ReadsOfReportedFailureServed,
    "lost_machinery_serves": LostMachineryServes,
}
