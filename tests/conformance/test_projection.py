"""The probe comparison: renamed names and placements agree, unobservable bytes are ignored, relations are not."""

import attrs

from cacheruntime.conformance import projection
from cacheruntime.conformance.renaming import Kind, Renaming
from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import AbstractState, Backup, BatchItem, BatchPlan, Demote, Restore, Tier


def scenario() -> AbstractState:
    """Two rows, one published, backed up and demoted, then restored and demoted again while the restore
    runs (its new device pages deferred behind the H2D), one closed."""
    model = ReferenceModel(runtime_id="rt", page_size=2, max_requests=3, max_request_tokens=16, l1_pages=8, l2_pages=8)
    first, second, third = model.open_request(), model.open_request(), model.open_request()
    model.execute_batch(model.prepare_batch(BatchPlan((BatchItem(first, (1, 2, 3, 4)), BatchItem(second, (5, 6, 7)), BatchItem(third, (8,))))))
    extent = model.publish(first, 0, 2)
    model.close_request(first)
    model.close_request(third)
    model.submit((Backup(extent),))
    model.wait_completions()
    model.submit((Demote(extent),))
    model.submit((Restore(extent),))
    model.submit((Demote(extent),))  # the filling device copies go; their pages wait for the H2D (O3)
    return model.probe()


NAMES = {Kind.PAGE: lambda n: 100 + 3 * n, Kind.EXTENT: lambda g: 7 + g, Kind.BATCH: lambda b: 40 + b, Kind.TRANSFER: lambda t: 9 + 2 * t}


def renamed(state: AbstractState) -> AbstractState:
    """The same state as a runtime with other numbers and the physical pages in reverse order would show it."""
    page, extent, batch, transfer = (NAMES[k] for k in (Kind.PAGE, Kind.EXTENT, Kind.BATCH, Kind.TRANSFER))
    total = {pool.tier: pool.total for pool in state.pools}

    def phys(tier: Tier, p: int) -> int:
        return total[tier] - 1 - p

    return attrs.evolve(
        state,
        slots=tuple(attrs.evolve(s, pages=tuple(map(page, s.pages))) for s in state.slots),
        pages=tuple(attrs.evolve(p, page=page(p.page)) for p in state.pages),
        pools=tuple(
            attrs.evolve(
                pool,
                free=tuple(phys(pool.tier, p) for p in reversed(pool.free)),
                mapped=tuple(sorted((phys(pool.tier, p), page(n)) for p, n in pool.mapped)),
                deferred=tuple(sorted(phys(pool.tier, p) for p in pool.deferred)),
            )
            for pool in state.pools
        ),
        extents=tuple(attrs.evolve(e, generation=extent(e.generation), pages=tuple(map(page, e.pages))) for e in state.extents),
        batches=tuple(attrs.evolve(b, batch_id=batch(b.batch_id)) for b in state.batches),
        transfers=tuple(
            attrs.evolve(
                t,
                transfer_id=transfer(t.transfer_id),
                pages=tuple(map(page, t.pages)),
                sources=tuple(phys(Tier.L1, p) for p in t.sources),
                destinations=tuple(phys(Tier.L2, p) for p in t.destinations),
            )
            for t in state.transfers
        ),
    )


def learned(state: AbstractState) -> Renaming:
    """A renaming that has seen the extents and batches returned (as the machine learns them from values)."""
    renaming = Renaming()
    for e in state.extents:
        renaming.bijection(Kind.EXTENT, state.epoch).bind(NAMES[Kind.EXTENT](e.generation), e.generation)
    for b in state.batches:
        renaming.bijection(Kind.BATCH, state.epoch).bind(NAMES[Kind.BATCH](b.batch_id), b.batch_id)
    return renaming


def test_a_renamed_runtime_with_other_placement_matches_the_model():
    model = scenario()
    assert model.transfers and any(pool.deferred for pool in model.pools)
    renaming = learned(model)
    assert projection.compare(renaming, renamed(model), model, tagged=True) == []
    assert projection.in_flight(renaming, renamed(model), model) == {t.transfer_id for t in model.transfers}


def test_what_control_cannot_observe_is_not_compared():
    model = scenario()
    runtime = renamed(model)
    unwritten = next(p for p in runtime.pages if 0 in p.versions)  # the second row's last page: one position written
    runtime = attrs.evolve(
        runtime,
        pages=tuple(attrs.evolve(p, l1_tags=tuple(t if v else 99 for t, v in zip(p.l1_tags, p.versions))) for p in runtime.pages),
        slots=tuple(s if s.live else attrs.evolve(s, num_tokens=5, pages=(1,)) for s in runtime.slots),
    )
    assert unwritten.page in {p.page for p in runtime.pages}
    assert projection.compare(learned(model), runtime, model, tagged=True) == []
    assert projection.observable(runtime) == projection.observable(renamed(model))


def test_relations_are_compared_through_the_renaming():
    model = scenario()
    runtime = renamed(model)
    row = next(s for s in runtime.slots if s.live)
    swapped = attrs.evolve(runtime, slots=tuple(attrs.evolve(s, pages=s.pages[::-1]) if s is row else s for s in runtime.slots))
    renaming = learned(model)
    assert projection.compare(renaming, runtime, model, tagged=True) == []  # learns the rows' names
    ids = {d.id for d in projection.compare(renaming, swapped, model, tagged=True)}
    assert "probe:slots" in ids
    # a deferred page that is not the one the model defers (the device copy of another page)
    l1 = next(pool for pool in runtime.pools if pool.tier is Tier.L1)
    other = next(p for p, _ in l1.mapped)
    moved = attrs.evolve(runtime, pools=tuple(attrs.evolve(pool, deferred=(other,)) if pool is l1 else pool for pool in runtime.pools))
    assert {d.id for d in projection.compare(learned(model), moved, model, tagged=True)} == {"probe:deferred"}
    # a free count that differs
    fewer = attrs.evolve(runtime, pools=tuple(attrs.evolve(pool, free=pool.free[1:]) if pool is l1 else pool for pool in runtime.pools))
    assert {d.id for d in projection.compare(learned(model), fewer, model, tagged=True)} == {"probe:free"}
    # an extent the runtime never returned is matched to nothing
    assert "probe:extents" in {d.id for d in projection.compare(Renaming(), runtime, model, tagged=True)}
