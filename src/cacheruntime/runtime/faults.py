"""The runtime's side of failure: faults injected on purpose, and machinery found gone.

FAULT_INJECTION lets a test make the Nth backup or restore that moves a page, the Nth
compute, or the stream worker of the Nth launch fail, at a chosen site (spec/faults.md);
the failure then travels the same path a real one does: a copy that raises on its
stream, a runner that raises, a worker that stops. A dead stream worker is found
directly, by the liveness flag every stream keeps and every call checks, never by a
timeout; from then on every call but `info` and `restart` raises `RuntimeFault`
(spec/protocol.md §4.15), and `restart` replaces the streams. A broken CUDA device (a
sticky asynchronous error, `DeviceBroken`) is found where CUDA reports it (a launch, a
wait, an event's query) and refused the same way, except that `restart` cannot recover it:
it raises `RuntimeFault` too, saying that only a new process can.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from cacheruntime.protocol import ComputeFailed, FaultKind, InvalidArgument, PreparedBatchHandle, RuntimeFault, TransferKind
from cacheruntime.runtime.device.deadstreams import DeviceBroken, StreamDead, device_broken
from cacheruntime.runtime.device.layer import COMPUTE_FAULT_SITES, COPY_FAULT_SITES
from cacheruntime.runtime.ledger.arguments import int_argument

if TYPE_CHECKING:
    from cacheruntime.runtime.device.layer import DeviceLayer
    from cacheruntime.runtime.ledger import Ledger


class FaultHandling:
    """What `LocalGPURuntime` does about faults; it keeps `ledger`, `device_layer` and `lost_cause`."""

    ledger: Ledger
    device_layer: DeviceLayer
    lost_cause: str
    device_is_broken = False  # a sticky CUDA error was seen: restart cannot help (DeviceBroken)

    if TYPE_CHECKING:

        def commit(self) -> None: ...

    def inject_fault(self, kind: FaultKind, nth: int, *, site: str | None = None) -> None:
        """Test-only: make the `nth` transfer of `kind` that moves a page, the `nth` compute, or
        (LOST) the stream worker of the `nth` launch from now fail (FAULT_INJECTION).

        `site` picks where it strikes (spec/faults.md): a copy fault at `"issue"` or on its
        `"stream"` (default), a compute fault `"before_writes"` (default) or `"after_writes"`.
        """
        if not isinstance(kind, FaultKind):
            raise InvalidArgument(f"inject_fault takes a FaultKind, not {kind!r}")
        int_argument("nth", nth)
        if nth < 1:
            raise InvalidArgument(f"nth counts from 1, got {nth}")
        sites = COMPUTE_FAULT_SITES if kind is FaultKind.COMPUTE else COPY_FAULT_SITES
        if site is not None and (kind is FaultKind.LOST or site not in sites):
            raise InvalidArgument(
                f"a {kind.value} fault strikes at one of {', '.join(sites) if kind is not FaultKind.LOST else 'no chosen site'}, not {site!r}"
            )
        layer = self.device_layer
        if kind is FaultKind.LOST:
            layer.launches_until_lost = nth
        elif kind is FaultKind.COMPUTE:
            layer.compute_fault_site = site or "before_writes"
            self.ledger.inject_fault(kind, nth)
        else:
            layer.copy_fault_site[TransferKind(kind.value)] = site or "stream"
            self.ledger.inject_fault(kind, nth)

    def fail_batch(self, batch: PreparedBatchHandle, cause: str, lost_reads: set[int], injected: bool, error: BaseException | None = None) -> NoReturn:
        """The batch's compute cannot run or failed: undo the call, fail the restores it read that
        failed, fail the batch and its dependents, commit that, raise ComputeFailed (§4.5, F2)."""
        if error is not None and device_broken(error):
            raise error  # the machinery is gone (RuntimeFault, by the call's wrapper), not this batch's compute
        ledger = self.ledger
        ledger.txn.rollback()
        failures = self.device_layer.failures(lost_reads)
        for transfer_id in sorted(lost_reads):
            ledger.fail_with(transfer_id, failures)
        failed = ledger.fail_batches(batch.batch_id)
        if injected:
            ledger.count_toward_fault(FaultKind.COMPUTE)  # the rollback undid the count: the fault is spent
        self.commit()
        raise ComputeFailed(f"batch {batch.batch_id} failed: {cause}; batches {list(failed)} failed", failed, cause) from error

    def fail_if_unreadable(self, batch: PreparedBatchHandle, unreadable: tuple[int, ...]) -> None:
        """A batch that reads pages whose restore failed before this execute (and was reported)
        fails as one whose KV_READY wait finds the restore failed (§4.5)."""
        if unreadable:
            self.fail_batch(batch, f"pages {list(unreadable)} it reads have no device copy: their restore failed", set(), False)

    def compute_fault_due(self) -> bool:
        """Whether an injected COMPUTE fault picks this execute_batch (it reached compute). The count
        is journaled, so that a batch that fails for another reason (a failed read) leaves it."""
        ledger = self.ledger
        if not ledger.state.faults:
            return False
        if ledger.txn.journal is None:
            ledger.txn.start_journal()
        return ledger.count_toward_fault(FaultKind.COMPUTE)

    def check_machinery(self, operation: str) -> None:
        """RuntimeFault at once while the machinery is gone (a stream worker died); `info` and `restart`
        still run, except a `restart` on a broken device: no stream on it would run."""
        if operation == "restart" and self.device_is_broken:
            raise RuntimeFault(f"restart: {self.lost_cause}; the CUDA context stays broken in this process: only a new process recovers")
        state = self.ledger.state
        if not state.lost and self.device_layer.alive():
            return
        if not state.lost:
            self.ledger.lose()
            self.device_is_broken = self.device_layer.broken()
            self.lost_cause = "the CUDA device is broken" if self.device_is_broken else "a stream worker died"
        if operation not in ("info", "restart"):
            raise RuntimeFault(f"{operation}: the runtime's machinery is gone ({self.lost_cause})")

    def machinery_fault(self, error: BaseException) -> RuntimeFault | None:
        """The typed error for an error that says the machinery is gone (a dead stream, a broken
        device); None for any other."""
        if device_broken(error):
            error = DeviceBroken.of(error)
        if not isinstance(error, StreamDead):
            return None
        self.ledger.lose()
        self.lost_cause = str(error)
        self.device_is_broken = self.device_is_broken or isinstance(error, DeviceBroken)
        beyond = "; the CUDA context stays broken in this process: only a new process recovers" if self.device_is_broken else ""
        return RuntimeFault(f"the runtime's machinery is gone: {error}{beyond}")
