"""What the suite compares of `probe()`: the relations the contract fixes, in the model's names.

A runtime that claims INTROSPECTION shows its abstract state; the suite holds it to the
model's only where spec/protocol.md §2.1 fixes it, and only through the renaming
(`cacheruntime.conformance.renaming`):

- page names, extent generations, batch ids and transfer ids are renamed to the model's
  (a value the renaming cannot account for shows as `Unmatched` and differs);
- physical page numbers are never compared as numbers: per probe, each tier's physical
  pages are matched one to one through what they hold (the copy of a page name) and
  what reads or writes them (an in-flight transfer's page), and the deferred frees and
  the transfers' sources and destinations must agree under that matching; free lists
  are compared by their length;
- what control cannot observe is left out: the rows and token counts of slots that are
  not live (a closed slot, or every slot after a restart), and the tags of positions
  nobody wrote (their bytes are whatever the physical page held before). Tags are
  compared, for runtimes that claim TAGGED_COMPUTE, only in valid copies and only at
  written positions (D1);
- L3 (spec/protocol.md §9): the keys control gave pages (page names renamed) and the
  store's objects by key, with their tags where TAGGED_COMPUTE is claimed (S3).

`align` learns the renaming from two probes of the same moment (rows by position,
extents already bound, in-flight transfers by the pages they move); `compare` returns
the differences, each with the id it is evidence for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from cacheruntime.conformance.renaming import Bijection, Kind, Renaming
from cacheruntime.protocol import AbstractState, CopyState, Tier, TransferKind, TransferView


@attrs.frozen
class Difference:
    """One way a runtime's probe differs from the model's: the id it is evidence for, where, and how."""

    id: str
    field: str
    detail: str


def _tiers(transfer: TransferView) -> tuple[Tier, Tier]:
    """(source tier, destination tier) of a transfer's listed pages: a backup's run device to host; a
    persist's through staging (buffer_only, the one that lists destinations) too; a persist from
    host copies (resident) and a fetch (staging to device) read the host."""
    if transfer.kind is TransferKind.BACKUP or (transfer.kind is TransferKind.PERSIST and transfer.destinations):
        return (Tier.L1, Tier.L2)
    return (Tier.L2, Tier.L1)


def _moves(transfer: TransferView) -> list[tuple[int, int, int | None]]:
    """A transfer's (page, source, destination) per page; a persist from host copies has no destination (None)."""
    if not transfer.destinations:
        return [(page, source, None) for page, source in zip(transfer.pages, transfer.sources)]
    return list(zip(transfer.pages, transfer.sources, transfer.destinations))


def align(renaming: Renaming, runtime: AbstractState, model: AbstractState) -> list[Difference]:
    """Learn page names and transfer ids from two probes of the same moment; the conflicts met.

    Rows are matched by position (slot ids and token order are fixed), the pages of an
    extent whose generation is already bound by position, and an in-flight transfer not
    yet bound to the model's transfer of the same kind moving the same pages.
    """
    if runtime.epoch != model.epoch:
        return []  # compare reports the epoch; nothing can be matched across epochs
    epoch, found = runtime.epoch, []
    pages = renaming.bijection(Kind.PAGE, epoch)
    for mine, theirs in zip(runtime.slots, model.slots):
        if mine.live and theirs.live:
            for a, b in zip(mine.pages, theirs.pages):
                if problem := pages.bind(a, b):
                    found.append(Difference("probe:slots", f"slot {mine.slot_id}", problem))
    extents = renaming.bijection(Kind.EXTENT, epoch)
    model_extents = {e.generation: e for e in model.extents}
    for extent in runtime.extents:
        counterpart = model_extents.get(extents.forward.get(extent.generation, -1))
        if counterpart is not None:
            for a, b in zip(extent.pages, counterpart.pages):
                if problem := pages.bind(a, b):
                    found.append(Difference("probe:extents", f"extent {extent.generation}", problem))
    transfers = renaming.bijection(Kind.TRANSFER, epoch)
    unbound = [t for t in model.transfers if t.transfer_id not in transfers.backward]
    for transfer in runtime.transfers:
        if transfer.transfer_id in transfers.forward:
            continue
        moved = sorted(pages.image(p) for p in transfer.pages if p in pages.forward)
        same = [t for t in unbound if t.kind is transfer.kind and len(moved) == len(transfer.pages) and sorted(t.pages) == moved]
        if same:
            transfers.bind(transfer.transfer_id, same[0].transfer_id)
            unbound.remove(same[0])
    return found


def in_flight(renaming: Renaming, runtime: AbstractState, model: AbstractState) -> set[int]:
    """The model's ids of the transfers the runtime's probe still shows in flight (learning the renaming first)."""
    align(renaming, runtime, model)
    transfers = renaming.bijection(Kind.TRANSFER, runtime.epoch)
    return {transfers.forward[t.transfer_id] for t in runtime.transfers if t.transfer_id in transfers.forward}


def _physical(renaming: Renaming, runtime: AbstractState, model: AbstractState, found: list[Difference]) -> dict[Tier, Bijection]:
    """Per tier, the runtime's physical pages in use matched to the model's: through the page each holds a
    copy of, then through the in-flight transfers (a deferred page is always touched by one)."""
    pages = renaming.bijection(Kind.PAGE, runtime.epoch)
    physical = {tier: Bijection(f"{tier.value} physical page") for tier in Tier}
    held = {(pool.tier, name): phys for pool in model.pools for phys, name in pool.mapped}
    for pool in runtime.pools:
        for phys, name in pool.mapped:
            theirs = held.get((pool.tier, pages.forward.get(name, -1)))
            if theirs is not None and (problem := physical[pool.tier].bind(phys, theirs)):
                found.append(Difference("probe:pools", f"{pool.tier.value} page {phys} (copy of page {name})", problem))
    transfers = renaming.bijection(Kind.TRANSFER, runtime.epoch)
    model_transfers = {t.transfer_id: t for t in model.transfers}
    for transfer in runtime.transfers:
        counterpart = model_transfers.get(transfers.forward.get(transfer.transfer_id, -1))
        if counterpart is None:
            continue
        src_tier, dst_tier = _tiers(transfer)
        ends = {p: (s, d) for p, s, d in _moves(counterpart)}
        for name, src, dst in _moves(transfer):
            model_ends = ends.get(pages.forward.get(name, -1))
            if model_ends is None:
                continue
            for tier, mine, model_phys in ((src_tier, src, model_ends[0]), (dst_tier, dst, model_ends[1])):
                if mine is not None and model_phys is not None and (problem := physical[tier].bind(mine, model_phys)):
                    found.append(Difference("probe:transfers", f"transfer {transfer.transfer_id} page {name}", problem))
    return physical


def _rows(rows: Iterable[tuple]) -> tuple[tuple, ...]:
    """Rows in a canonical order (their repr: renamed values may be `Unmatched`)."""
    return tuple(sorted(rows, key=repr))


def _written(state: CopyState, tags: tuple[int, ...], versions: tuple[int, ...]) -> tuple[int | None, ...] | None:
    """A copy's tags where the contract defines them: valid copies, written positions (D1)."""
    if state is not CopyState.VALID:
        return None
    return tuple(tag if version else None for tag, version in zip(tags, versions))


def project(
    state: AbstractState,
    tagged: bool,
    name: Callable[[Kind, int], object],
    phys: Callable[[Tier, int], object],
) -> dict[str, tuple[str, object]]:
    """The parts of a probe the contract fixes, each with the id a mismatch is evidence for.

    `name(kind, value)` and `phys(tier, page)` rename the runtime's numbers to the
    model's (identity for the model itself).
    """

    def page(p: int) -> object:
        return name(Kind.PAGE, p)

    return {
        "epoch": ("probe:epoch", state.epoch),
        "slots": (
            "probe:slots",
            tuple((s.slot_id, s.generation, s.live) + ((tuple(map(page, s.pages)), s.num_tokens, s.reserved_tokens) if s.live else ()) for s in state.slots),
        ),
        "pages": ("probe:pages", _rows((page(p.page), p.holders, p.l1, p.l2, p.versions) for p in state.pages)),
        "tags": (
            "D1",
            _rows((page(p.page), _written(p.l1, p.l1_tags, p.versions), _written(p.l2, p.l2_tags, p.versions)) for p in state.pages) if tagged else (),
        ),
        "extents": ("probe:extents", _rows((name(Kind.EXTENT, e.generation), tuple(map(page, e.pages)), e.refcount) for e in state.extents)),
        "batches": ("probe:batches", _rows((name(Kind.BATCH, b.batch_id), b.state, b.slots) for b in state.batches)),
        "transfers": (
            "probe:transfers",
            _rows(
                (
                    name(Kind.TRANSFER, t.transfer_id),
                    t.kind,
                    _rows((page(p), phys(_tiers(t)[0], s), None if d is None else phys(_tiers(t)[1], d)) for p, s, d in _moves(t)),
                )
                for t in state.transfers
            ),
        ),
        "free": ("probe:free", tuple(sorted((pool.tier.value, len(pool.free)) for pool in state.pools))),
        "deferred": ("probe:deferred", tuple(sorted((pool.tier.value, _rows((phys(pool.tier, d),) for d in pool.deferred)) for pool in state.pools))),
        "boundary_calls": ("B1", state.boundary_calls),
        # L3 (empty without it): control's key of each page, and the store's objects, by key; their
        # tags (the bytes) where TAGGED_COMPUTE is claimed, else only which keys are there (S3)
        "page_keys": ("probe:page_keys", _rows((page(p), key) for p, key in state.page_keys)),
        "objects": ("S3", tuple((o.key, o.tags if tagged else ()) for o in state.objects)),
    }


def observable(state: AbstractState) -> AbstractState:
    """The probe with what control cannot observe made canonical, so two probes differ only where control could tell.

    A free list's order only decides which physical page a later copy takes (placement,
    the runtime's), so it is sorted; the tags of positions nobody wrote are blanked; a
    slot that is not live shows only its generation. H1 compares these before and after a
    failed call.
    """
    return attrs.evolve(
        state,
        slots=tuple(s if s.live else attrs.evolve(s, pages=(), num_tokens=0, reserved_tokens=0) for s in state.slots),
        pages=tuple(
            attrs.evolve(
                p,
                l1_tags=tuple(tag if version else 0 for tag, version in zip(p.l1_tags, p.versions)),
                l2_tags=tuple(tag if version else 0 for tag, version in zip(p.l2_tags, p.versions)),
            )
            for p in state.pages
        ),
        pools=tuple(attrs.evolve(pool, free=tuple(sorted(pool.free))) for pool in state.pools),
    )


def compare(renaming: Renaming, runtime: AbstractState, model: AbstractState, tagged: bool) -> list[Difference]:
    """Every difference between the runtime's probe and the model's, up to renaming (empty when none)."""
    found = align(renaming, runtime, model)
    physical = _physical(renaming, runtime, model, found)
    epoch = runtime.epoch

    def renamed(kind: Kind, value: int) -> object:
        return renaming.bijection(kind, epoch).image(value)

    def renamed_phys(tier: Tier, page: int) -> object:
        return physical[tier].image(page)

    mine = project(runtime, tagged, renamed, renamed_phys)
    theirs = project(model, tagged, lambda kind, value: value, lambda tier, page: page)
    found += [Difference(mine[key][0], key, f"runtime {mine[key][1]!r}, model {theirs[key][1]!r}") for key in mine if mine[key][1] != theirs[key][1]]
    return found
