"""The concrete policy on large trees agrees with a naive, independent leaf-first LRU.

The Z3 proofs stop at a bound; this differential test carries the concrete path to trees
of hundreds of nodes, against an implementation written for clarity, not speed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cacheruntime.control import policy
from cacheruntime.ops import CONCRETE


def _naive_order(t: policy.TreeView, need: int) -> tuple[int, ...]:
    size = t.size
    children = {v: [c for c in range(1, size) if t.parent[c] == v] for v in range(size)}

    def locked_below(v: int) -> bool:
        return t.lock_ref[v] > 0 or any(locked_below(c) for c in children[v])

    resident = list(t.in_l1)
    order = [0] * size
    freed, round_ = 0, 0
    while freed < need:
        leaves = [v for v in range(1, size) if resident[v] and not locked_below(v) and not any(resident[c] for c in children[v])]
        if not leaves:
            break
        victim = min(leaves, key=lambda v: (t.last_access[v], v))
        round_ += 1
        order[victim], resident[victim] = round_, False
        freed += t.page_count[victim]
    return tuple(order)


@st.composite
def big_trees(draw):
    size = draw(st.integers(1, 120))
    parent = (0,) + tuple(draw(st.integers(max(0, i - 8), i - 1)) for i in range(1, size))
    in_l1 = [True]
    for i in range(1, size):  # prefix-closed residency, as TreeCore keeps it
        in_l1.append(in_l1[parent[i]] and draw(st.booleans()) if parent[i] else draw(st.booleans()))
    return policy.TreeView(
        parent=parent,
        lock_ref=tuple(draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=size, max_size=size))),
        page_count=tuple(draw(st.lists(st.integers(0, 4), min_size=size, max_size=size))),
        in_l1=tuple(in_l1),
        last_access=tuple(draw(st.lists(st.integers(0, 50), min_size=size, max_size=size))),
    )


@settings(max_examples=200)
@given(tree=big_trees(), need=st.integers(0, 200))
def test_eviction_order_matches_naive_leaf_first_lru(tree, need):
    assert policy.eviction_order(CONCRETE, tree, need) == _naive_order(tree, need)


@settings(max_examples=200)
@given(tree=big_trees(), data=st.data())
def test_lock_unlock_on_large_trees(tree, data):
    node = data.draw(st.integers(0, tree.size - 1))
    path = [node]
    while path[-1] != 0:
        path.append(tree.parent[path[-1]])
    locked = policy.lock(CONCRETE, tree, node)
    assert locked == tuple(r + (v in path) for v, r in enumerate(tree.lock_ref))
    assert policy.unlock(CONCRETE, policy.TreeView(tree.parent, locked, tree.page_count, tree.in_l1, tree.last_access), node) == (
        True,
        tree.lock_ref,
    )
    ok, after = policy.unlock(CONCRETE, tree, node)
    assert ok == all(tree.lock_ref[v] > 0 for v in path)
    assert after == (tuple(r - (v in path) for v, r in enumerate(tree.lock_ref)) if ok else tree.lock_ref)
