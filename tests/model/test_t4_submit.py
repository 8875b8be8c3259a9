"""T4 on the reference model: a submit it accepts did what its intents say (spec/invariants.md).

The model judges itself after every submit it accepts (`ReferenceModel.judge_submit`); these
tests hold the predicate to the states a submit leaves and to altered ones where it must fail."""

from __future__ import annotations

import attrs
import pytest
from tests.model.modelkit import extent, new_model

from cacheruntime.invariants import InvariantViolation, T4_submit_applies
from cacheruntime.protocol import Backup, CopyState, Demote, Drop, Restore


def _with_copy(state, page: int, **copy):
    """The state with one page's copy states replaced (`l1=...` or `l2=...`)."""
    pages = tuple(attrs.evolve(p, **copy) if p.page == page else p for p in state.pages)
    return attrs.evolve(state, pages=pages)


def test_each_accepted_submit_leaves_what_its_last_intent_asks_for():
    m = new_model(l2_pages=8)
    h, x = extent(m)
    m.close_request(h)  # a Demote needs the extent out of every live row
    for intents in ((Backup(x),), (Demote(x),), (Restore(x),), (Backup(x), Drop(x))):
        tickets = m.submit(intents)  # judged by the model itself too
        assert T4_submit_applies(m.probe(), intents, tickets) == []
        m.wait_completions()


def test_a_backup_that_leaves_a_host_copy_absent_or_no_ticket_breaks_t4():
    m = new_model(l2_pages=8)
    _, x = extent(m)
    intents = (Backup(x),)
    tickets = m.submit(intents)
    after = m.probe()
    page = m.state.extents[x.generation].pages[0]
    assert T4_submit_applies(_with_copy(after, page, l2=CopyState.ABSENT), intents, tickets)
    assert T4_submit_applies(after, intents, ()) == ["0 tickets for 1 Backup, Restore and Persist intents"]


@pytest.mark.parametrize("kind, tier, bad", [(Demote, "l1", CopyState.VALID), (Drop, "l2", CopyState.FILLING)])
def test_a_drop_or_demote_that_keeps_the_copy_breaks_t4(kind, tier, bad):
    m = new_model(l2_pages=8)
    h, x = extent(m)
    m.close_request(h)
    m.submit((Backup(x),))
    m.wait_completions()
    intents = (kind(x),)
    after_ok = m.probe()
    tickets = m.submit(intents)
    after = m.probe()
    assert T4_submit_applies(after, intents, tickets) == []
    page = m.state.extents[x.generation].pages[0]
    assert T4_submit_applies(_with_copy(after, page, **{tier: bad}), intents, tickets)
    assert after_ok != after


def test_the_model_judges_its_own_submit():
    """The model's own check raises T4 when what it hands back does not match its state: here a
    Backup judged with no ticket, as a model that forgot to start the transfer would be."""
    m = new_model(l2_pages=8)
    _, x = extent(m)
    with pytest.raises(InvariantViolation) as info:
        m.judge_submit((Backup(x),), ())
    assert info.value.invariant == "T4"
