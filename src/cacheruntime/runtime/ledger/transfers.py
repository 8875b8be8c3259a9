"""Transfers: start, complete, await, report (O1, O3, scenario 1).

A transfer is *completed* (its copies become valid, the deferred frees it blocks run, its
completion is queued for reporting) at the points the model completes it: when compute
needs it (`await_restores`, from `execute_batch`), when `poll_completions` finds its
device work done, or at `wait_completions`. So the ledger differs from the model only in
when the environment completes transfers; when they are *reported* is the runtime's
choice (`choices.Reporting`), their order is not (by transfer id).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from cacheruntime.protocol import CacheExtentRef, FaultKind, NotBackedUp, Tier, TransferCompletion, TransferFailure, TransferKind, TransferTicket
from cacheruntime.runtime.ledger.choices import Reporting
from cacheruntime.runtime.ledger.l3 import L3_KINDS, L3Tier
from cacheruntime.runtime.ledger.pages import new_copy
from cacheruntime.runtime.ledger.records import DROPPING, FILLING, VALID, Copy, Pool, Transfer, touch_keys

if TYPE_CHECKING:
    from cacheruntime.runtime.ledger.ledger import LedgerBase

    _Base = LedgerBase
else:
    _Base = object


#: The transfers that fill device copies, which compute waits for (KV_READY, O1).
FILLS_L1 = frozenset({TransferKind.RESTORE, TransferKind.FETCH})


class Transfers(L3Tier):
    """Tier moves between a page's copies, in the ledger."""

    def restore_pages(self, extent: CacheExtentRef) -> list[int]:
        """Pages of the extent a restore must move; NotBackedUp if one has no host copy.

        A page whose device copy is DROPPING is not moved: the restore keeps that copy.
        """
        pages, l1, l2 = self.state.pages, Tier.L1, Tier.L2
        todo = []
        for page in self.state.extents[extent.generation].pages:
            copies = pages[page].copies
            if l1 in copies:
                continue
            host = copies.get(l2)
            if host is None or host.state is DROPPING:
                raise NotBackedUp(f"page {page} has neither a device nor a host copy")
            todo.append(page)
        return todo

    def start_restore(self, extent: CacheExtentRef, todo: list[int]) -> TransferTicket:
        """Keep the extent's DROPPING device copies; start the restore of `todo`, its pages with no device copy."""
        self.keep_dropping(self.state.extents[extent.generation].pages, Tier.L1)
        return self.start_transfer(TransferKind.RESTORE, extent.generation, todo)

    def inject_fault(self, kind: FaultKind, nth: int) -> None:
        """Count `nth` transfers of `kind` that move a page (or computes) from now; that one fails (FAULT_INJECTION)."""
        self.state.faults.append((kind, nth))

    def count_toward_fault(self, kind: FaultKind) -> bool:
        """One more transfer (or compute) of `kind`: whether a pending injection picks it (reaches 0); journaled."""
        st = self.state
        before = st.faults
        if not any(fault_kind is kind for fault_kind, _ in before):
            return False
        counted = [(fault_kind, n - 1 if fault_kind is kind else n) for fault_kind, n in before]
        st.faults = [fault for fault in counted if fault[1] > 0]
        self.txn.undo(lambda: setattr(st, "faults", before))
        return len(st.faults) < len(counted)

    def start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket:
        """Name the transfer, give each page a filling destination copy; the device work starts at commit."""
        st, txn = self.state, self.txn
        transfer_id = st.next_transfer
        st.next_transfer = transfer_id + self.numbering.stride
        txn.undo(lambda: setattr(st, "next_transfer", transfer_id))
        ticket = TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(pages))
        record = Transfer(kind, generation, [], set(), ticket)
        src_tier, dst_tier = record.tiers
        all_pages, moved = st.pages, record.pages
        given: list[dict[Tier, Copy]] = []  # the copies dicts that got a destination copy, for the undo
        for name, destination in zip(pages, self.take_phys(dst_tier, len(pages))):
            copies = all_pages[name].copies
            source = copies[src_tier]
            if source.state is FILLING:
                record.waits_for |= self.transfers_on(src_tier, source.phys)
            copies[dst_tier] = new_copy(Copy, (destination, FILLING))
            given.append(copies)
            moved.append((name, source.phys, destination))
        txn.undo(lambda: _forget_copies(given, dst_tier))
        record.touched = touch_keys(src_tier, [src for _, src, _ in moved]) | touch_keys(dst_tier, [dst for _, _, dst in moved])
        st.transfers[transfer_id] = record
        txn.undo(lambda: st.transfers.pop(transfer_id))
        if pages:
            txn.started.append(transfer_id)
            if st.faults and self.count_toward_fault(FaultKind(kind.value)):
                st.doomed.add(transfer_id)  # the device layer makes its copy fail
                txn.undo(lambda: st.doomed.discard(transfer_id))
        else:
            self.complete_transfer(transfer_id)
        return ticket

    def complete_transfer(self, transfer_id: int) -> None:
        """The transfer's copies are valid; the deferred frees it blocked run; its completion is queued."""
        st, txn = self.state, self.txn
        if st.transfers[transfer_id].kind in L3_KINDS:
            self.complete_l3(transfer_id)
            return
        record = st.transfers.pop(transfer_id)
        txn.undo(lambda: st.transfers.__setitem__(transfer_id, record))
        src_tier, dst_tier = record.tiers
        tags_src, tags_dst, ps = st.pools[src_tier].tags, st.pools[dst_tier].tags, self.page_size
        journal, all_pages = txn.journal, st.pages
        made_valid: list[tuple[dict[Tier, Copy], Copy]] = []
        if journal is not None:
            old_tags = [(dst * ps, tags_dst[dst * ps : (dst + 1) * ps]) for _, _, dst in record.pages]
            journal.append(lambda: _uncomplete(tags_dst, old_tags, made_valid, dst_tier))
        for name, src, dst in record.pages:
            tags_dst[dst * ps : (dst + 1) * ps] = tags_src[src * ps : (src + 1) * ps]
            page = all_pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if target is not None and page is not None and target.phys == dst:
                if journal is not None:
                    made_valid.append((page.copies, target))
                page.copies[dst_tier] = new_copy(Copy, (dst, VALID))
                source = page.copies.get(src_tier)
                if source is not None and source.state is DROPPING:
                    self.drop_copy(name, src_tier)  # write-back: the copy it waited for has landed
        for tier in (Tier.L1, Tier.L2):
            pool = st.pools[tier]
            if pool.deferred:
                self._run_deferred(pool, transfer_id)
        st.unreported.append(TransferCompletion(record.ticket))
        txn.undo(st.unreported.pop)

    def fail_transfer(self, transfer_id: int, failure: TransferFailure = TransferFailure.COPY) -> None:
        """The transfer's copy failed: its destination copies go, its DROPPING sources are VALID
        again, the deferred frees it blocked run, a failed completion is queued (F1, §5.3). An L3
        transfer fails with `failure` (MISS or STORE: the device layer's finding; STORE when none)."""
        st, txn = self.state, self.txn
        if st.transfers[transfer_id].kind in L3_KINDS:
            self.fail_l3(transfer_id, failure if failure is not TransferFailure.COPY else TransferFailure.STORE)
            return
        record = st.transfers.pop(transfer_id)
        txn.undo(lambda: st.transfers.__setitem__(transfer_id, record))
        if transfer_id in st.doomed:
            st.doomed.discard(transfer_id)
            txn.undo(lambda: st.doomed.add(transfer_id))
        src_tier, dst_tier = record.tiers
        all_pages = st.pages
        for name, _, dst in record.pages:
            page = all_pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if target is not None and page is not None and target.phys == dst:
                self.drop_copy(name, dst_tier)
                source = page.copies.get(src_tier)
                if source is not None and source.state is DROPPING:
                    self.set_copy_state(page.copies, src_tier, VALID)
        for tier in (Tier.L1, Tier.L2):
            pool = st.pools[tier]
            if pool.deferred:
                self._run_deferred(pool, transfer_id)
        st.unreported.append(TransferCompletion(record.ticket, TransferFailure.COPY))
        txn.undo(st.unreported.pop)

    def _run_deferred(self, pool: Pool, transfer_id: int) -> None:
        """Deferred frees of `pool` that waited for `transfer_id`: free each that waits for nothing more."""
        undo = self.txn.undo
        for phys in sorted(pool.deferred):
            waiting = pool.deferred[phys]
            if transfer_id not in waiting:
                continue
            waiting.discard(transfer_id)
            undo(functools.partial(waiting.add, transfer_id))
            if not waiting:
                del pool.deferred[phys]
                pool.free.append(phys)
                undo(functools.partial(_unfree_deferred, pool, phys, waiting))

    def complete_in_order(self, done: Iterable[int], failed: Iterable[int] = (), failures: Mapping[int, TransferFailure] | None = None) -> None:
        """Complete the transfers of `done` still in flight, each only after those it waits for;
        those of `failed` (their copy raised) fail instead, with `failures`' outcome where it has one."""
        transfers = self.state.transfers
        for t in sorted(set(failed) & transfers.keys()):
            self.fail_with(t, failures)
        done = set(done)
        progress = True
        while progress:
            progress = False
            for t in sorted(done & transfers.keys()):
                if not transfers[t].waits_for & transfers.keys():
                    self.complete_transfer(t)
                    progress = True

    def complete_all(self, failed: Iterable[int] = (), failures: Mapping[int, TransferFailure] | None = None) -> None:
        """Complete every transfer in flight, dependencies first; those of `failed` fail instead."""
        transfers = self.state.transfers
        for t in sorted(set(failed) & transfers.keys()):
            self.fail_with(t, failures)
        while transfers:
            self.complete_transfer(next(t for t in sorted(transfers) if not transfers[t].waits_for & transfers.keys()))

    def fail_with(self, transfer_id: int, failures: Mapping[int, TransferFailure] | None) -> None:
        """Fail the transfer with the outcome `failures` gives it (a plain failed copy when none)."""
        if failures and transfer_id in failures:
            self.fail_transfer(transfer_id, failures[transfer_id])
        else:
            self.fail_transfer(transfer_id)

    def restoring_pages(self) -> set[int]:
        """Page names that restores and fetches not yet completed fill (empty, and cheap, when none is in flight)."""
        transfers = self.state.transfers
        if not transfers:
            return set()
        return {p for tr in transfers.values() if tr.kind in FILLS_L1 for p, _, _ in tr.pages}

    def await_restores(self, pages: set[int]) -> list[int]:
        """Complete, in dependency order, every transfer filling an L1 copy of `pages`; return their ids.

        The ledger completes them now; the device layer orders compute after the returned
        transfers' device work before it reads the pages (O1, KV_READY).
        """
        transfers = self.state.transfers
        completed: list[int] = []
        while True:
            waiting = [t for t, tr in transfers.items() if tr.kind in FILLS_L1 and any(p in pages for p, _, _ in tr.pages)]
            if not waiting:
                return completed
            chain = {min(waiting)}
            while chain:
                ready = [t for t in sorted(chain) if not transfers[t].waits_for & transfers.keys()]
                if ready:
                    self.complete_transfer(ready[0])
                    completed.append(ready[0])
                    break
                chain = {w for t in chain for w in transfers[t].waits_for if w in transfers}

    def report(self, wait: bool) -> tuple[TransferCompletion, ...]:
        """Hand over the completions due by `self.reporting`, ordered by transfer id (the order is the contract's)."""
        st, held = self.state, self.held
        if not st.unreported and not held:
            return ()
        if not wait and self.reporting is not Reporting.EAGER:
            if self.reporting is Reporting.AT_WAIT:
                return ()
            due, self.held = self.held, list(st.unreported)  # NEXT_POLL: what this poll finds waits one poll
        else:
            due, self.held = [*self.held, *st.unreported], []
        unreported = st.unreported
        self.txn.undo(lambda: _unreport(self, held, unreported))
        st.unreported = []
        return tuple(sorted(due, key=lambda c: c.ticket.transfer_id))


def _unreport(ledger: Transfers, held: list[TransferCompletion], unreported: list[TransferCompletion]) -> None:
    ledger.held, ledger.state.unreported = held, unreported


def _forget_copies(given: list[dict[Tier, Copy]], tier: Tier) -> None:
    for copies in reversed(given):
        copies.pop(tier)


def _uncomplete(tags: list[int], old_tags: list[tuple[int, list[int]]], made_valid: list[tuple[dict[Tier, Copy], Copy]], tier: Tier) -> None:
    for copies, filling in reversed(made_valid):
        copies[tier] = filling
    for at, old in reversed(old_tags):
        tags[at : at + len(old)] = old


def _unfree_deferred(pool: Pool, phys: int, waiting: set[int]) -> None:
    pool.free.pop()
    pool.deferred[phys] = waiting
