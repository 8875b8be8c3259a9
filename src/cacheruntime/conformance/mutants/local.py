"""Mutants of `LocalGPURuntime`: each swaps one part of the runtime for a broken one.

A mutant is the conformance configuration (`cacheruntime.runtime.factories.CONFORMANCE_OPTIONS`)
on the CPU with one seam replaced: a `ledger_class` whose one public method is wrong, an
`ordering_class` that leaves out one wait, or a `transaction_class` that does not roll
back. None reaches into a private method. The ordering mutants rely on the delay knob to
turn a missing wait into a sure stale read.

There is no `local` mutant for O2 (a D2H that does not wait for the compute that wrote
its pages): in LocalGPURuntime the window does not exist, because `execute_batch` returns
only after its compute and only full, never rewritten pages are published and backed up,
so dropping the wait (`Ordering.wait_compute`) changes no byte. O2 is held by the model
mutant `model.backup_before_compute` and the TLA+ mutant `mutant-backup-before-compute`.

Nor is there one any more for a restore that does not wait for the backup still filling
its host copy (`restore_before_backup`, an `ordering_class` whose `wait_transfer_deps` did
nothing; removed with issue 17): a Demote while a page's backup is in flight now keeps the
device copy (DROPPING) until the backup lands, so a restore only ever moves pages whose host
copy is valid, no transfer waits for another (`waits_for` is always empty), and leaving the
wait out changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import attrs

from cacheruntime.protocol import (
    BatchCompletion,
    BatchState,
    NotPrepared,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    StaleHandle,
    Tier,
)
from cacheruntime.runtime.device.ordering import Ordering
from cacheruntime.runtime.device.streams import Event, Stream
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, suite_streams
from cacheruntime.runtime.ledger import Ledger, Transaction
from cacheruntime.runtime.ledger.records import Slot
from cacheruntime.runtime.local import LocalGPURuntime


class _Mutant(LocalGPURuntime):
    """The conformance runtime with the seams a mutant names."""

    invariant = ""
    ledger: Ledger
    parts: ClassVar[dict[str, Any]] = {}  # the seams this mutant replaces (constructor options)

    def __init__(self, device: str = "cpu", **options: Any):
        super().__init__(device=device, **{**CONFORMANCE_OPTIONS, **suite_streams(device), **self.parts, **options})


# -- ledgers with one wrong public method ------------------------------------------------


class _StaleGenerationLedger(Ledger):
    def check_generation(self, request: RequestRuntimeHandle, slot: Slot) -> None:
        if not slot.live or request.generation > slot.generation:
            super().check_generation(request, slot)


class _NoGenerationBumpLedger(Ledger):
    def close_slot(self, slot: Slot) -> None:
        slot.live = False
        self.slot_changes += 1


class _DoubleFreeLedger(Ledger):
    def free_phys(self, tier: Tier, phys: int) -> None:
        blocked = self.transfers_on(tier, phys)
        super().free_phys(tier, phys)
        if not blocked:
            self.state.pools[tier].free.append(phys)


class _FreeWhileReferencedLedger(Ledger):
    def drop_holder(self, name: int) -> None:
        super().drop_holder(name)
        page = self.state.pages.get(name)
        if page is not None and page.holders == 1 and Tier.L1 in page.copies:
            self.state.pools[Tier.L1].free.append(page.copies[Tier.L1].phys)


class _LeakReferenceLedger(Ledger):
    def release_ref(self, generation: int) -> None:
        record = self.state.extents[generation]
        record.refcount -= 1
        if record.refcount == 0:
            del self.state.extents[generation]


class _ReuseInFlightLedger(Ledger):
    def free_phys(self, tier: Tier, phys: int) -> None:
        self.state.pools[tier].free.append(phys)


class _ExecuteTwiceLedger(Ledger):
    def check_execute_once(self, batch: PreparedBatchHandle, state: BatchState) -> None:
        if state is BatchState.CANCELLED:
            raise NotPrepared(f"batch {batch.batch_id} was cancelled")


class _ExecuteOutOfOrderLedger(Ledger):
    def check_execute_order(self, batch: PreparedBatchHandle, slot_set: frozenset[int]) -> None:
        return None


class _DemoteInUseLedger(Ledger):
    def check_demote_unmapped(self, record: Any) -> None:
        return None


class _OldEpochLedger(Ledger):
    def check_origin(self, what: str, runtime_id: str, epoch: int) -> None:
        try:
            super().check_origin(what, runtime_id, epoch)
        except StaleHandle:
            return


class _KeepChanges(Transaction):
    def rollback(self) -> None:
        self.journal = None


class _NoRollbackLedger(Ledger):
    transaction_class = _KeepChanges


# -- orderings with one wait left out ----------------------------------------------------


class _NoKvReadyWait(Ordering):
    def wait_kv_ready(self, compute: Stream, restores: Iterable[Event]) -> None:
        return None


# -- the mutants -------------------------------------------------------------------------


class StaleGenerationAccepted(_Mutant):
    """A request handle with an older generation passes the generation check."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _StaleGenerationLedger}


class NoGenerationBumpOnClose(_Mutant):
    """A closing slot stops being live but keeps its generation."""

    invariant = "H2"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _NoGenerationBumpLedger}


class DoubleFree(_Mutant):
    """A physical page freed with no transfer on it goes onto the free list twice."""

    invariant = "R4"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _DoubleFreeLedger}


class FreeWhileReferenced(_Mutant):
    """A page's device location is freed when one holder is left, not none."""

    invariant = "R2"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _FreeWhileReferencedLedger}


class LeakReference(_Mutant):
    """An extent's last release ends the extent but its pages keep the holder it had."""

    invariant = "R3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _LeakReferenceLedger}


class SkipKvReadyWait(_Mutant):
    """Compute does not wait for the H2D of the restored pages it reads."""

    invariant = "O1"
    parts: ClassVar[dict[str, Any]] = {"ordering_class": _NoKvReadyWait}


class ReuseInFlight(_Mutant):
    """A released page goes back on its free list while a transfer still reads or writes it."""

    invariant = "O3"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ReuseInFlightLedger}


class ExecuteTwice(_Mutant):
    """An executed batch may execute again (only cancelled ones are refused)."""

    invariant = "O4"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ExecuteTwiceLedger}


class ExecuteOutOfOrder(_Mutant):
    """A batch executes before an earlier prepared batch of the same request (scenario 8)."""

    invariant = "O4"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _ExecuteOutOfOrderLedger}


class DemoteInUse(_Mutant):
    """Demote drops device copies that a live request row still reads (scenario 9)."""

    invariant = "E1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _DemoteInUseLedger}


class NoRollback(_Mutant):
    """A failed call keeps the bookkeeping it changed before failing."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _NoRollbackLedger}


class OldEpochAccepted(_Mutant):
    """Handles of an earlier epoch pass the origin check after a restart (scenario 5)."""

    invariant = "H1"
    parts: ClassVar[dict[str, Any]] = {"ledger_class": _OldEpochLedger}


class PerTokenBoundary(_Mutant):
    """Each token written is counted as its own boundary call (a per-token KV write)."""

    invariant = "B1"

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        done = super().execute_batch(batch)
        self.ledger.state.calls["write_kv"] += sum(item.num_tokens for item in done.items)
        return done


class TensorToControl(_Mutant):
    """execute_batch hands each item's token to control as a tensor."""

    invariant = "B2"

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        import torch

        done = super().execute_batch(batch)
        return attrs.evolve(done, items=tuple(attrs.evolve(i, next_token=torch.tensor(i.next_token)) for i in done.items))


class SecondHandleToLiveSlot(_Mutant):
    """With every slot live, open_request hands out the last slot again instead of OutOfSlots."""

    invariant = "H3"

    def open_request(self) -> RequestRuntimeHandle:
        state = self.ledger.state
        if all(slot.live for slot in state.slots):
            slot_id = len(state.slots) - 1
            state.calls["open_request"] += 1
            return RequestRuntimeHandle(self.runtime_id, state.epoch, slot_id, state.slots[slot_id].generation)
        return super().open_request()


#: name -> mutant class
MUTANTS = {
    "stale_generation_accepted": StaleGenerationAccepted,
    "no_generation_bump_on_close": NoGenerationBumpOnClose,
    "double_free": DoubleFree,
    "free_while_referenced": FreeWhileReferenced,
    "leak_reference": LeakReference,
    "skip_kv_ready_wait": SkipKvReadyWait,
    "reuse_page_in_flight": ReuseInFlight,
    "execute_twice": ExecuteTwice,
    "execute_out_of_order": ExecuteOutOfOrder,
    "demote_in_use": DemoteInUse,
    "no_rollback": NoRollback,
    "old_epoch_accepted": OldEpochAccepted,
    "per_token_boundary": PerTokenBoundary,
    "tensor_to_control": TensorToControl,
    "second_handle_to_live_slot": SecondHandleToLiveSlot,
}
