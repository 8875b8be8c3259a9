"""The invariant catalogue as predicates on `AbstractState`.

Each predicate is named by its catalogue id (`spec/invariants.md`) and returns a list
of violations, empty when it holds. State predicates read one state; transition
predicates read the states before and after one call. The same predicates judge the
reference model (`ReferenceModel.check_invariants`) and, through `probe()`, any runtime
that claims INTROSPECTION (the conformance suite). E1..E4 concern the prefix tree and
live with the eviction policy in `cacheruntime.control.policy`.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable

import attrs

from cacheruntime import protocol
from cacheruntime.protocol import AbstractState, BatchState, CopyState, RequestRuntimeHandle, Tier, TransferKind

Violations = list[str]


class InvariantViolation(AssertionError):
    """An invariant of the catalogue does not hold; `invariant` is its id."""

    def __init__(self, invariant: str, violations: Violations):
        self.invariant = invariant
        self.violations = violations
        super().__init__(f"{invariant}: " + "; ".join(violations[:5]))


def _live_holders(state: AbstractState) -> Counter:
    held: Counter = Counter()
    for slot in state.slots:
        if slot.live:
            held.update(slot.pages)
    for extent in state.extents:
        held.update(extent.pages)
    return held


def _pool(state: AbstractState, tier: Tier) -> protocol.PoolView:
    return next(pool for pool in state.pools if pool.tier is tier)


def _page_phys(state: AbstractState, tier: Tier) -> dict[int, int]:
    return {name: phys for phys, name in _pool(state, tier).mapped}


# -- request handles -------------------------------------------------------------------


def H2_generation_monotone(before: AbstractState, after: AbstractState) -> Violations:
    """A slot's generation never decreases, and a slot that stops being live moves past it."""
    out = []
    for old, new in zip(before.slots, after.slots):
        if new.generation < old.generation:
            out.append(f"slot {old.slot_id}: generation fell from {old.generation} to {new.generation}")
        if old.live and not new.live and new.generation <= old.generation:
            out.append(f"slot {old.slot_id}: closed without a new generation ({old.generation})")
    return out


def H3_one_live_handle(state: AbstractState, issued: list[RequestRuntimeHandle]) -> Violations:
    """Of all handles ever issued, at most one per slot names the slot's live generation."""
    current: Counter = Counter()
    for handle in set(issued):
        slot = state.slots[handle.slot_id]
        if handle.epoch == state.epoch and slot.live and handle.generation == slot.generation:
            current[handle.slot_id] += 1
    return [f"slot {s}: {n} live handles" for s, n in current.items() if n > 1]


def H3_open_takes_a_free_slot(before: AbstractState, handle: RequestRuntimeHandle) -> Violations:
    """`open_request` hands out a slot that was not live: never a second handle to a live row."""
    slot = before.slots[handle.slot_id] if 0 <= handle.slot_id < len(before.slots) else None
    if slot is not None and slot.live and handle.epoch == before.epoch:
        return [f"open_request returned slot {handle.slot_id}, which was live at generation {slot.generation}"]
    return []


# -- pages and pools -------------------------------------------------------------------


def R1_pages_conserved(state: AbstractState) -> Violations:
    """Every physical page is exactly one of free, mapped to a page name, or deferred."""
    out = []
    for pool in state.pools:
        every = list(pool.free) + [phys for phys, _ in pool.mapped] + list(pool.deferred)
        if sorted(every) != list(range(pool.total)):
            counts = Counter(every)
            lost = sorted(set(range(pool.total)) - set(every))
            twice = sorted(p for p, n in counts.items() if n > 1)
            out.append(f"{pool.tier.value}: lost {lost[:8]}, counted twice {twice[:8]}, total {pool.total}")
    return out


def R2_no_use_after_free(state: AbstractState) -> Violations:
    """No physical page of a page name held by a live row or extent is on a free list."""
    out = []
    held = _live_holders(state)
    for tier in Tier:
        free = set(_pool(state, tier).free)
        for name, phys in _page_phys(state, tier).items():
            if name in held and phys in free:
                out.append(f"page {name}: its {tier.value} page {phys} is on the free list")
    known = {page.page for page in state.pages}
    out += [f"page {name} is held but does not exist" for name in held if name not in known]
    return out


def R3_refcount_is_holders(state: AbstractState) -> Violations:
    """A page's holder count equals its live rows and extents, and is positive."""
    held = _live_holders(state)
    out = [f"page {p.page}: holders {p.holders}, live holders {held[p.page]}" for p in state.pages if p.holders != held[p.page]]
    out += [f"page {p.page}: holders {p.holders} <= 0" for p in state.pages if p.holders <= 0]
    return out


def R4_no_double_free(state: AbstractState) -> Violations:
    """No physical page is on a free list twice, or free while also mapped or deferred."""
    out = []
    for pool in state.pools:
        counts = Counter(pool.free)
        out += [f"{pool.tier.value} page {p} is free {n} times" for p, n in counts.items() if n > 1]
        busy = {phys for phys, _ in pool.mapped} | set(pool.deferred)
        out += [f"{pool.tier.value} page {p} is free and in use" for p in sorted(set(pool.free) & busy)]
    return out


# -- ordering --------------------------------------------------------------------------


def O1_rows_readable(state: AbstractState) -> Violations:
    """Every page a live row has computed over has a valid device copy (compute waited for KV_READY)."""
    out = []
    pages = {p.page: p for p in state.pages}
    for slot in state.slots:
        if not slot.live:
            continue
        for name in slot.pages[: -(-slot.num_tokens // state.page_size)]:
            if pages[name].l1 is not CopyState.VALID:
                out.append(f"slot {slot.slot_id}: computed page {name} has L1 copy {pages[name].l1.value}")
    return out


def O2_backup_after_compute(state: AbstractState) -> Violations:
    """An in-flight D2H (a backup, or a persist) only moves pages whose every token was written by completed compute."""
    pages = {p.page: p for p in state.pages}
    return [
        f"{t.kind.value} {t.transfer_id}: page {name} is not fully written"
        for t in state.transfers
        if t.kind is TransferKind.BACKUP or t.kind is TransferKind.PERSIST
        for name in t.pages
        if name in pages and 0 in pages[name].versions
    ]


def O3_no_reuse_in_flight(state: AbstractState) -> Violations:
    """No physical page that an in-flight transfer reads or writes is on a free list."""
    out = []
    for t in state.transfers:
        src_tier, dst_tier = _transfer_tiers(t)
        for tier, phys_pages in ((src_tier, t.sources), (dst_tier, t.destinations)):
            free = set(_pool(state, tier).free)
            out += [f"transfer {t.transfer_id}: {tier.value} page {p} is free" for p in phys_pages if p in free]
    return out


def _transfer_tiers(t: protocol.TransferView) -> tuple[Tier, Tier]:
    """The tiers of a transfer's sources and destinations (TransferView): a backup, and a persist
    that stages (buffer_only), read the device and write host pages; every other transfer reads
    host pages (a restore's host copy, a fetch's staging, a resident persist's host copy)."""
    if t.kind is TransferKind.BACKUP or (t.kind is TransferKind.PERSIST and t.destinations):
        return Tier.L1, Tier.L2
    return Tier.L2, Tier.L1


def O4_execute_once(before: AbstractState, after: AbstractState) -> Violations:
    """A batch leaves the prepared state once, and an executed or cancelled batch stays so."""
    if before.epoch != after.epoch:
        return []
    new = {b.batch_id: b.state for b in after.batches}
    return [
        f"batch {b.batch_id}: {b.state} became {new.get(b.batch_id)}"
        for b in before.batches
        if b.state != BatchState.PREPARED and new.get(b.batch_id) != b.state
    ]


# -- the boundary ----------------------------------------------------------------------


def B1_calls_per_batch(state: AbstractState, bound: int) -> Violations:
    """Boundary calls per executed batch stay under a bound that does not grow with tokens."""
    calls = dict(state.boundary_calls)
    batches = calls.get("execute_batch", 0)
    total = sum(calls.values())
    if batches and total > bound * batches:
        return [f"{total} boundary calls for {batches} batches exceeds {bound} per batch"]
    return []


_PLAIN = (int, str, bool, float, type(None), enum.Enum)


def B2_plain_values(value: object, path: str = "value") -> Violations:
    """A value that crosses to control is built only of protocol types, ints, strings and tuples."""
    if isinstance(value, _PLAIN):
        return []
    if isinstance(value, (tuple, frozenset)):
        return [v for i, item in enumerate(value) for v in B2_plain_values(item, f"{path}[{i}]")]
    if attrs.has(type(value)) and type(value).__module__ == protocol.__name__:
        return [v for f in attrs.fields(type(value)) for v in B2_plain_values(getattr(value, f.name), f"{path}.{f.name}")]
    return [f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which must not cross the boundary"]


# -- data ------------------------------------------------------------------------------


def D1_copies_hold_last_write(state: AbstractState) -> Violations:
    """Every readable copy of a page (valid, or dropping) holds, at every written position, the tag last written there;
    and a live extent covers one or more pages, each written at every position (publish takes full, computed pages
    only), so a row that attaches it reads bytes that were written."""
    out = []
    written = {page.page: all(page.versions) for page in state.pages}
    for extent in state.extents:
        if not extent.pages:
            out.append(f"extent {extent.generation} covers no page")
        unwritten = [name for name in extent.pages if not written.get(name, False)]
        if unwritten:
            out.append(f"extent {extent.generation}: pages {unwritten} were never written in full")
    for page in state.pages:
        for tier, copy_state, tags in ((Tier.L1, page.l1, page.l1_tags), (Tier.L2, page.l2, page.l2_tags)):
            if not copy_state.readable:
                continue
            bad = [i for i, v in enumerate(page.versions) if v and tags[i] != v]
            if bad:
                out.append(f"page {page.page} {tier.value}: positions {bad} hold {[tags[i] for i in bad]}, last written {[page.versions[i] for i in bad]}")
    return out


# -- failure ---------------------------------------------------------------------------


def F1_a_readable_copy_survives(state: AbstractState) -> Violations:
    """Every page name has a readable copy (valid or dropping) in some tier: no transfer, failed
    or not, and no write-back leaves a page with only copies that are filling or gone. The one
    page that has none is a fetched page nothing was written to yet (its fetch in flight, or
    failed: its batch fails and the page ends with it, §9.4)."""
    keyed = dict(state.page_keys)
    return [
        f"page {page.page}: L1 copy {page.l1.value}, L2 copy {page.l2.value}; no readable copy"
        for page in state.pages
        if not (page.l1.readable or page.l2.readable) and not (page.page in keyed and not any(page.versions))
    ]


def F2_failed_batch_invisible(before: AbstractState, after: AbstractState) -> Violations:
    """A batch that failed (`ComputeFailed`) left nothing control can see of what it would have written:
    every row's length as before, and every page that lives on its versions and readable tags as before."""
    out = []
    for old, new in zip(before.slots, after.slots):
        if new.live and new.num_tokens != old.num_tokens:
            out.append(f"slot {new.slot_id}: num_tokens {old.num_tokens} -> {new.num_tokens} after a failed batch")
    previous = {page.page: page for page in before.pages}
    for page in after.pages:
        old_page = previous.get(page.page)
        if old_page is None:
            continue
        if page.versions != old_page.versions:
            out.append(f"page {page.page}: versions {list(old_page.versions)} -> {list(page.versions)} after a failed batch")
        for tier, state_before, state_after, tags_before, tags_after in (
            (Tier.L1, old_page.l1, page.l1, old_page.l1_tags, page.l1_tags),
            (Tier.L2, old_page.l2, page.l2, old_page.l2_tags, page.l2_tags),
        ):
            written = [i for i, v in enumerate(page.versions) if v]
            if state_before.readable and state_after.readable and [tags_before[i] for i in written] != [tags_after[i] for i in written]:
                out.append(f"page {page.page} {tier.value}: written tags changed after a failed batch")
    return out


# -- transfers -------------------------------------------------------------------------


def T2_filling_has_transfer(state: AbstractState) -> Violations:
    """A filling copy has in flight the transfer that writes it (a restore into a device copy, a
    backup into a host copy); a dropping copy waits for its page's copy in the other tier, filling."""
    out = []
    writes = {(t.kind, name, dst) for t in state.transfers for name, dst in zip(t.pages, t.destinations)}
    phys = {tier: _page_phys(state, tier) for tier in (Tier.L1, Tier.L2)}
    for page in state.pages:
        for tier, copy, other, kinds in (
            (Tier.L1, page.l1, page.l2, (TransferKind.RESTORE, TransferKind.FETCH)),
            (Tier.L2, page.l2, page.l1, (TransferKind.BACKUP,)),
        ):
            if copy is CopyState.FILLING and not any((kind, page.page, phys[tier].get(page.page)) in writes for kind in kinds):
                out.append(f"page {page.page}: {tier.value} copy filling with no {' or '.join(k.value for k in kinds)} in flight writing it")
            if copy is CopyState.DROPPING and other is not CopyState.FILLING:
                out.append(f"page {page.page}: {tier.value} copy dropping while the other tier's copy is {other.value}")
    return out


def T4_submit_applies(after: AbstractState, intents: tuple[object, ...], tickets: tuple[object, ...]) -> Violations:
    """A submit the runtime accepted did what its intents say: a ticket per Backup, Restore and
    Persist, and on every page of the last intent's extent the copy it asks for. Judged in the
    state right after the submit: a transfer that lands or fails later moves the copies on."""
    out = []
    ticketed = sum(isinstance(i, (protocol.Backup, protocol.Restore, protocol.Persist)) for i in intents)
    if len(tickets) != ticketed:
        out.append(f"{len(tickets)} tickets for {ticketed} Backup, Restore and Persist intents")
    last = intents[-1] if intents else None
    kept, gone = (CopyState.VALID, CopyState.FILLING), (CopyState.ABSENT, CopyState.DROPPING)
    asked = {protocol.Backup: (Tier.L2, kept), protocol.Restore: (Tier.L1, kept), protocol.Demote: (Tier.L1, gone), protocol.Drop: (Tier.L2, gone)}
    if not isinstance(last, (protocol.Backup, protocol.Restore, protocol.Demote, protocol.Drop)):
        return out
    tier, allowed = asked[type(last)]
    extent = next((e for e in after.extents if e.generation == last.extent.generation), None)
    copies = {p.page: (p.l1 if tier is Tier.L1 else p.l2) for p in after.pages}
    for page in extent.pages if extent else ():
        copy = copies.get(page, CopyState.ABSENT)
        if copy not in allowed:
            out.append(f"after {type(last).__name__}: page {page}'s {tier.value} copy is {copy.value}")
    return out


# -- L3 and host staging ------------------------------------------------------------------


def _staging(t: protocol.TransferView) -> tuple[int, ...]:
    """The host staging pages of an in-flight L3 transfer: a fetch's sources, a staged persist's destinations."""
    if t.kind is TransferKind.FETCH:
        return t.sources
    if t.kind is TransferKind.PERSIST:
        return t.destinations
    return ()


def S1_host_pages_only_stage(state: AbstractState) -> Violations:
    """buffer_only: no host page holds a copy of a page outside a transfer in flight: no page name
    has a host copy, and every host page in use is the staging of an in-flight L3 transfer."""
    out = [f"page {page.page}: host copy {page.l2.value} in buffer_only mode" for page in state.pages if page.l2 is not CopyState.ABSENT]
    host = _pool(state, Tier.L2)
    staging = {p for t in state.transfers for p in _staging(t)}
    out += [f"host page {phys} is mapped to page {name} in buffer_only mode" for phys, name in host.mapped]
    out += [f"host page {phys} is in use but stages no transfer in flight" for phys in host.deferred if phys not in staging]
    return out


def S2_staging_held_until_done(state: AbstractState) -> Violations:
    """A staging host page is reused only after its store write (persist) or device write (fetch)
    completed: while its transfer is in flight it is neither free nor another page's copy."""
    host = _pool(state, Tier.L2)
    free, mapped = set(host.free), {phys for phys, _ in host.mapped}
    out = []
    for t in state.transfers:
        for phys in _staging(t):
            if phys in free:
                out.append(f"{t.kind.value} {t.transfer_id}: its staging host page {phys} is free")
            if phys in mapped:
                out.append(f"{t.kind.value} {t.transfer_id}: its staging host page {phys} holds a page's copy")
    return out


def S3_objects_match_pages(state: AbstractState) -> Violations:
    """A page and the L3 object under its key hold the same bytes: a persist writes the page's
    tags, a fetch that lands gives the page its object's tags (and one whose object is gone
    misses, never lands), at every position written."""
    objects = {o.key: o.tags for o in state.objects}
    pages = {p.page: p for p in state.pages}
    out = []
    for name, key in state.page_keys:
        page = pages.get(name)
        if page is None or key not in objects or not any(page.versions):
            continue
        bad = [i for i, v in enumerate(page.versions) if v and objects[key][i] != v]
        if bad:
            out.append(f"page {name}: object {key!r} holds {[objects[key][i] for i in bad]} at positions {bad}, the page {[page.versions[i] for i in bad]}")
    return out


#: Every predicate that reads one state, by catalogue id.
STATE_INVARIANTS: dict[str, Callable[[AbstractState], Violations]] = {
    "R1": R1_pages_conserved,
    "R2": R2_no_use_after_free,
    "R3": R3_refcount_is_holders,
    "R4": R4_no_double_free,
    "O1": O1_rows_readable,
    "O2": O2_backup_after_compute,
    "O3": O3_no_reuse_in_flight,
    "D1": D1_copies_hold_last_write,
    "F1": F1_a_readable_copy_survives,
    "S2": S2_staging_held_until_done,
    "S3": S3_objects_match_pages,
}

#: Every predicate that reads the states before and after one call, by catalogue id.
TRANSITION_INVARIANTS: dict[str, Callable[[AbstractState, AbstractState], Violations]] = {
    "H2": H2_generation_monotone,
    "O4": O4_execute_once,
}


def check_state(state: AbstractState) -> None:
    """Raise `InvariantViolation` for the first state invariant that does not hold."""
    for invariant, predicate in STATE_INVARIANTS.items():
        violations = predicate(state)
        if violations:
            raise InvariantViolation(invariant, violations)


def check_transition(before: AbstractState, after: AbstractState) -> None:
    """Raise `InvariantViolation` for the first transition invariant that does not hold."""
    for invariant, predicate in TRANSITION_INVARIANTS.items():
        violations = predicate(before, after)
        if violations:
            raise InvariantViolation(invariant, violations)


def _defined(state: AbstractState) -> AbstractState:
    """The state with the bytes the contract leaves undefined masked: tags of copies not yet valid.

    An in-flight transfer keeps writing its destination while nothing else happens, so
    those bytes may differ between two probes of an unchanged runtime.
    """
    pages = tuple(
        attrs.evolve(
            page,
            l1_tags=page.l1_tags if page.l1.readable else (),
            l2_tags=page.l2_tags if page.l2.readable else (),
        )
        for page in state.pages
    )
    return attrs.evolve(state, pages=pages)


def H1_failed_call_changes_nothing(before: AbstractState, after: AbstractState) -> Violations:
    """A call that raised (a stale handle above all) left the abstract state as it was."""
    before, after = _defined(before), _defined(after)
    if before == after:
        return []
    return ["a failed call changed the state: " + ", ".join(f.name for f in attrs.fields(AbstractState) if getattr(before, f.name) != getattr(after, f.name))]
