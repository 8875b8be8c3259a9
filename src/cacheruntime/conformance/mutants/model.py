"""Mutants of the model runtime: one broken guard or effect each, named by the invariant it breaks.

Each class overrides the smallest piece of `ModelRuntime` (a reference model with an
environment clock) that breaks its invariant the way a real runtime bug would: a public
method of one of the model's sections (`cacheruntime.model`) or an operation.

`restore_before_backup` (a restore that does not wait for the backup filling its host copy,
scenario 1) was removed with issue 17: the model keeps a demoted page's device copy
(DROPPING) while its backup is in flight, so no restore reads a filling host copy and none
waits for a backup; the mutant could no longer differ from the model.
"""

from __future__ import annotations

from cacheruntime import pageruns
from cacheruntime.conformance.selftest import ModelRuntime, model_runtime
from cacheruntime.model import Batch, Extent, ReferenceModel
from cacheruntime.protocol import (
    BatchCompletion,
    BatchState,
    OutOfPages,
    StaleHandle,
    Tier,
    TransferKind,
)


class _Mutant(ModelRuntime):
    invariant = ""

    def __init__(self, **options):
        base = model_runtime(**options)
        super().__init__(
            latency=base.latency,
            runtime_id=base.runtime_id,
            page_size=base.page_size,
            max_requests=base.max_requests,
            max_request_tokens=base.max_request_tokens,
            l1_pages=base.l1_pages,
            l2_pages=base.l2_pages,
        )


class StaleGenerationAccepted(_Mutant):
    """A request handle with an older generation is taken as the slot's current one."""

    invariant = "H1"

    def check_generation(self, request, slot):
        if slot.live and request.generation < slot.generation:
            return
        super().check_generation(request, slot)


class NoGenerationBumpOnClose(_Mutant):
    """Closing a request frees its slot without moving the slot's generation on."""

    invariant = "H2"

    def close_slot(self, slot):
        super().close_slot(slot)
        slot.generation -= 1


class DoubleFree(_Mutant):
    """A physical page freed without a transfer on it goes onto the free list twice."""

    invariant = "R4"

    def free_phys(self, tier, phys):
        blocked = self.transfers_on(tier, phys)
        super().free_phys(tier, phys)
        if not blocked:
            self.state.pools[tier].free.append(phys)


class FreeWhileReferenced(_Mutant):
    """A page's device location is freed when one holder is left, not none."""

    invariant = "R2"

    def drop_holder(self, name):
        super().drop_holder(name)
        page = self.state.pages.get(name)
        if page is not None and page.holders == 1 and Tier.L1 in page.copies:
            self.state.pools[Tier.L1].free.append(page.copies[Tier.L1].phys)


class LeakReference(_Mutant):
    """Releasing an extent's last reference does not give its pages' holders back."""

    invariant = "R3"

    def release_ref(self, generation):
        if self.state.extents[generation].refcount > 1:
            super().release_ref(generation)
        else:
            del self.state.extents[generation]


class SkipKvReadyWait(_Mutant):
    """Compute does not wait for the restores of the pages it reads (no KV_READY wait)."""

    invariant = "O1"

    def await_restores(self, pages):
        return None


class BackupBeforeCompute(_Mutant):
    """prepare_batch starts a speculative D2H of the batch's new pages before compute wrote them."""

    invariant = "O2"

    def prepare_batch(self, plan):
        handle = super().prepare_batch(plan)
        new = [p for s in self.state.batches[handle.batch_id].slots for p in self.state.slots[s].pages]
        todo = [p for p in dict.fromkeys(new) if Tier.L2 not in self.state.pages[p].copies]
        if todo and len(todo) <= len(self.state.pools[Tier.L2].free):
            self.start_transfer(TransferKind.BACKUP, 0, todo)
        return handle


class ReuseInFlight(_Mutant):
    """A released device or host page goes back on the free list while a transfer still uses it."""

    invariant = "O3"

    def free_phys(self, tier, phys):
        self.state.pools[tier].free.append(phys)


class ExecuteTwice(_Mutant):
    """An executed batch executes again instead of raising AlreadyExecuted."""

    invariant = "O4"

    def __init__(self, **options):
        super().__init__(**options)
        self.executed: dict[tuple[int, int], Batch] = {}  # (epoch, batch id) -> its record as prepared

    def execute_batch(self, batch):
        st = self.state
        key = (getattr(batch, "epoch", None), getattr(batch, "batch_id", None))
        outcome = st.finished.get(key[1]) if key[0] == st.epoch else None
        if outcome is not None and outcome[0] is BatchState.EXECUTED and key in self.executed:
            del st.finished[key[1]]
            st.batches[key[1]] = self.executed[key]  # prepared again
            try:
                return super().execute_batch(batch)
            except Exception:
                del st.batches[key[1]]
                st.finished[key[1]] = outcome
                raise
        record = st.batches.get(key[1]) if key[0] == st.epoch else None
        done = super().execute_batch(batch)
        if record is not None:
            self.executed[key] = record
        return done


class ExecuteOutOfOrder(_Mutant):
    """A batch executes before an earlier prepared batch of the same request (scenario 8)."""

    invariant = "O4"

    def check_execute_order(self, batch_id, record):
        return None


class PerTokenBoundary(_Mutant):
    """Every token written crosses the boundary once (a per-token KV write call)."""

    invariant = "B1"

    def execute_batch(self, batch):
        record = self.state.batches.get(getattr(batch, "batch_id", None))
        done = super().execute_batch(batch)
        self.state.calls["write_kv"] += sum(item.new_tokens for item in record.plan.items)
        return done


class TensorToControl(_Mutant):
    """execute_batch returns each item's token as a torch tensor."""

    invariant = "B2"

    def execute_batch(self, batch):
        import attrs
        import torch

        done = super().execute_batch(batch)
        items = tuple(attrs.evolve(i, next_token=torch.tensor(i.next_token)) for i in done.items)
        return BatchCompletion(done.batch, items, done.published, done.tickets)


class SubmitNotAtomic(_Mutant):
    """submit applies its intents one by one and keeps the earlier ones when a later one fails."""

    invariant = "H1"

    def submit(self, intents):
        result = ReferenceModel.submit.__wrapped__(self, intents)
        self.state.calls["submit"] += 1
        self._tick()
        return result


class PrepareLeaksOnOutOfPages(_Mutant):
    """prepare_batch that runs out of device pages keeps the pages it took before it noticed."""

    invariant = "H1"

    def prepare_batch(self, plan):
        try:
            return super().prepare_batch(plan)
        except OutOfPages as error:
            if error.tier is Tier.L1:
                del self.state.pools[Tier.L1].free[: error.free]
            raise


class CorruptRestore(_Mutant):
    """A restore lands the host bytes one position off."""

    invariant = "D1"

    def complete_transfer(self, transfer_id):
        tr = self.state.transfers[transfer_id]
        super().complete_transfer(transfer_id)
        if tr.kind is TransferKind.RESTORE:
            for _, _, dst in tr.pages:
                tags = self.state.pools[Tier.L1].tags[dst]
                tags[:] = tags[1:] + tags[:1]


class SplitKeepsParent(_Mutant):
    """split issues the halves but leaves the pre-split ref live (scenario 10)."""

    invariant = "H1"

    def split(self, extent, at_page):
        halves = super().split(extent, at_page)
        pages = self.state.extents[halves[0].generation].pages + self.state.extents[halves[1].generation].pages
        self.state.extents[extent.generation] = Extent(pages, 1, pageruns.coalesce(pages))
        for page in pages:
            self.state.pages[page].holders += 1
        return halves


class OldEpochAccepted(_Mutant):
    """After a restart, handles of the old epoch are checked as if they were current (scenario 5)."""

    invariant = "H1"

    def check_origin(self, what, runtime_id, epoch):
        try:
            super().check_origin(what, runtime_id, epoch)
        except StaleHandle:
            if epoch >= self.state.epoch:
                raise


class DemoteInUse(_Mutant):
    """Demote drops the device copy of pages a live request row still reads (scenario 9)."""

    invariant = "E1"

    def check_demote_unmapped(self, record):
        return None


#: name -> mutant class
MUTANTS = {
    "stale_generation_accepted": StaleGenerationAccepted,
    "no_generation_bump_on_close": NoGenerationBumpOnClose,
    "double_free": DoubleFree,
    "free_while_referenced": FreeWhileReferenced,
    "leak_reference": LeakReference,
    "skip_kv_ready_wait": SkipKvReadyWait,
    "backup_before_compute": BackupBeforeCompute,
    "reuse_page_in_flight": ReuseInFlight,
    "execute_twice": ExecuteTwice,
    "execute_out_of_order": ExecuteOutOfOrder,
    "per_token_boundary": PerTokenBoundary,
    "tensor_to_control": TensorToControl,
    "submit_not_atomic": SubmitNotAtomic,
    "prepare_leaks_on_out_of_pages": PrepareLeaksOnOutOfPages,
    "corrupt_restore": CorruptRestore,
    "split_keeps_parent": SplitKeepsParent,
    "old_epoch_accepted": OldEpochAccepted,
    "demote_in_use": DemoteInUse,
}
