"""Tier moves: backup, restore, demote, drop (spec §4.11), in a plan or through `submit`.

Each move checks its preconditions against the state left by the moves before it in the
same call (a `Demote` after a `Backup` of the same extent sees the filling host copies),
then changes the ledger; a backup or restore records a transfer, whose bytes the copier
moves once the call commits.
"""

from __future__ import annotations

from cacheruntime.protocol import (
    Backup,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    InvalidPlan,
    NotBackedUp,
    OutOfPages,
    Restore,
    Tier,
    TierIntent,
    TransferKind,
    TransferTicket,
    WouldLoseData,
)

from .handles import TIER_INTENTS, check_intent
from .ledger import DIRECTION, Copy, Ledger
from .pages import drop_copy, take_phys
from .transfers import start_transfer


def lacking(ledger: Ledger, pages: tuple[int, ...], tier: Tier) -> list[int]:
    """The extent's page names with no copy in `tier`, each once, in extent order."""
    return [name for name in dict.fromkeys(pages) if tier not in ledger.pages[name].copies]


def counts(ledger: Ledger, name: int, tier: Tier) -> bool:
    """Whether page `name` has a copy in `tier` that a precondition may count on: valid or filling.
    A dropping copy (control asked to drop it; it stays until the other tier's copy lands) does not."""
    copy = ledger.pages[name].copies.get(tier)
    return copy is not None and copy.state is not CopyState.DROPPING


def keep_dropping(ledger: Ledger, pages: tuple[int, ...], tier: Tier) -> None:
    """A restore (tier L1) or backup (L2) keeps the pages' dropping copies there: valid again, nothing moves."""
    for name in dict.fromkeys(pages):
        copy = ledger.pages[name].copies.get(tier)
        if copy is not None and copy.state is CopyState.DROPPING:
            copy.state = CopyState.VALID


def drop_or_keep(ledger: Ledger, name: int, tier: Tier) -> None:
    """A demote (tier L1) or drop (L2) of one page: the copy goes now if the other tier's copy is valid;
    while that one is still filling, it stays, dropping, until it lands (write-back loses nothing)."""
    copies = ledger.pages[name].copies
    copy, other = copies.get(tier), copies.get(Tier.L2 if tier is Tier.L1 else Tier.L1)
    if copy is None or copy.state is CopyState.DROPPING:
        return
    if other is not None and other.state is CopyState.FILLING:
        copy.state = CopyState.DROPPING
    else:
        drop_copy(ledger, name, tier)


def require_host_copies(ledger: Ledger, pages: tuple[int, ...], generation: int) -> None:
    """NotBackedUp unless every page without a device copy has a host copy (valid or filling)."""
    if any(not counts(ledger, name, Tier.L2) for name in lacking(ledger, pages, Tier.L1)):
        raise NotBackedUp(f"extent {generation} has pages with neither a device nor a host copy")


def copy_over(ledger: Ledger, kind: TransferKind, generation: int, pages: tuple[int, ...]) -> TransferTicket:
    """Give every page lacking a copy in the destination tier a filling one there, and start the transfer."""
    source, destination = DIRECTION[kind]
    names = lacking(ledger, pages, destination)
    free = len(ledger.pools[destination].free)
    if len(names) > free:
        raise OutOfPages(destination, len(names), free)
    moves = []
    for name, phys in zip(names, take_phys(ledger, destination, len(names))):
        page = ledger.pages[name]
        moves.append((name, page.copies[source].phys, phys))
        page.copies[destination] = Copy(phys, CopyState.FILLING)
    return start_transfer(ledger, kind, generation, moves)


def backup(ledger: Ledger, generation: int, pages: tuple[int, ...]) -> TransferTicket:
    """Pages without a host copy get a filling one, and a D2H starts (it reads device copies
    written by executed compute only, since extents hold computed pages: O2); dropping host copies are kept."""
    keep_dropping(ledger, pages, Tier.L2)
    return copy_over(ledger, TransferKind.BACKUP, generation, pages)


def restore(ledger: Ledger, generation: int, pages: tuple[int, ...]) -> TransferTicket:
    """Pages without a device copy get a filling one, and an H2D starts; dropping device copies are kept."""
    require_host_copies(ledger, pages, generation)
    keep_dropping(ledger, pages, Tier.L1)
    return copy_over(ledger, TransferKind.RESTORE, generation, pages)


def demote(ledger: Ledger, generation: int, pages: tuple[int, ...]) -> None:
    """Device copies go (freed once no transfer reads them: O3), if every page is or is being backed up
    and no live row maps one (scenario 9)."""
    if any(not counts(ledger, name, Tier.L2) for name in pages):
        raise NotBackedUp(f"extent {generation} has pages with no host copy; back it up first")
    if any(slot.live and set(slot.pages) & set(pages) for slot in ledger.slots):
        raise ExtentInUse(f"a live request row maps pages of extent {generation}")
    for name in dict.fromkeys(pages):
        drop_or_keep(ledger, name, Tier.L1)


def drop(ledger: Ledger, generation: int, pages: tuple[int, ...]) -> None:
    """Host copies go (freed once no transfer reads them), if every page keeps a device copy."""
    if any(not counts(ledger, name, Tier.L1) for name in pages):
        raise WouldLoseData(f"extent {generation} has pages whose only copy is on the host")
    for name in dict.fromkeys(pages):
        drop_or_keep(ledger, name, Tier.L2)


MOVES = {Backup: backup, Restore: restore, Demote: demote, Drop: drop}


def move(ledger: Ledger, intent: TierIntent) -> TransferTicket | None:
    """One tier move: its handle checks, preconditions and effects; a ticket for a backup or restore."""
    check_intent(ledger, intent)
    generation = intent.extent.generation
    return MOVES[type(intent)](ledger, generation, ledger.extents[generation].pages)


def submit(ledger: Ledger, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
    """Tier moves outside a plan: first every intent's type and handle, then each move in order."""
    for intent in intents:
        if not isinstance(intent, TIER_INTENTS):
            raise InvalidPlan(f"submit takes Backup, Restore, Demote and Drop only, not {type(intent).__name__}")
        check_intent(ledger, intent)
    tickets = [move(ledger, intent) for intent in intents]
    return tuple(ticket for ticket in tickets if ticket is not None)
