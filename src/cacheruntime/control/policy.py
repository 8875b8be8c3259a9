"""Eviction and lock policy of the prefix tree, written once for values and for Z3 terms.

TreeCore (`cacheruntime.control.tree`) decides locks and evictions by calling these
functions with `cacheruntime.ops.CONCRETE`; `cacheruntime.z3check` calls the very same
functions with Z3 terms and proves E1-E4 for every tree up to a bound. Keeping the policy
in this one module, over the `ops` namespace, is what makes the proofs be about the code
that runs.

API (every function takes the ops namespace first):

- `TreeView(parent, lock_ref, page_count, in_l1, last_access)`: the tree in array form,
  index = node. Node 0 is the root; `parent[i] < i` for `i > 0` (`parent[0]` is never
  read). `lock_ref[i] >= 0` counts the locks on `i` and below it (a lock on a node adds
  one on it and on every ancestor); `page_count[i] >= 0` are the node's KV pages;
  `in_l1[i]` says whether they are on the device; `last_access[i]` orders LRU. The root
  holds no pages and is never evicted. `well_formed(ops, t)` states these preconditions,
  with the tree's own invariant that L1 residency is prefix-closed.
- `shaped(ops, t)`: the same without prefix closure, which a failed transfer can break
  (spec/protocol.md §5.3): a failed restore leaves host-only a node whose descendants were
  restored with it; a failed write-back backup puts a node back on L1 under a parent
  demoted since. TreeCore keeps its nodes' residency as the runtime's copies are, and
  evicts on `resident_closure` of it.
- `resident_closure(ops, t) -> TreeView`: the view eviction runs on. A node counts as
  resident when it or a node below it is, and holds its pages in the view only when it is
  itself resident: the view is well formed whenever `t` is shaped, and a victim that is not
  resident frees nothing (it is passed over) and is taken only after every resident node
  below it. Z3 proves this (`e2_closure_evicts_only_resident`).
- `locked_paths(ops, t) -> tuple[bool]`: per node, `on_path_to_locked` for all at once, O(N).
- `on_path_to_locked(ops, t, i) -> bool`: `i` is an ancestor-or-self of a node with
  `lock_ref > 0`. Computed from the lock_refs below `i`, not from `lock_ref[i]` alone, so
  that E1 holds even for lock_refs that are not path-consistent.
- `evictable(ops, t, i) -> bool`: in L1, not the root, not on a path to a lock, and no
  child in L1 (a leaf of the L1 subtree).
- `lock(ops, t, i) -> tuple`: the new lock_ref, +1 on `i` and on every ancestor. O(depth)
  plus a copy.
- `unlock(ops, t, i) -> (ok, tuple)`: -1 on the same path; `ok` is False, and lock_ref is
  returned unchanged, if any lock_ref on the path is 0 (E4: rejected, never an underflow).
- `eviction_order(ops, t, pages_needed) -> tuple[int]`: 0 for a kept node, `k >= 1` for
  the node evicted in round `k`. Each round evicts the evictable node (given the rounds
  before) of least `last_access`, lowest index on ties, until the freed pages reach
  `pages_needed` or nothing is evictable: leaf-first LRU, as SGLang's radix cache does.
  O(N) per round, O(N * rounds) in all.
- `select_victims(ops, t, pages_needed) -> tuple[bool]`: the nodes `eviction_order` evicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs


@attrs.frozen
class TreeView:
    """The prefix tree as parallel tuples indexed by node; see the module docstring."""

    parent: tuple[Any, ...]
    lock_ref: tuple[Any, ...]
    page_count: tuple[Any, ...]
    in_l1: tuple[Any, ...]
    last_access: tuple[Any, ...]

    def __attrs_post_init__(self) -> None:
        sizes = {len(self.parent), len(self.lock_ref), len(self.page_count), len(self.in_l1), len(self.last_access)}
        if len(sizes) != 1 or not self.parent:
            raise ValueError(f"a TreeView needs equally long, non-empty fields, got lengths {sorted(sizes)}")

    @property
    def size(self) -> int:
        """Number of nodes, the root included."""
        return len(self.parent)


def shaped(ops: Any, t: TreeView) -> Any:
    """A tree (parents before children) with no negative counts; residency unconstrained."""
    clauses = [ops.And(0 <= t.parent[i], t.parent[i] < i) for i in range(1, t.size)]
    clauses.extend(ref >= 0 for ref in t.lock_ref)
    clauses.extend(pages >= 0 for pages in t.page_count)
    return ops.And(*clauses)


def well_formed(ops: Any, t: TreeView) -> Any:
    """The preconditions the policy assumes: shaped, and L1 prefix-closed."""
    closed = [ops.Or(ops.Not(t.in_l1[i]), t.parent[i] == 0, ops.Get(t.in_l1, t.parent[i])) for i in range(1, t.size)]
    return ops.And(shaped(ops, t), *closed)


def resident_closure(ops: Any, t: TreeView) -> TreeView:
    """The view with every ancestor of a resident node counted resident, holding no pages unless
    it is resident itself (see the module docstring: what eviction runs on after failures)."""
    resident_below = list(t.in_l1)
    for child in range(t.size - 1, 0, -1):  # children before parents: parent[i] < i
        below = resident_below[child]
        ops.Scatter(resident_below, t.parent[child], lambda _, r, below=below: ops.Or(r, below))
    pages = tuple(ops.If(resident, count, 0) for resident, count in zip(t.in_l1, t.page_count, strict=True))
    return TreeView(t.parent, t.lock_ref, pages, tuple(resident_below), t.last_access)


def locked_paths(ops: Any, t: TreeView) -> tuple[Any, ...]:
    """Per node, whether it is on the path from the root to a node with lock_ref > 0."""
    blocked = [ref > 0 for ref in t.lock_ref]
    for child in range(t.size - 1, 0, -1):  # children before parents: parent[i] < i
        below = blocked[child]
        ops.Scatter(blocked, t.parent[child], lambda _, b, below=below: ops.Or(b, below))
    return tuple(blocked)


def on_path_to_locked(ops: Any, t: TreeView, i: Any) -> Any:
    """Whether node `i` is an ancestor-or-self of a node with lock_ref > 0."""
    return ops.Get(locked_paths(ops, t), i)


def _l1_children(ops: Any, t: TreeView, in_l1: tuple[Any, ...]) -> list[Any]:
    """Per node, how many of its children are in L1."""
    counts = [ops.IntVal(0)] * t.size
    for child in range(1, t.size):
        resident = ops.If(in_l1[child], 1, 0)
        ops.Scatter(counts, t.parent[child], lambda _, c, resident=resident: c + resident)
    return counts


def _candidate(ops: Any, node: int, in_l1: Any, blocked: Any, l1_children: Any) -> Any:
    """Whether `node` may be evicted now: in L1, not the root, unlocked below, an L1 leaf."""
    return ops.And(node != 0, in_l1, ops.Not(blocked), l1_children == 0)


def evictable(ops: Any, t: TreeView, i: Any) -> Any:
    """Whether node `i` may be evicted now (E1, E2)."""
    blocked = locked_paths(ops, t)
    children = _l1_children(ops, t, t.in_l1)
    mask = [_candidate(ops, v, t.in_l1[v], blocked[v], children[v]) for v in range(t.size)]
    return ops.Get(mask, i)


def _path(ops: Any, t: TreeView, i: Any) -> Iterator[tuple[Any, Any]]:
    """The nodes from `i` up to the root, each with whether the walk is still on the path.

    Yields `t.size` pairs at most (the depth bound, since parent[i] < i); stops early once
    the walk has certainly passed the root.
    """
    node, on = i, ops.BoolVal(True)
    for _ in range(t.size):
        yield node, on
        on = ops.And(on, node != 0)
        if ops.IsFalse(on):
            return
        node = ops.Get(t.parent, node)


def lock(ops: Any, t: TreeView, i: Any) -> tuple[Any, ...]:
    """The lock_ref after locking node `i`: +1 on `i` and on every ancestor up to the root."""
    lock_ref = list(t.lock_ref)
    for node, on in _path(ops, t, i):
        step = ops.If(on, 1, 0)
        ops.Scatter(lock_ref, node, lambda _, ref, step=step: ref + step)
    return tuple(lock_ref)


def unlock(ops: Any, t: TreeView, i: Any) -> tuple[Any, tuple[Any, ...]]:
    """(ok, lock_ref after unlocking `i`); not ok, and lock_ref unchanged, if a ref on the path is 0."""
    lock_ref = list(t.lock_ref)
    ok = ops.BoolVal(True)
    for node, on in _path(ops, t, i):
        ok = ops.And(ok, ops.Or(ops.Not(on), ops.Get(t.lock_ref, node) > 0))
        step = ops.If(on, 1, 0)
        ops.Scatter(lock_ref, node, lambda _, ref, step=step: ref - step)
    return ok, tuple(ops.If(ok, new, old) for new, old in zip(lock_ref, t.lock_ref, strict=True))


def eviction_order(ops: Any, t: TreeView, pages_needed: Any) -> tuple[Any, ...]:
    """Per node, 0 if kept, else the round (from 1) in which leaf-first LRU eviction takes it."""
    blocked = locked_paths(ops, t)
    in_l1 = list(t.in_l1)
    children = _l1_children(ops, t, t.in_l1)
    candidate = [_candidate(ops, v, in_l1[v], blocked[v], children[v]) for v in range(t.size)]
    order = [ops.IntVal(0)] * t.size
    freed = ops.IntVal(0)
    for round_ in range(1, t.size):  # at most every node but the root
        found, victim = ops.ArgMin(candidate, t.last_access)
        pick = ops.And(found, freed < pages_needed)
        if ops.IsFalse(pick):  # no later round can pick either
            break
        freed = freed + ops.If(pick, ops.Get(t.page_count, victim), 0)
        ops.Scatter(order, victim, lambda _, o, pick=pick, round_=round_: ops.If(pick, round_, o))
        ops.Scatter(in_l1, victim, lambda _, r, pick=pick: ops.And(r, ops.Not(pick)))
        ops.Scatter(candidate, victim, lambda _, c, pick=pick: ops.And(c, ops.Not(pick)))
        parent = ops.Get(t.parent, victim)
        gone = ops.If(pick, 1, 0)
        ops.Scatter(children, parent, lambda _, c, gone=gone: c - gone)
        ops.Scatter(candidate, parent, lambda p, _: _candidate(ops, p, in_l1[p], blocked[p], children[p]))
    return tuple(order)


def select_victims(ops: Any, t: TreeView, pages_needed: Any) -> tuple[Any, ...]:
    """Per node, whether leaf-first LRU eviction of `pages_needed` pages takes it (E1-E3)."""
    return tuple(o > 0 for o in eviction_order(ops, t, pages_needed))
