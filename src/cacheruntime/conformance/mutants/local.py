"""Mutants of `LocalGPURuntime`: each overrides one guard or ordering step the runtime exposes for it.

They run the conformance configuration (`cacheruntime.runtime.factories.CONFORMANCE_OPTIONS`)
on the CPU, so the kill test needs no GPU; the ordering mutants rely on the delay knob to
turn a missing wait into a sure stale read.

There is no `local` mutant for O2 (a D2H that does not wait for the compute that wrote
its pages): in LocalGPURuntime the window does not exist, because `execute_batch` returns
only after its compute and only full, never rewritten pages are published and backed up,
so dropping the wait (`_wait_compute`) changes no byte. O2 is held by the model mutant
`model.backup_before_compute` and the TLA+ mutant `mutant-backup-before-compute`.
"""

from __future__ import annotations

import attrs

from cacheruntime.protocol import NotPrepared, RequestRuntimeHandle, StaleHandle, Tier
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime


class _Mutant(LocalGPURuntime):
    invariant = ""

    def __init__(self, device: str = "cpu", **options):
        super().__init__(device=device, **{**CONFORMANCE_OPTIONS, **options})


class StaleGenerationAccepted(_Mutant):
    """A request handle with an older generation passes the generation check."""

    invariant = "H1"

    def _check_generation(self, request, slot):
        if not slot.live or request.generation > slot.generation:
            super()._check_generation(request, slot)


class NoGenerationBumpOnClose(_Mutant):
    """A closing slot stops being live but keeps its generation."""

    invariant = "H2"

    def _retire_slot(self, slot):
        slot.live = False


class DoubleFree(_Mutant):
    """A physical page freed with no transfer on it goes onto the free list twice."""

    invariant = "R4"

    def _free_phys(self, tier, phys):
        blocked = self._transfers_on(tier, phys)
        super()._free_phys(tier, phys)
        if not blocked:
            self._state.pools[tier].free.append(phys)


class FreeWhileReferenced(_Mutant):
    """A page's device location is freed when one holder is left, not none."""

    invariant = "R2"

    def _drop_holder(self, name):
        super()._drop_holder(name)
        page = self._state.pages.get(name)
        if page is not None and page.holders == 1 and Tier.L1 in page.copies:
            self._state.pools[Tier.L1].free.append(page.copies[Tier.L1].phys)


class LeakReference(_Mutant):
    """An extent's last release ends the extent but its pages keep the holder it had."""

    invariant = "R3"

    def _release_ref(self, generation):
        record = self._state.extents[generation]
        record.refcount -= 1
        if record.refcount == 0:
            del self._state.extents[generation]


class SkipKvReadyWait(_Mutant):
    """Compute does not wait for the H2D of the restored pages it reads."""

    invariant = "O1"

    def _wait_kv_ready(self, launched):
        return None


class ReuseInFlight(_Mutant):
    """A released page goes back on its free list while a transfer still reads or writes it."""

    invariant = "O3"

    def _free_phys(self, tier, phys):
        self._state.pools[tier].free.append(phys)


class RestoreBeforeBackup(_Mutant):
    """A restore reads its host copy without waiting for the backup still filling it (scenario 1)."""

    invariant = "O3"

    def _wait_transfer_deps(self, stream, launched):
        return None


class ExecuteTwice(_Mutant):
    """An executed batch may execute again (only cancelled ones are refused)."""

    invariant = "O4"

    def _check_execute_once(self, batch, record):
        if record.state == "cancelled":
            raise NotPrepared(f"batch {batch.batch_id} was cancelled")


class ExecuteOutOfOrder(_Mutant):
    """A batch executes before an earlier prepared batch of the same request (scenario 8)."""

    invariant = "O4"

    def _check_execute_order(self, batch, record):
        return None


class DemoteInUse(_Mutant):
    """Demote drops device copies that a live request row still reads (scenario 9)."""

    invariant = "E1"

    def _check_demote_unmapped(self, record):
        return None


class NoRollback(_Mutant):
    """A failed call keeps the bookkeeping it changed before failing."""

    invariant = "H1"

    def _rollback(self, saved):
        return None


class OldEpochAccepted(_Mutant):
    """Handles of an earlier epoch pass the origin check after a restart (scenario 5)."""

    invariant = "H1"

    def _check_origin(self, what, runtime_id, epoch):
        try:
            super()._check_origin(what, runtime_id, epoch)
        except StaleHandle:
            return


class PerTokenBoundary(_Mutant):
    """Each token written is counted as its own boundary call (a per-token KV write)."""

    invariant = "B1"

    def execute_batch(self, batch):
        done = super().execute_batch(batch)
        self._state.calls["write_kv"] += sum(item.num_tokens for item in done.items)
        return done


class TensorToControl(_Mutant):
    """execute_batch hands each item's token to control as a tensor."""

    invariant = "B2"

    def execute_batch(self, batch):
        import torch

        done = super().execute_batch(batch)
        return attrs.evolve(done, items=tuple(attrs.evolve(i, next_token=torch.tensor(i.next_token)) for i in done.items))


class SecondHandleToLiveSlot(_Mutant):
    """With every slot live, open_request hands out the last slot again instead of OutOfSlots."""

    invariant = "H3"

    def open_request(self):
        if all(slot.live for slot in self._state.slots):
            slot_id = len(self._state.slots) - 1
            self._state.calls["open_request"] += 1
            return RequestRuntimeHandle(self.runtime_id, self._state.epoch, slot_id, self._state.slots[slot_id].generation)
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
    "restore_before_backup": RestoreBeforeBackup,
    "execute_twice": ExecuteTwice,
    "execute_out_of_order": ExecuteOutOfOrder,
    "demote_in_use": DemoteInUse,
    "no_rollback": NoRollback,
    "old_epoch_accepted": OldEpochAccepted,
    "per_token_boundary": PerTokenBoundary,
    "tensor_to_control": TensorToControl,
    "second_handle_to_live_slot": SecondHandleToLiveSlot,
}
