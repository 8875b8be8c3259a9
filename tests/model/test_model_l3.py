"""The L3 tier on the reference model (spec/protocol.md §9): Persist, Fetch, `l3_exists`, the
store's environment (objects removed, operations failing), and both host modes.

Each precondition's typed error (and that it changes nothing), each effect, a miss, a store
failure, and the staging rule of buffer_only mode (S1, S2), with every invariant checked after
each step. Scenario 11 is replayed in
tests/test_scenarios.py.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from modelkit import PS, compute, extent, fails, free, item, new_model, plan

from cacheruntime.invariants import H1_failed_call_changes_nothing, S1_host_pages_only_stage, S2_staging_held_until_done, S3_objects_match_pages
from cacheruntime.protocol import (
    Backup,
    CacheExtentRef,
    CacheRuntimeError,
    Capability,
    ComputeFailed,
    CopyState,
    Demote,
    Drop,
    Fetch,
    HostMode,
    InvalidArgument,
    InvalidPlan,
    NoL2,
    NoL3,
    NotBackedUp,
    OutOfPages,
    Persist,
    PreparedBatchHandle,
    Restore,
    RowFull,
    Tier,
    TransferCompletion,
    TransferFailure,
    TransferKind,
    tag_digest,
)

RESIDENT, BUFFER_ONLY = HostMode.RESIDENT, HostMode.BUFFER_ONLY


def l3_model(mode=BUFFER_ONLY, **kw):
    kw.setdefault("l2_pages", 4)
    return new_model(l3=True, host_mode=mode, **kw)


def keys(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def page_view(m, name):
    return next(p for p in m.probe().pages if p.page == name)


def persisted(m, mode=BUFFER_ONLY, pages=2, prefix="k"):
    """An extent of `pages` pages persisted under `prefix`0.. and landed: (handle, ref, its versions)."""
    h, x = extent(m, pages)
    if mode is RESIDENT:
        m.submit((Backup(x),))
        m.wait_completions()
    (ticket,) = m.submit((Persist(x, keys(prefix, pages)),))
    assert ticket.kind is TransferKind.PERSIST and ticket.page_count == pages and ticket.extent_generation == x.generation
    assert [c.failure for c in m.wait_completions()] == [None]
    versions = [page_view(m, p).versions for p in m.state.extents[x.generation].pages]
    m.check_invariants()
    return h, x, versions


# -- construction and capabilities ----------------------------------------------------------


def test_a_model_without_l3_claims_neither_l3_nor_changes_its_host_tier():
    m = new_model()
    assert Capability.L3 not in m.info().capabilities and Capability.L2 in m.info().capabilities
    _, x = extent(m, 1)
    fails(m, NoL3, m.submit, (Persist(x, ("k",)),))
    fails(m, NoL3, m.l3_exists, ("k",))
    h = m.open_request()
    fails(m, NoL3, m.prepare_batch, plan(item(h), intents=(Fetch(h, ("k",)),)))


def test_the_host_modes_claim_l2_only_when_host_pages_are_a_tier():
    assert {Capability.L2, Capability.L3} <= l3_model(RESIDENT).info().capabilities
    caps = l3_model(BUFFER_ONLY).info().capabilities
    assert Capability.L3 in caps and Capability.L2 not in caps
    with pytest.raises(ValueError):
        new_model(host_mode=BUFFER_ONLY)  # staging between the device and what? needs l3
    with pytest.raises(ValueError):
        new_model(l3=True, l2_pages=0)  # no host page to stage through


@pytest.mark.parametrize("intent", [Backup, Restore, Demote, Drop])
def test_buffer_only_refuses_the_host_tier_intents(intent):
    m = l3_model(BUFFER_ONLY)
    _, x = extent(m, 1)
    error = fails(m, NoL2, m.submit, (intent(x),))
    assert "buffer_only" in error.what


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, (), ("",), (3,), ("k", b"k")])
def test_keys_are_a_non_empty_tuple_of_non_empty_strings(bad):
    m = l3_model()
    _, x = extent(m, 1)
    fails(m, InvalidArgument, m.submit, (Persist(x, bad),))
    fails(m, InvalidArgument, m.l3_exists, bad)
    h = m.open_request()
    fails(m, InvalidArgument, m.prepare_batch, plan(item(h), intents=(Fetch(h, bad),)))


# -- Persist --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [RESIDENT, BUFFER_ONLY])
def test_persist_writes_each_page_under_its_key_and_changes_no_copy(mode):
    m = l3_model(mode)
    _, x, versions = persisted(m, mode)
    assert m.l3_exists(("k0", "k1", "k2")) == (True, True, False)
    assert [o.tags for o in m.probe().objects] == [tuple(v) for v in versions]
    assert all(p.l1 is CopyState.VALID for p in m.probe().pages)
    assert free(m, Tier.L2) == (4 - 2 if mode is RESIDENT else 4)  # resident keeps its host copies; staging is freed


def test_persist_needs_one_key_per_page():
    m = l3_model()
    _, x = extent(m, 2)
    fails(m, InvalidPlan, m.submit, (Persist(x, ("k0",)),))


def test_a_resident_persist_reads_a_landed_host_copy():
    m = l3_model(RESIDENT)
    _, x = extent(m, 1)
    fails(m, NotBackedUp, m.submit, (Persist(x, ("k0",)),))
    m.submit((Backup(x),))
    fails(m, NotBackedUp, m.submit, (Persist(x, ("k0",)),))  # the backup is still filling: persist after it lands
    m.wait_completions()
    (ticket,) = m.submit((Persist(x, ("k0",)),))
    (view,) = m.probe().transfers
    host = next(p.mapped for p in m.probe().pools if p.tier is Tier.L2)
    assert view.sources == (host[0][0],) and view.destinations == ()  # reads the host copy, stages nothing


def test_a_buffer_only_persist_needs_a_staging_page_per_page():
    m = l3_model(BUFFER_ONLY, l2_pages=1)
    _, x = extent(m, 2)
    error = fails(m, OutOfPages, m.submit, (Persist(x, keys("k", 2)),))
    assert (error.tier, error.needed, error.free) == (Tier.L2, 2, 1)


def test_staging_is_held_until_the_store_write_completes():
    m = l3_model(BUFFER_ONLY, l2_pages=2)
    _, x = extent(m, 2)
    m.submit((Persist(x, keys("k", 2)),))
    assert free(m, Tier.L2) == 0 and not m.probe().objects  # staging taken, nothing written yet
    host = next(p for p in m.probe().pools if p.tier is Tier.L2)
    assert sorted(host.deferred) == [0, 1] and not host.mapped  # staging: neither free nor a copy (S2, S1)
    m.check_invariants()
    error = fails(m, OutOfPages, m.submit, (Persist(x, keys("k", 2)),))  # nothing to stage through until it lands
    assert error.free == 0
    m.complete_transfer(0)
    assert free(m, Tier.L2) == 2 and len(m.probe().objects) == 2
    m.check_invariants()


def test_a_persist_in_a_plan_applies_after_compute_and_its_ticket_is_in_the_completion():
    m = l3_model()
    h, x = extent(m, 1)
    done = compute(m, h, 1, intents=(Persist(x, ("k0",)),))
    assert [t.kind for t in done.tickets] == [TransferKind.PERSIST]
    m.wait_completions()
    assert m.l3_exists(("k0",)) == (True,)


def test_a_store_failure_under_a_persist_loses_nothing():
    m = l3_model(BUFFER_ONLY)
    _, x = extent(m, 2)
    before = m.probe().pages
    (ticket,) = m.submit((Persist(x, keys("k", 2)),))
    m.fail_transfer(ticket.transfer_id)
    (done,) = m.poll_completions()
    assert done.ticket == ticket and done.failure is TransferFailure.STORE
    assert m.probe().pages == before and not m.probe().objects  # the device copies intact, nothing written (F1)
    assert free(m, Tier.L2) == 4
    m.check_invariants()


def test_release_during_a_persist_defers_the_source_page():
    m = l3_model(BUFFER_ONLY)
    h, x = extent(m, 1)
    m.close_request(h)
    (ticket,) = m.submit((Persist(x, ("k0",)),))
    m.release(x)  # the page ends; its device page is read by the persist: deferred (O3)
    l1 = next(p for p in m.probe().pools if p.tier is Tier.L1)
    assert len(l1.deferred) == 1
    m.check_invariants()
    m.complete_transfer(ticket.transfer_id)
    assert m.l3_exists(("k0",)) == (True,) and not next(p for p in m.probe().pools if p.tier is Tier.L1).deferred


# -- Fetch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [RESIDENT, BUFFER_ONLY])
def test_a_fetch_fills_new_row_pages_that_compute_reads(mode):
    m = l3_model(mode)
    _, _, versions = persisted(m, mode)
    l2_before = free(m, Tier.L2)
    h = m.open_request()
    batch = m.prepare_batch(plan(item(h, 1), intents=(Fetch(h, keys("k", 2)),)))
    fetched = m.state.slots[h.slot_id].pages[:2]
    assert [page_view(m, p).l1 for p in fetched] == [CopyState.FILLING] * 2
    assert free(m, Tier.L2) == l2_before - 2  # a staging page per fetched page
    m.check_invariants()
    done = m.execute_batch(batch)  # compute waits for the fetch (KV_READY)
    assert done.items[0].num_tokens == 2 * PS + 1
    assert [list(page_view(m, p).versions) for p in fetched] == [list(v) for v in versions]
    assert all(page_view(m, p).l2 is CopyState.ABSENT for p in fetched) and free(m, Tier.L2) == l2_before
    (completion,) = m.poll_completions()
    assert completion.ticket.kind is TransferKind.FETCH and completion.ticket.page_count == 2 and completion.failure is None
    m.check_invariants()


def test_fetched_tokens_read_as_the_persisted_ones():
    """Compute over a fetched row reads the persisted pages' tags, then its own token's."""
    m = l3_model(BUFFER_ONLY)
    _, _, versions = persisted(m, BUFFER_ONLY)
    h = m.open_request()
    tag = m.state.next_version
    done = m.execute_batch(m.prepare_batch(plan(item(h, 1), intents=(Fetch(h, keys("k", 2)),))))
    assert done.items[0].next_token == tag_digest((*versions[0], *versions[1], tag))


def test_fetch_preconditions_are_typed_and_change_nothing():
    m = l3_model(BUFFER_ONLY, l2_pages=2, max_request_tokens=2 * PS)
    persisted(m, BUFFER_ONLY)
    h, other = m.open_request(), m.open_request()
    fails(m, InvalidPlan, m.submit, (Fetch(h, ("k0",)),))  # a fetch rides in a plan
    fails(m, InvalidPlan, m.prepare_batch, plan(item(h), intents=(Fetch(other, ("k0",)),)))  # no item for it
    fails(m, InvalidPlan, m.prepare_batch, plan(item(h), intents=(Fetch(h, ("k0",)), Fetch(h, ("k1",)))))
    fails(m, RowFull, m.prepare_batch, plan(item(h), intents=(Fetch(h, keys("k", 2)),)))
    compute(m, h, 1)
    fails(m, InvalidPlan, m.prepare_batch, plan(item(h), intents=(Fetch(h, ("k0",)),)))  # only on an empty row


def test_a_fetch_needs_a_free_staging_page_per_key():
    m = l3_model(BUFFER_ONLY, l2_pages=1)
    persisted(m, BUFFER_ONLY, pages=1)
    h = m.open_request()
    error = fails(m, OutOfPages, m.prepare_batch, plan(item(h), intents=(Fetch(h, ("k0", "k0")),)))
    assert (error.tier, error.needed, error.free) == (Tier.L2, 2, 1)


def test_an_object_removed_before_the_fetch_is_a_miss_and_the_batch_fails_for_recompute():
    m = l3_model(BUFFER_ONLY)
    persisted(m, BUFFER_ONLY)
    h = m.open_request()
    assert m.l3_exists(keys("k", 2)) == (True, True)  # a hint only:
    batch = m.prepare_batch(plan(item(h, 1), intents=(Fetch(h, keys("k", 2)),)))
    m.remove_object("k1")  # the store drops it before the fetch reads it
    m.check_invariants()
    with pytest.raises(ComputeFailed) as failed:
        m.execute_batch(batch)
    assert failed.value.batches == (batch.batch_id,)
    (miss,) = m.poll_completions()
    assert miss.failure is TransferFailure.MISS
    slot = m.state.slots[h.slot_id]
    assert slot.pages == [] and slot.num_tokens == 0 and free(m, Tier.L2) == 4
    m.check_invariants()
    done = compute(m, h, 2 * PS + 1)  # control falls back to recompute the prefix
    assert done.items[0].num_tokens == 2 * PS + 1


def test_a_store_failure_under_a_fetch_fails_its_batch_and_frees_every_page():
    m = l3_model(RESIDENT)
    persisted(m, RESIDENT)
    l1, l2 = free(m, Tier.L1), free(m, Tier.L2)
    h = m.open_request()
    batch = m.prepare_batch(plan(item(h, 1), intents=(Fetch(h, keys("k", 2)),)))
    fetch = next(t for t in m.probe().transfers if t.kind is TransferKind.FETCH)
    m.fail_transfer(fetch.transfer_id)
    fetched = m.state.slots[h.slot_id].pages[:2]
    assert all(page_view(m, p).l1 is CopyState.ABSENT for p in fetched)  # no copy: nothing was ever written to them
    m.check_invariants()
    with pytest.raises(ComputeFailed):
        m.execute_batch(batch)
    assert [c.failure for c in m.poll_completions()] == [TransferFailure.STORE]
    assert (free(m, Tier.L1), free(m, Tier.L2)) == (l1, l2)


def test_cancel_during_a_fetch_frees_its_pages_when_it_completes():
    m = l3_model(BUFFER_ONLY)
    persisted(m, BUFFER_ONLY)
    l1 = free(m, Tier.L1)
    h = m.open_request()
    m.cancel_batch(m.prepare_batch(plan(item(h, 1), intents=(Fetch(h, keys("k", 2)),))))
    assert free(m, Tier.L1) == l1 - 2  # deferred behind the fetch that writes them (O3)
    m.check_invariants()
    m.wait_completions()
    assert free(m, Tier.L1) == l1 and free(m, Tier.L2) == 4


def test_the_store_outlives_a_restart():
    m = l3_model(BUFFER_ONLY)
    persisted(m, BUFFER_ONLY)
    m.restart()
    assert m.l3_exists(keys("k", 2)) == (True, True)
    h = m.open_request()
    done = m.execute_batch(m.prepare_batch(plan(item(h, 1), intents=(Fetch(h, keys("k", 2)),))))
    assert done.items[0].num_tokens == 2 * PS + 1


# -- the predicates catch what they claim ------------------------------------------------------


def test_the_l3_predicates_catch_their_violations():
    m = l3_model(BUFFER_ONLY)
    _, x = extent(m, 1)
    m.submit((Persist(x, ("k0",)),))
    state = m.probe()
    (staging,) = next(p for p in state.pools if p.tier is Tier.L2).deferred
    # staging handed back before the store write: on the free list while the persist is in flight
    m.state.pools[Tier.L2].deferred.clear()
    m.state.pools[Tier.L2].free.append(staging)
    assert S2_staging_held_until_done(m.probe()) and S1_host_pages_only_stage(m.probe()) == []
    m.state.pools[Tier.L2].free.remove(staging)
    m.state.pools[Tier.L2].deferred[staging] = {0}
    m.wait_completions()
    # an object that does not hold its page's bytes
    m.state.objects["k0"] = (9, 9, 9, 9)
    assert S3_objects_match_pages(m.probe())
    # a host copy in buffer_only mode
    from cacheruntime.model.records import Copy

    name = m.state.extents[x.generation].pages[0]
    m.state.pages[name].copies[Tier.L2] = Copy(m.state.pools[Tier.L2].free.pop(0), CopyState.VALID)
    assert S1_host_pages_only_stage(m.probe())


# -- random walks ------------------------------------------------------------------------------


def content_key(m, name) -> str:
    """Control's key for a page: a digest of its content (here its versions), as a prefix hash is."""
    return f"page-{tag_digest(tuple(m.state.pages[name].versions))}"


def attempt(m, fn, *args):
    """Call `fn`; a typed error is an allowed outcome that must change nothing (None is returned).
    `ComputeFailed` is the one error that changes state (the batch fails, §4.5)."""
    before = m.probe()
    try:
        return fn(*args)
    except ComputeFailed:
        return None
    except CacheRuntimeError:
        assert not H1_failed_call_changes_nothing(before, m.probe())
        return None


def random_step(m, rng: random.Random, mode: HostMode, known: list[str], persisting: dict[int, tuple[str, ...]]) -> tuple[TransferCompletion, ...]:
    """One random call (or a few, for one of control's moves) or environment step; the
    completions it reported. `known` is control's index of the keys it persisted (reported
    landed; the store may have dropped any since), `persisting` its persists in flight."""
    st = m.state
    extents = [CacheExtentRef(m.runtime_id, st.epoch, g, e.runs) for g, e in st.extents.items()]
    prepared = [PreparedBatchHandle(m.runtime_id, st.epoch, b) for b in st.batches]
    choice = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 5, 5, 6, 7, 8, 8, 9))
    if choice == 0:
        h = attempt(m, m.open_request)
        if h is not None:
            batch = attempt(m, m.prepare_batch, plan(item(h, rng.randint(1, 2) * PS)))
            done = batch and attempt(m, m.execute_batch, batch)
            if done:
                attempt(m, m.publish, h, 0, m.state.slots[h.slot_id].num_tokens // PS)
            m.close_request(h)
    elif choice == 1 and extents:
        x = rng.choice(extents)
        pages = m.state.extents[x.generation].pages
        keys = tuple(content_key(m, p) for p in pages)
        backed = all(Tier.L2 in m.state.pages[p].copies for p in pages)
        if mode is RESIDENT and not backed and rng.random() < 0.8:
            attempt(m, m.submit, (Backup(x),))  # resident: persist reads host copies, so back up first
        else:
            for ticket in attempt(m, m.submit, (Persist(x, keys),)) or ():
                persisting[ticket.transfer_id] = keys
    elif choice == 2 and known:
        h = attempt(m, m.open_request)
        if h is not None:
            fetch = Fetch(h, tuple(rng.choice(known) for _ in range(rng.randint(1, 2))))
            if attempt(m, m.prepare_batch, plan(item(h, 1), intents=(fetch,))) is None:
                m.close_request(h)
    elif choice == 3 and prepared:
        batch = rng.choice(prepared)
        (request,) = m.state.batches[batch.batch_id].requests
        attempt(m, m.execute_batch if rng.random() < 0.7 else m.cancel_batch, batch)
        m.close_request(request)
    elif choice == 4 and extents:
        attempt(m, m.release, rng.choice(extents))
    elif choice in (5, 6) and m.completable():
        transfer = rng.choice(m.completable())
        m.fail_transfer(transfer) if choice == 6 else m.complete_transfer(transfer)
    elif choice == 7 and m.state.objects:
        m.remove_object(rng.choice(sorted(m.state.objects)))
    elif choice == 8 and rng.random() < 0.8:
        reported = m.poll_completions()
        for c in reported:
            keys = persisting.pop(c.ticket.transfer_id, ())
            if c.failure is None:
                known.extend(keys)
        m.check_invariants()
        return reported
    elif choice == 8:
        m.restart()
        persisting.clear()  # transfer ids start over; the store keeps what landed
    elif choice == 9 and mode is RESIDENT and extents:
        attempt(m, m.submit, (rng.choice((Backup, Demote, Restore))(rng.choice(extents)),))
    m.check_invariants()
    return ()


@pytest.mark.parametrize("mode", [RESIDENT, BUFFER_ONLY])
def test_random_walks_keep_every_invariant(mode):
    """Seeded walks of L3 calls and store events: every invariant, S1-S3 included, after each step;
    the walks reach every outcome of both L3 transfers."""
    outcomes: Counter = Counter()
    for seed in range(40):
        rng = random.Random(seed)
        m = l3_model(mode, l1_pages=12, l2_pages=4, max_requests=4)
        known: list[str] = []
        persisting: dict[int, tuple[str, ...]] = {}
        for _ in range(80):
            outcomes.update((c.ticket.kind, c.failure) for c in random_step(m, rng, mode, known, persisting))
    for kind, failure in (
        (TransferKind.PERSIST, None),
        (TransferKind.PERSIST, TransferFailure.STORE),
        (TransferKind.FETCH, None),
        (TransferKind.FETCH, TransferFailure.MISS),
        (TransferKind.FETCH, TransferFailure.STORE),
    ):
        assert outcomes[kind, failure] >= 3, (kind, failure, outcomes)
