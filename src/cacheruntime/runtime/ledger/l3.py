"""L3 in the ledger: persist extents to the store, fetch objects into rows, complete both (§9, S1-S3).

Section for section the model's `cacheruntime.model.l3`: a persist reads each page's host
copy (resident) or its device copy through a staging host page (buffer_only) and writes the
object under control's key; a fetch gives a row new page names whose device copies fill from
the objects through staging. A staging host page is taken off the free list and its free is
deferred behind its own transfer at once (S2), so it is neither free nor a copy until the
store write (persist) or the device write (fetch) has completed, failed or not. Whether a
transfer missed or failed is the device layer's finding (`TransferFailure.MISS` / `STORE`);
the ledger only records it. `objects` holds the tags of every object this runtime wrote or
read (the store holds the bytes), for `probe()` and for the tags of a fetched page.
"""

from __future__ import annotations

import functools
from array import array
from typing import TYPE_CHECKING

from cacheruntime.protocol import BatchPlan, Fetch, InvalidPlan, NotBackedUp, Persist, Tier, TransferCompletion, TransferFailure, TransferKind, TransferTicket
from cacheruntime.runtime.ledger.pages import new_copy
from cacheruntime.runtime.ledger.records import FILLING, VALID, Copy, Page, Transfer, touch_keys

if TYPE_CHECKING:
    from cacheruntime.runtime.ledger.ledger import LedgerBase

    _Base = LedgerBase
else:
    _Base = object

#: The transfers between a tier and L3.
L3_KINDS = frozenset({TransferKind.PERSIST, TransferKind.FETCH})

#: A persist's staging page when it reads host copies (resident mode): none.
NO_STAGING = -1


#: A plan's Fetch intents: slot -> the keys read into its row.
Fetches = dict[int, tuple[str, ...]]


class L3Tier(_Base):
    """Persist, fetch, and their completions, in the ledger."""

    def check_fetches(self, plan: BatchPlan, slots: frozenset[int]) -> Fetches:
        """The plan's Fetch intents by slot: each fills the row of one of the plan's items, one per row."""
        fetches: Fetches = {}
        for intent in plan.intents:
            if isinstance(intent, Fetch):
                slot_id = intent.request.slot_id
                if slot_id not in slots:
                    raise InvalidPlan(f"Fetch into slot {slot_id}, which has no item in the plan: a fetch fills the row of an item")
                if slot_id in fetches:
                    raise InvalidPlan(f"two Fetch intents for slot {slot_id}: name every key in one")
                fetches[slot_id] = tuple(intent.keys)
        return fetches

    def start_l3_transfer(self, kind: TransferKind, generation: int, moves: list[tuple[int, int, int]], keys: tuple[str, ...]) -> TransferTicket:
        """Record an L3 transfer; its staging host pages are deferred behind it from the start (S2)."""
        st, txn = self.state, self.txn
        transfer_id = st.next_transfer
        st.next_transfer = transfer_id + self.numbering.stride
        txn.undo(lambda: setattr(st, "next_transfer", transfer_id))
        if kind is TransferKind.PERSIST:
            source_tier = Tier.L2 if self.resident else Tier.L1
            staging = [s for _, _, s in moves if s != NO_STAGING]
            touched = touch_keys(source_tier, [src for _, src, _ in moves]) | touch_keys(Tier.L2, staging)
        else:
            staging = [s for _, s, _ in moves]
            touched = touch_keys(Tier.L2, staging) | touch_keys(Tier.L1, [dst for _, _, dst in moves])
        deferred = st.pools[Tier.L2].deferred
        for phys in staging:
            deferred[phys] = {transfer_id}
        txn.undo(lambda: [deferred.pop(phys) for phys in staging])
        ticket = TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(moves))
        st.transfers[transfer_id] = Transfer(kind, generation, moves, set(), ticket, touched, keys)
        txn.undo(lambda: st.transfers.pop(transfer_id))
        txn.started.append(transfer_id)
        return ticket

    def start_persist(self, intent: Persist, pages: tuple[int, ...]) -> TransferTicket:
        """Persist: each page's bytes go to L3 under control's key, from its host copy (resident) or
        from its device copy through a staging host page (buffer_only). Reads only: no copy changes."""
        st = self.state
        if len(intent.keys) != len(pages):
            raise InvalidPlan(f"Persist names {len(intent.keys)} keys for an extent of {len(pages)} pages: give one key per page, in page order")
        if self.resident:
            for name in pages:
                host = st.pages[name].copies.get(Tier.L2)
                if host is None or host.state is not VALID:
                    raise NotBackedUp(f"page {name} has no readable host copy for the persist to read: back the extent up and persist once the backup landed")
            moves = [(name, st.pages[name].copies[Tier.L2].phys, NO_STAGING) for name in pages]
        else:
            self.require_free(Tier.L2, len(pages))
            staging = self.take_phys(Tier.L2, len(pages))
            moves = [(name, st.pages[name].copies[Tier.L1].phys, s) for name, s in zip(pages, staging)]
        self.name_keys(pages, intent.keys)
        return self.start_l3_transfer(TransferKind.PERSIST, intent.extent.generation, moves, tuple(intent.keys))

    def fetch_into_row(self, keys: tuple[str, ...]) -> list[int]:
        """New page names for a Fetch, one holder each (the row), each with a filling device copy and a
        staging host page; starts the fetch. The caller checked that enough pages of both tiers are free."""
        st = self.state
        first, stride = st.next_page, self.numbering.stride
        names = list(range(first, first + len(keys) * stride, stride))
        st.next_page = first + len(keys) * stride
        device = self.take_phys(Tier.L1, len(keys))
        staging = self.take_phys(Tier.L2, len(keys))
        for name, dst in zip(names, device):
            st.pages[name] = Page(1, self.no_versions[:], {Tier.L1: new_copy(Copy, (dst, FILLING))})
        self.txn.undo(lambda: _forget_names(st.pages, names, st, first))
        self.name_keys(tuple(names), keys)
        self.start_l3_transfer(TransferKind.FETCH, 0, [(n, s, d) for n, s, d in zip(names, staging, device)], keys)
        return names

    def name_keys(self, names: tuple[int, ...], keys: tuple[str, ...]) -> None:
        """Record control's key of each page (`probe()`: `page_keys`); journaled."""
        known = self.state.keys
        before = {name: known[name] for name in names if name in known}
        known.update(zip(names, keys))
        self.txn.undo(lambda: [known.pop(name) for name in names] and known.update(before))

    def complete_l3(self, transfer_id: int) -> None:
        """An L3 transfer landed: a persist wrote its objects; a fetch filled its pages from theirs.
        Its staging pages are freed."""
        st, txn, ps = self.state, self.txn, self.page_size
        record = st.transfers.pop(transfer_id)
        txn.undo(lambda: st.transfers.__setitem__(transfer_id, record))
        l1, l2, objects = st.pools[Tier.L1].tags, st.pools[Tier.L2].tags, st.objects
        saved = (dict(objects), list(l1), list(l2)) if txn.journal is not None else None
        for (name, src, dst), key in zip(record.pages, record.keys):
            if record.kind is TransferKind.PERSIST:
                if dst == NO_STAGING:
                    tags = l2[src * ps : (src + 1) * ps]
                else:
                    tags = l2[dst * ps : (dst + 1) * ps] = l1[src * ps : (src + 1) * ps]  # the D2H into staging
                objects[key] = tuple(tags)
                continue
            tags = list(objects.get(key, (0,) * ps))  # an object another runtime wrote: its tags are unknown here
            l2[src * ps : (src + 1) * ps] = tags  # the store read into staging, then the H2D
            l1[dst * ps : (dst + 1) * ps] = tags
            objects[key] = tuple(tags)
            page = st.pages.get(name)
            target = page.copies.get(Tier.L1) if page else None
            if page is not None and target is not None and target.phys == dst:
                self.set_copy_state(page.copies, Tier.L1, VALID)
                txn.undo(functools.partial(setattr, page, "versions", page.versions))
                page.versions = array("q", tags)
        if saved is not None:
            txn.undo(lambda: _restore_tags(st, saved))
        for tier in (Tier.L1, Tier.L2):  # a device page released (or its batch cancelled) while the transfer used it, too
            if st.pools[tier].deferred:
                self._run_deferred(st.pools[tier], transfer_id)
        st.unreported.append(TransferCompletion(record.ticket))
        txn.undo(st.unreported.pop)

    def fail_l3(self, transfer_id: int, failure: TransferFailure) -> None:
        """An L3 transfer failed: a persist wrote no object (its sources were only read: F1); a
        fetch's device copies go (its pages had no other). Its staging pages are freed."""
        st, txn = self.state, self.txn
        record = st.transfers.pop(transfer_id)
        txn.undo(lambda: st.transfers.__setitem__(transfer_id, record))
        if record.kind is TransferKind.FETCH:
            for name, _, dst in record.pages:
                page = st.pages.get(name)
                target = page.copies.get(Tier.L1) if page else None
                if page is not None and target is not None and target.phys == dst:
                    self.drop_copy(name, Tier.L1)
        for tier in (Tier.L1, Tier.L2):
            if st.pools[tier].deferred:
                self._run_deferred(st.pools[tier], transfer_id)
        st.unreported.append(TransferCompletion(record.ticket, failure))
        txn.undo(st.unreported.pop)


def _forget_names(pages: dict[int, Page], names: list[int], state: object, first: int) -> None:
    for name in names:
        del pages[name]
    state.next_page = first  # type: ignore[attr-defined]


def _restore_tags(state: object, saved: tuple[dict[str, tuple[int, ...]], list[int], list[int]]) -> None:
    objects, l1, l2 = saved
    st = state
    st.objects.clear()  # type: ignore[attr-defined]
    st.objects.update(objects)  # type: ignore[attr-defined]
    st.pools[Tier.L1].tags[:] = l1  # type: ignore[attr-defined]
    st.pools[Tier.L2].tags[:] = l2  # type: ignore[attr-defined]
