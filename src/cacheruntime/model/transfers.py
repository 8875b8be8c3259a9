"""Transfers: tier moves as abstract pending events, and their completion.

A transfer takes its destination copies (FILLING) when it starts and copies the source
tags into them when it completes: when the environment says so (`complete_transfer`,
the TLA+ action CompleteTransfer), when compute needs it (`await_restores`: O1), or at
`wait_completions` and restart. A transfer never completes before the transfers it
waits for; completions are reported once, by `report`.
"""

from __future__ import annotations

from cacheruntime.model.pages import Pages
from cacheruntime.model.records import Copy, Transfer
from cacheruntime.protocol import (
    CacheExtentRef,
    CopyState,
    NotBackedUp,
    Tier,
    TransferCompletion,
    TransferKind,
    TransferTicket,
)


class Transfers(Pages):
    """The section that starts, completes and reports transfers."""

    runtime_id: str

    def restore_pages(self, extent: CacheExtentRef) -> list[int]:
        """Pages of the extent a restore must move; NotBackedUp if one has no host copy."""
        record = self.state.extents[extent.generation]
        todo = []
        for page in record.pages:
            copies = self.state.pages[page].copies
            if Tier.L1 in copies:
                continue
            if Tier.L2 not in copies:
                raise NotBackedUp(f"page {page} has neither a device nor a host copy")
            todo.append(page)
        return todo

    def start_restore(self, extent: CacheExtentRef) -> TransferTicket:
        """Start the restore of the extent's pages that have no device copy."""
        return self.start_transfer(TransferKind.RESTORE, extent.generation, self.restore_pages(extent))

    def start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket:
        """Take a destination copy per page and record the move; it waits for the transfers filling its sources."""
        st = self.state
        src_tier, dst_tier = (Tier.L1, Tier.L2) if kind is TransferKind.BACKUP else (Tier.L2, Tier.L1)
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
        if not moves:
            self.complete_transfer(transfer_id)
        return ticket

    def complete_transfer(self, transfer_id: int) -> None:
        """The transfer's copies land (tags copied, destination VALID); deferred frees it blocked run."""
        st = self.state
        tr = st.transfers.pop(transfer_id)
        src_tier, dst_tier = (Tier.L1, Tier.L2) if tr.kind is TransferKind.BACKUP else (Tier.L2, Tier.L1)
        for name, src, dst in tr.pages:
            st.pools[dst_tier].tags[dst] = list(st.pools[src_tier].tags[src])
            page = st.pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if page is not None and target is not None and target.phys == dst:
                page.copies[dst_tier] = Copy(dst, CopyState.VALID)
        for tier in (Tier.L1, Tier.L2):
            pool = st.pools[tier]
            for phys in sorted(pool.deferred):
                pool.deferred[phys].discard(transfer_id)
                if not pool.deferred[phys]:
                    del pool.deferred[phys]
                    pool.free.append(phys)
        st.unreported.append(TransferCompletion(tr.ticket))

    def await_restores(self, pages: list[int]) -> None:
        """Complete, in dependency order, every transfer filling an L1 copy of `pages` (O1)."""
        st = self.state
        while True:
            waiting = [t for t, tr in st.transfers.items() if tr.kind is TransferKind.RESTORE and any(p in pages for p, _, _ in tr.pages)]
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
