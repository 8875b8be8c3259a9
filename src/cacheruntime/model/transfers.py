"""Transfers: tier moves as abstract pending events, their completion and their failure.

A transfer takes its destination copies (FILLING) when it starts and copies the source
tags into them when it completes: when the environment says so (`complete_transfer`,
the TLA+ action CompleteTransfer), when compute needs it (`await_restores`: O1), or at
`wait_completions` and restart. A transfer never completes before the transfers it
waits for; completions are reported once, by `report`.

A transfer that fails (FailTransfer, or one an injected fault doomed) leaves its
destination copies absent and its sources as they were, and gives a DROPPING source
copy back its VALID state: control asked to drop that copy only because the other one
was coming (write-back, spec/protocol.md §4.11), and it did not come (F1).
"""

from __future__ import annotations

from cacheruntime.model.l3 import L3_KINDS, L3Tier
from cacheruntime.model.records import Copy, Transfer
from cacheruntime.protocol import (
    CacheExtentRef,
    CopyState,
    FaultKind,
    NotBackedUp,
    Tier,
    TransferCompletion,
    TransferFailure,
    TransferKind,
    TransferTicket,
)

_TIERS = {TransferKind.BACKUP: (Tier.L1, Tier.L2), TransferKind.RESTORE: (Tier.L2, Tier.L1)}
#: The transfers that fill device copies, which compute waits for (KV_READY).
_FILLS_L1 = frozenset({TransferKind.RESTORE, TransferKind.FETCH})


class Transfers(L3Tier):
    """The section that starts, completes and reports transfers."""

    runtime_id: str

    def restore_pages(self, extent: CacheExtentRef) -> list[int]:
        """Pages of the extent a restore must move; NotBackedUp if one has no host copy.

        A page whose device copy is DROPPING is not moved: the restore keeps that copy.
        """
        record = self.state.extents[extent.generation]
        todo = []
        for page in record.pages:
            copies = self.state.pages[page].copies
            if Tier.L1 in copies:
                continue
            host = copies.get(Tier.L2)
            if host is None or host.state is CopyState.DROPPING:
                raise NotBackedUp(f"page {page} has neither a device nor a host copy")
            todo.append(page)
        return todo

    def keep_dropping(self, pages: tuple[int, ...], tier: Tier) -> None:
        """A restore (tier L1) or backup (L2) keeps the pages' DROPPING copies in `tier`: VALID again, nothing moves."""
        for name in pages:
            copies = self.state.pages[name].copies
            copy_ = copies.get(tier)
            if copy_ is not None and copy_.state is CopyState.DROPPING:
                copies[tier] = Copy(copy_.phys, CopyState.VALID)

    def start_restore(self, extent: CacheExtentRef) -> TransferTicket:
        """Keep the extent's DROPPING device copies; start the restore of its pages with no device copy."""
        todo = self.restore_pages(extent)
        self.keep_dropping(self.state.extents[extent.generation].pages, Tier.L1)
        return self.start_transfer(TransferKind.RESTORE, extent.generation, todo)

    def start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket:
        """Take a destination copy per page and record the move; it waits for the transfers filling its sources."""
        st = self.state
        src_tier, dst_tier = _TIERS[kind]
        transfer_id = st.next_transfer
        st.next_transfer += 1
        moves, waits = [], set()
        for name in pages:
            page = st.pages[name]
            source = page.copies[src_tier]
            if source.state is CopyState.FILLING:
                waits |= self.transfers_on(src_tier, source.phys)
            dst = self.take_phys(dst_tier)
            page.copies[dst_tier] = Copy(dst, CopyState.FILLING)
            moves.append((name, source.phys, dst))
        ticket = TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(moves))
        touched = {(src_tier, src) for _, src, _ in moves} | {(dst_tier, dst) for _, _, dst in moves}
        st.transfers[transfer_id] = Transfer(kind, generation, tuple(moves), frozenset(waits), ticket, frozenset(touched))
        if moves:
            self.count_toward_fault(FaultKind(kind.value), transfer_id)
        else:
            self.complete_transfer(transfer_id)
        return ticket

    def count_toward_fault(self, kind: FaultKind, transfer_id: int | None) -> bool:
        """Count one transfer (or compute, `transfer_id` None) toward the pending injections of `kind`.

        Every pending injection of `kind` counts it; one that reaches 0 picks it and is
        spent. A picked transfer is doomed: it fails when it would complete.
        """
        st = self.state
        counted = [(fault_kind, n - 1 if fault_kind is kind else n) for fault_kind, n in st.faults]
        st.faults = tuple(fault for fault in counted if fault[1] > 0)
        picked = len(st.faults) < len(counted)
        if picked and transfer_id is not None:
            st.doomed = st.doomed | {transfer_id}
        return picked

    def complete_transfer(self, transfer_id: int) -> None:
        """The transfer's copies land (tags copied, destination VALID); deferred frees it blocked run.

        A doomed transfer fails instead (`fail_transfer`).
        """
        st = self.state
        if transfer_id in st.doomed:
            self.fail_transfer(transfer_id)
            return
        if st.transfers[transfer_id].kind in L3_KINDS:
            self.complete_l3(transfer_id)
            return
        tr = st.transfers.pop(transfer_id)
        src_tier, dst_tier = _TIERS[tr.kind]
        for name, src, dst in tr.pages:
            st.pools[dst_tier].tags[dst] = list(st.pools[src_tier].tags[src])
            page = st.pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if page is not None and target is not None and target.phys == dst:
                page.copies[dst_tier] = Copy(dst, CopyState.VALID)
                source = page.copies.get(src_tier)
                if source is not None and source.state is CopyState.DROPPING:
                    self.drop_copy(name, src_tier)  # write-back: the copy it waited for has landed
        self.run_deferred(transfer_id)
        st.unreported.append(TransferCompletion(tr.ticket))

    def fail_transfer(self, transfer_id: int) -> None:
        """The transfer failed: its destination copies go, its DROPPING sources are VALID again (F1).
        An L3 transfer fails with `TransferFailure.STORE` (`fail_l3`)."""
        st = self.state
        if st.transfers[transfer_id].kind in L3_KINDS:
            self.fail_l3(transfer_id, TransferFailure.STORE)
            return
        tr = st.transfers.pop(transfer_id)
        st.doomed = st.doomed - {transfer_id}
        src_tier, dst_tier = _TIERS[tr.kind]
        for name, _, dst in tr.pages:
            page = st.pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if page is not None and target is not None and target.phys == dst:
                self.drop_copy(name, dst_tier)
                source = page.copies.get(src_tier)
                if source is not None and source.state is CopyState.DROPPING:
                    page.copies[src_tier] = Copy(source.phys, CopyState.VALID)
        self.run_deferred(transfer_id)
        st.unreported.append(TransferCompletion(tr.ticket, TransferFailure.COPY))

    def await_restores(self, pages: list[int]) -> None:
        """Complete, in dependency order, every transfer filling an L1 copy of `pages` (O1): restores and fetches."""
        st = self.state
        while True:
            waiting = [t for t, tr in st.transfers.items() if tr.kind in _FILLS_L1 and any(p in pages for p, _, _ in tr.pages)]
            if not waiting:
                return
            target = min(waiting)
            chain = {target}
            while chain:
                ready = [t for t in sorted(chain) if not st.transfers[t].waits_for & st.transfers.keys()]
                if ready:
                    self.complete_transfer(ready[0])
                    break
                chain = {w for t in chain for w in st.transfers[t].waits_for if w in st.transfers}

    def report(self) -> tuple[TransferCompletion, ...]:
        """Hand over the unreported completions, ordered by transfer id (timing is the runtime's)."""
        done = tuple(sorted(self.state.unreported, key=lambda c: c.ticket.transfer_id))
        self.state.unreported = []
        return done


def T1_completions_sound(transfers: dict[int, Transfer], unreported: list[TransferCompletion], next_transfer: int) -> list[str]:
    """Completions not yet reported name transfers started in this epoch that left the streams,
    each once; every transfer in flight was started (T1, spec/invariants.md)."""
    ids = [c.ticket.transfer_id for c in unreported]
    out = [f"completion of transfer {t} never started" for t in ids if t >= next_transfer]
    out += [f"completion of transfer {t} while it is in flight" for t in ids if t in transfers]
    out += [f"transfer {t} reported {ids.count(t)} times" for t in sorted(set(ids)) if ids.count(t) > 1]
    out += [f"transfer {t} in flight but never started" for t in transfers if t >= next_transfer]
    return out
