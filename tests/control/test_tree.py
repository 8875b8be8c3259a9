"""TreeCore on the reference model: matching, insert, split, locks, eviction into intents."""

import pytest

from cacheruntime.control.tree import TreeCore, WritePolicy
from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Close, Demote, Publish, Release, Restore

PS = 4


def publish_row(model, tokens):
    """Compute `tokens` in a fresh request, publish its full pages, close it; return the extent."""
    request = model.open_request()
    pages = len(tokens) // PS
    completion = model.execute_batch(model.prepare_batch(BatchPlan((BatchItem(request, tuple(tokens)),), (Publish(request, 0, pages), Close(request)))))
    return completion.published[0]


@pytest.fixture
def setup():
    model = ReferenceModel(page_size=PS, max_requests=4, max_request_tokens=64, l1_pages=32, l2_pages=32)
    tree = TreeCore(model, page_size=PS, l2_pages=32, write_policy=WritePolicy.WRITE_BACK)
    return model, tree


def apply(model, tree):
    """Send the tree's intents the way the scheduler's standalone path does, then settle them."""
    intents = tree.take_intents()
    for intent in intents:
        if isinstance(intent, Release):
            model.release(intent.extent)
        else:
            model.submit((intent,))
    tree.intents_applied(intents)
    tree.transfers_done(model.wait_completions())
    return intents


def test_match_insert_and_split(setup):
    model, tree = setup
    tokens = tuple(range(16))  # 4 pages
    assert tree.match_prefix(tokens + (99,)).pages == 0
    inserted = tree.insert(tokens, 0, publish_row(model, tokens))
    assert inserted.adopted_pages == 4
    match = tree.match_prefix(tokens + (99,))
    assert (match.pages, match.l1_pages, match.l2_pages) == (4, 4, 0)
    # a prompt that diverges inside the node's third page matches two pages and splits the node
    other = tokens[:9] + (77,) * 7
    match = tree.match_prefix(other)
    assert match.pages == 2 and match.node.pages == 2
    assert [n.pages for n in tree.nodes()[1:]] == [2, 2]
    assert {e.refcount for e in model.probe().extents} == {1} and len(model.probe().extents) == 2
    # a whole-prompt hit leaves one token to compute: an exactly page-aligned prompt backs off a page
    assert tree.match_prefix(tokens).pages == 3


def test_insert_of_a_duplicate_releases_it(setup):
    model, tree = setup
    tokens = tuple(range(8))
    tree.insert(tokens, 0, publish_row(model, tokens))
    inserted = tree.insert(tokens, 0, publish_row(model, tokens))
    assert inserted.adopted_pages == 0
    assert [type(i) for i in tree.outbox] == [Release]
    apply(model, tree)
    assert len(model.probe().extents) == 1
    model.check_invariants()


def test_locks_follow_the_path_and_unlock_without_lock_is_rejected(setup):
    model, tree = setup
    tokens = tuple(range(16))
    tree.insert(tokens, 0, publish_row(model, tokens))
    tree.match_prefix(tokens[:9] + (5,))  # split into 2 + 2 pages
    head, tail = tree.nodes()[1:]
    tree.lock(tail)
    assert (tree.root.lock_ref, head.lock_ref, tail.lock_ref) == (1, 1, 1)
    assert tree.evict(100) == 0  # E1: everything is on a locked path
    tree.unlock(tail)
    with pytest.raises(AssertionError, match="E4"):
        tree.unlock(tail)
    assert head.lock_ref == 0


def test_eviction_is_leaf_first_and_write_back_backs_up_then_demotes(setup):
    model, tree = setup
    tokens = tuple(range(16))
    tree.insert(tokens, 0, publish_row(model, tokens))
    tree.match_prefix(tokens[:9] + (5,))
    head, tail = tree.nodes()[1:]
    assert tree.evict(1) == 2  # only the leaf goes
    assert tree.outbox == [Backup(tail.extent), Demote(tail.extent)]
    apply(model, tree)
    assert (head.l1, tail.l1, tail.l2) == (True, False, True)
    match = tree.match_prefix(tokens + (1,))
    assert (match.l1_pages, match.l2_pages) == (2, 2)
    acquired = tree.acquire(match)
    assert acquired.restores == (Restore(tail.extent),)
    assert acquired.attach == (head.extent, tail.extent)
    model.check_invariants()


def test_lock_during_eviction_cancels_the_queued_demote(setup):
    """Scenario 9: the tree picked leaf L, the demote has not crossed; a request reaches L first."""
    model, tree = setup
    tokens = tuple(range(8))
    tree.insert(tokens, 0, publish_row(model, tokens))
    model.submit((Backup(tree.nodes()[1].extent),))
    tree.nodes()[1].l2 = True
    assert tree.evict(2) == 2 and isinstance(tree.outbox[-1], Demote)
    match = tree.match_prefix(tokens + (1,))  # the new request wins
    tree.acquire(match)
    assert tree.outbox == [] and match.l1_pages == 2 and match.node.l1
    assert tree.evict(2) == 0  # and it is locked now


def test_a_demote_in_flight_is_not_matched(setup):
    """Once the demote left in a plan, a restore could race it into ExtentInUse: the match stops."""
    model, tree = setup
    tokens = tuple(range(8))
    tree.insert(tokens, 0, publish_row(model, tokens))
    tree.evict(2)
    taken = tree.take_intents()
    assert [type(i) for i in taken] == [Backup, Demote]
    assert tree.match_prefix(tokens + (1,)).pages == 0
    for intent in taken:
        model.submit((intent,))
    tree.intents_applied(taken)
    assert tree.match_prefix(tokens + (1,)).l2_pages == 2


def test_without_l2_eviction_releases(setup):
    model = ReferenceModel(page_size=PS, max_requests=4, max_request_tokens=64, l1_pages=32, l2_pages=0)
    tree = TreeCore(model, page_size=PS, l2_pages=0, write_policy=WritePolicy.WRITE_THROUGH)
    tokens = tuple(range(8))
    tree.insert(tokens, 0, publish_row(model, tokens))
    assert tree.outbox == []  # no host tier: write-through has nothing to write to
    tree.evict(1)
    assert [type(i) for i in apply(model, tree)] == [Release]
    assert tree.nodes() == [tree.root] and model.probe().extents == ()
    model.check_invariants()
