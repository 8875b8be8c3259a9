"""L3: page objects in a store, keyed by control, and the transfers that persist and fetch them.

The store (`State.objects`) maps control's key to the version tags an object's bytes hold. The
runtime never invents a key: a Persist names one per page of its extent and a Fetch one per page
it reads (spec/protocol.md §9). The store is the environment's: an object may be removed at any
time (`remove_object`, the TLA+ action RemoveObject), so that `l3_exists` is only a hint and a
fetch whose object is gone when it completes fails with `TransferFailure.MISS`; a store operation
may fail (`fail_transfer`: `TransferFailure.STORE`). Neither loses a page (F1): a persist only
reads its sources, and a fetch fills only new pages of its own batch, which then fails.

Host staging (S2): a staged move takes a host page off the free list and defers its free behind
its own transfer at once, so the page is neither free nor a copy until the store write (persist)
or the device write (fetch) has completed, failed or not. In buffer_only mode every host page is
staging (S1).
"""

from __future__ import annotations

from cacheruntime.model.pages import Pages
from cacheruntime.model.records import Copy, Page, Transfer
from cacheruntime.protocol import (
    CopyState,
    HostMode,
    InvalidPlan,
    NotBackedUp,
    Persist,
    Tier,
    TransferCompletion,
    TransferFailure,
    TransferKind,
    TransferTicket,
)

#: The transfers between a tier and L3.
L3_KINDS = frozenset({TransferKind.PERSIST, TransferKind.FETCH})

#: A move's staging (persist) or source (fetch) when it reads a host copy instead.
NO_STAGING = -1


class L3Tier(Pages):
    """The section that persists extents to L3, fetches objects into rows, and completes both."""

    runtime_id: str
    host_mode: HostMode

    def start_l3_transfer(self, kind: TransferKind, generation: int, moves: list[tuple[int, int, int]], keys: tuple[str, ...]) -> TransferTicket:
        """Record an L3 transfer; its staging host pages are deferred behind it from the start (S2)."""
        st = self.state
        transfer_id = st.next_transfer
        st.next_transfer += 1
        if kind is TransferKind.PERSIST:
            source_tier = Tier.L2 if self.host_mode is HostMode.RESIDENT else Tier.L1
            touched = {(source_tier, src) for _, src, _ in moves} | {(Tier.L2, staging) for _, _, staging in moves if staging != NO_STAGING}
            staging_pages = [staging for _, _, staging in moves if staging != NO_STAGING]
        else:
            touched = {(Tier.L2, staging) for _, staging, _ in moves} | {(Tier.L1, dst) for _, _, dst in moves}
            staging_pages = [staging for _, staging, _ in moves]
        for staging in staging_pages:
            st.pools[Tier.L2].deferred[staging] = {transfer_id}
        ticket = TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(moves))
        st.transfers[transfer_id] = Transfer(kind, generation, tuple(moves), frozenset(), ticket, frozenset(touched), keys)
        return ticket

    def start_persist(self, intent: Persist, pages: tuple[int, ...]) -> TransferTicket:
        """Persist: each page's bytes go to L3 under control's key, from its host copy (resident) or
        from its device copy through a staging host page (buffer_only). Reads only: no copy changes."""
        st = self.state
        if len(intent.keys) != len(pages):
            raise InvalidPlan(f"Persist names {len(intent.keys)} keys for an extent of {len(pages)} pages: give one key per page, in page order")
        moves = []
        if self.host_mode is HostMode.RESIDENT:
            for name in pages:
                host = st.pages[name].copies.get(Tier.L2)
                if host is None or not host.state.readable:
                    raise NotBackedUp(f"page {name} has no readable host copy for the persist to read: back the extent up and persist once the backup landed")
            moves = [(name, st.pages[name].copies[Tier.L2].phys, NO_STAGING) for name in pages]
        else:
            self.require_free(Tier.L2, len(pages))
            moves = [(name, st.pages[name].copies[Tier.L1].phys, self.take_phys(Tier.L2)) for name in pages]
        for name, key in zip(pages, intent.keys):
            st.keys[name] = key
        return self.start_l3_transfer(TransferKind.PERSIST, intent.extent.generation, moves, tuple(intent.keys))

    def fetch_into_row(self, keys: tuple[str, ...]) -> list[int]:
        """New page names for a Fetch, one holder each (the row), each with a filling device copy and a
        staging host page; starts the fetch. The caller checked that enough pages of both tiers are free."""
        st = self.state
        names, moves = [], []
        for key in keys:
            name, st.next_page = st.next_page, st.next_page + 1
            dst = self.take_phys(Tier.L1)
            st.pages[name] = Page(holders=1, versions=[0] * self.page_size, copies={Tier.L1: Copy(dst, CopyState.FILLING)})
            st.keys[name] = key
            moves.append((name, self.take_phys(Tier.L2), dst))
            names.append(name)
        self.start_l3_transfer(TransferKind.FETCH, 0, moves, keys)
        return names

    def complete_l3(self, transfer_id: int) -> None:
        """An L3 transfer lands: a persist writes its objects; a fetch fills its pages from theirs, or
        fails with MISS if one is gone. Its staging pages are freed."""
        st = self.state
        tr = st.transfers[transfer_id]
        if tr.kind is TransferKind.FETCH and any(key not in st.objects for key in tr.keys):
            self.fail_l3(transfer_id, TransferFailure.MISS)
            return
        del st.transfers[transfer_id]
        l1, l2 = st.pools[Tier.L1].tags, st.pools[Tier.L2].tags
        for (name, src, dst), key in zip(tr.pages, tr.keys):
            if tr.kind is TransferKind.PERSIST:
                if dst == NO_STAGING:
                    tags = list(l2[src])
                else:
                    tags = l2[dst] = list(l1[src])  # the D2H into staging, then the store write
                st.objects[key] = tuple(tags)
                continue
            tags = l2[src] = list(st.objects[key])  # the store read into staging, then the H2D
            l1[dst] = list(tags)
            page = st.pages.get(name)
            target = page.copies.get(Tier.L1) if page else None
            if page is not None and target is not None and target.phys == dst:
                page.copies[Tier.L1] = Copy(dst, CopyState.VALID)
                page.versions = list(tags)
        self.run_deferred(transfer_id)
        st.unreported.append(TransferCompletion(tr.ticket))

    def fail_l3(self, transfer_id: int, failure: TransferFailure) -> None:
        """An L3 transfer fails: a persist writes no object (its sources were only read: F1); a
        fetch's device copies go (its pages had no other). Its staging pages are freed."""
        st = self.state
        tr = st.transfers.pop(transfer_id)
        if tr.kind is TransferKind.FETCH:
            for name, _, dst in tr.pages:
                page = st.pages.get(name)
                target = page.copies.get(Tier.L1) if page else None
                if page is not None and target is not None and target.phys == dst:
                    self.drop_copy(name, Tier.L1)
        self.run_deferred(transfer_id)
        st.unreported.append(TransferCompletion(tr.ticket, failure))

    def run_deferred(self, transfer_id: int) -> None:
        """The deferred frees that waited for `transfer_id`: each that waits for nothing more runs."""
        for tier in (Tier.L1, Tier.L2):
            pool = self.state.pools[tier]
            for phys in sorted(pool.deferred):
                pool.deferred[phys].discard(transfer_id)
                if not pool.deferred[phys]:
                    del pool.deferred[phys]
                    pool.free.append(phys)
