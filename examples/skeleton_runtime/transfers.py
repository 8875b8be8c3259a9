"""Transfers in the ledger: started, waiting on each other, completed, reported (spec §4.11-4.13, §5).

A transfer is two things: bytes that a copy stream moves (`copier.Copier`) and a record
here. The record is created when a call starts the transfer and completed only on the
caller's thread, by a call that either reports it (poll, wait) or must wait for it
anyway (compute's KV_READY wait, restart's drain). So a completion's effects (a copy
becoming valid, a deferred page returning to its free list) never change the outcome of
a call before control could have learnt of them (§5), however fast the bytes land.
"""

from __future__ import annotations

from cacheruntime.protocol import CopyState, TransferCompletion, TransferKind, TransferTicket

from .ledger import DIRECTION, Ledger, Transfer
from .pages import drop_copy, touched


def start_transfer(ledger: Ledger, kind: TransferKind, extent_generation: int, moves: list[tuple[int, int, int]]) -> TransferTicket:
    """Record a transfer (the copier starts it once the call commits); with nothing to move it completes at once.

    It waits for every in-flight transfer that writes one of its sources (a restore
    reading a host copy that a backup is still filling: scenario 1).
    """
    transfer_id = ledger.next_transfer
    ledger.next_transfer += 1
    ticket = TransferTicket(ledger.runtime_id, ledger.epoch, transfer_id, kind, extent_generation, len(moves))
    if not moves:
        ledger.unreported.append(ticket)
        return ticket
    source_tier = DIRECTION[kind][0]
    sources = {src for _, src, _ in moves}
    waits_for = frozenset(
        other_id
        for other_id, other in ledger.transfers.items()
        if DIRECTION[other.ticket.kind][1] is source_tier and any(dst in sources for _, _, dst in other.moves)
    )
    ledger.transfers[transfer_id] = Transfer(ticket, tuple(moves), waits_for)
    return ticket


def complete_transfer(ledger: Ledger, transfer_id: int) -> None:
    """The copies it filled become valid, the deferred pages only it still touched are freed, and it awaits its report."""
    transfer = ledger.transfers.pop(transfer_id)
    source_tier, destination_tier = DIRECTION[transfer.ticket.kind]
    for name, _, dst in transfer.moves:
        page = ledger.pages.get(name)
        copy = page.copies.get(destination_tier) if page is not None else None
        if copy is not None and copy.phys == dst and copy.state is CopyState.FILLING:
            copy.state = CopyState.VALID
            source = page.copies.get(source_tier) if page is not None else None
            if source is not None and source.state is CopyState.DROPPING:
                drop_copy(ledger, name, source_tier)  # write-back: the copy it waited for has landed
    for tier, phys in [(source_tier, src) for _, src, _ in transfer.moves] + [(destination_tier, dst) for _, _, dst in transfer.moves]:
        pool = ledger.pools[tier]
        if phys in pool.deferred and not touched(ledger, tier, phys):
            pool.deferred.remove(phys)
            pool.free.append(phys)
    ledger.unreported.append(transfer.ticket)


def complete_with_predecessors(ledger: Ledger, transfer_ids: set[int]) -> None:
    """Complete these transfers and every transfer they wait for, earliest first (a wait is always on an earlier one)."""
    due = set(transfer_ids)
    for transfer_id in sorted(ledger.transfers, reverse=True):
        if transfer_id in due:
            due |= ledger.transfers[transfer_id].waits_for
    for transfer_id in sorted(due & ledger.transfers.keys()):
        complete_transfer(ledger, transfer_id)


def report(ledger: Ledger) -> tuple[TransferCompletion, ...]:
    """Every completion not reported yet, once, ordered by transfer id."""
    reported = tuple(TransferCompletion(ticket) for ticket in sorted(ledger.unreported, key=lambda t: t.transfer_id))
    ledger.unreported.clear()
    return reported
