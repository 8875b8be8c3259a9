"""The catalogue of Z3 checks: each invariant as obligations over every input up to a bound.

A `Check` yields `Obligation`s: under `assumption`, `claim` must hold for every value of
the free variables (the solver looks for a counterexample to it). The claims are written
here, from the invariant's statement and an independent definition of the tree's ancestor
relation; the policy and page-run code under test is only ever *called* (through
`Subjects`, so that a mutant can stand in for it). A `witness` must be satisfiable: it
shows the proof is not vacuous (the assumption admits the interesting case), or, for
fixed-width generations, that the proved horizon is exact.

Trees are checked at every size 1..N, so "for every tree of up to N nodes" holds without
an argument about padding; page lists at every length 0..L and run lists at 0..R runs,
with symbolic (unbounded) page names and run lengths.

Invariant ids are the catalogue's (spec/invariants.md); "PR" marks the page-run lemmas
that extent refs rely on (a ref's runs name exactly its pages), and the split check is
filed under R4 because disjoint halves that together are the original pages are what
makes releasing both halves free each page exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import attrs
import z3

from cacheruntime.control import policy as reference_policy
from cacheruntime.z3check import render, symbolic
from cacheruntime.z3check.z3ops import Z3OPS


@attrs.frozen
class Subjects:
    """The code under proof: the real modules, or mutants of them."""

    policy: ModuleType
    pageruns: ModuleType


@attrs.frozen
class Bounds:
    """How far the proofs go: tree nodes, page-list length, runs per list, generation bits."""

    nodes: int = 8
    pages: int = 8
    runs: int = 4
    generation_bits: int = 32


@attrs.frozen
class Obligation:
    """One solver query; `explain` renders a model of `assumption and not claim`."""

    assumption: Any
    claim: Any
    explain: Callable[[z3.ModelRef], str]
    witness: Any = None  # satisfiable on its own, or the check fails as vacuous / not tight


@attrs.frozen
class Check:
    """A named property of one invariant id, proved by its obligations."""

    name: str
    invariant: str
    statement: str
    family: str  # "tree", "runs" or "generation": what a mutant of that family can break
    bound: Callable[[Bounds], str]
    obligations: Callable[[Subjects, Bounds], Iterator[Obligation]]


# --------------------------------------------------------------------------------------
# The tree, specified independently of the policy
# --------------------------------------------------------------------------------------


@attrs.frozen
class _TreeSpec:
    """A symbolic tree with the relations the invariants are stated in."""

    st: symbolic.SymbolicTree
    ancestor: tuple[tuple[Any, ...], ...]  # ancestor[a][d]: a is d or an ancestor of d
    locked_below: tuple[Any, ...]  # v is an ancestor-or-self of a node with lock_ref > 0

    @classmethod
    def of(cls, policy: ModuleType, size: int) -> _TreeSpec:
        st = symbolic.tree(policy, size)
        parent = st.view.parent
        ancestor = [[z3.BoolVal(a == d) for d in range(size)] for a in range(size)]
        for d in range(1, size):
            for a in range(d):
                ancestor[a][d] = z3.Or([z3.And(parent[d] == p, ancestor[a][p]) for p in range(a, d)])
        locked_below = tuple(z3.Or([z3.And(ancestor[v][d], st.view.lock_ref[d] > 0) for d in range(size)]) for v in range(size))
        return cls(st, tuple(map(tuple, ancestor)), locked_below)

    @property
    def size(self) -> int:
        return self.st.size

    def assumption(self) -> Any:
        """A well-formed tree (the policy's documented precondition) and a node inside it."""
        return z3.And(_bool(reference_policy.well_formed(Z3OPS, self.st.view)), 0 <= self.st.node, self.st.node < self.size)

    def shaped(self) -> Any:
        """A tree whose L1 residency failures may have left not prefix-closed (`policy.shaped`)."""
        return _bool(reference_policy.shaped(Z3OPS, self.st.view))

    def at_parent_resident(self, v: int) -> Any:
        """Whether node v's parent is in L1."""
        t = self.st.view
        return z3.Or([z3.And(t.parent[v] == p, t.in_l1[p]) for p in range(v)])

    def on_path(self, k: int) -> Any:
        """Whether node k is an ancestor-or-self of the symbolic `node`."""
        return z3.Or([z3.And(self.st.node == d, self.ancestor[k][d]) for d in range(self.size)])

    def at_node(self, per_node: list[Any]) -> Any:
        """The per-node term at the symbolic `node`."""
        return z3.Or([z3.And(self.st.node == d, per_node[d]) for d in range(self.size)])

    def explain(self, marks: dict[str, Any], node: bool = False) -> Callable[[z3.ModelRef], str]:
        """The counterexample under a model: the tree with `marks` per node. The marks are the terms of
        this obligation, taken when it is made, so an obligation kept past its loop still shows its own."""
        return lambda model: render.tree(model, self.st, marks, node=node)


def _bool(term: Any) -> Any:
    return z3.BoolVal(term) if isinstance(term, bool) else term


def _int(term: Any) -> Any:
    return z3.IntVal(term) if isinstance(term, int) else term


def _trees(subjects: Subjects, bounds: Bounds) -> Iterator[tuple[_TreeSpec, bool]]:
    """A spec tree per size 1..N, with whether it is the largest (where witnesses are asked)."""
    for size in range(1, bounds.nodes + 1):
        yield _TreeSpec.of(subjects.policy, size), size == bounds.nodes


def _tree_bound(bounds: Bounds) -> str:
    return f"trees <= {bounds.nodes} nodes"


# --------------------------------------------------------------------------------------
# E1: locks protect their whole path
# --------------------------------------------------------------------------------------


def _e1_never_evicted(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n = spec.st.view, spec.size
        chosen = subjects.policy.select_victims(Z3OPS, t, spec.st.pages_needed)
        claim = z3.And(
            z3.Not(_bool(chosen[0])),
            *(z3.Implies(_bool(chosen[v]), z3.Not(spec.locked_below[v])) for v in range(n)),
        )
        witness = z3.And(spec.assumption(), z3.Or([_bool(c) for c in chosen]), z3.Or([r > 0 for r in t.lock_ref]))
        yield Obligation(spec.assumption(), claim, spec.explain({"evicted": chosen}), witness if largest else None)


def _e1_on_path_exact(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, node = spec.st.view, spec.st.node
        computed = _bool(subjects.policy.on_path_to_locked(Z3OPS, t, node))
        claim = computed == spec.at_node(list(spec.locked_below))
        witness = z3.And(spec.assumption(), computed, spec.at_node([r == 0 for r in t.lock_ref]))
        yield Obligation(
            spec.assumption(),
            claim,
            spec.explain(
                {
                    "computed_on_path": [z3.And(node == k, computed) for k in range(spec.size)],
                    "locked_below": spec.locked_below,
                },
                node=True,
            ),
            witness if largest else None,
        )


# --------------------------------------------------------------------------------------
# E2: leaves only, prefix-closed
# --------------------------------------------------------------------------------------


def _e2_leaves_first(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n = spec.st.view, spec.size
        order = [_int(o) for o in subjects.policy.eviction_order(Z3OPS, t, spec.st.pages_needed)]
        clauses = [order[0] == 0]
        for v in range(1, n):
            below = [z3.Implies(z3.And(spec.ancestor[v][d], t.in_l1[d]), z3.And(order[d] > 0, order[d] < order[v])) for d in range(v + 1, n)]
            clauses.append(z3.Implies(order[v] > 0, z3.And(t.in_l1[v], *below)))
        witness = z3.And(
            spec.assumption(),
            z3.Or([z3.And(spec.ancestor[v][d], order[v] > 0, order[d] > 0) for v in range(1, n) for d in range(v + 1, n)]),
        )
        yield Obligation(spec.assumption(), z3.And(clauses), spec.explain({"evicted_round": order}), witness if largest else None)


def _e2_prefix_closed(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t = spec.st.view
        chosen = subjects.policy.select_victims(Z3OPS, t, spec.st.pages_needed)
        after = reference_policy.TreeView(
            t.parent,
            t.lock_ref,
            t.page_count,
            tuple(z3.And(r, z3.Not(_bool(c))) for r, c in zip(t.in_l1, chosen, strict=True)),
            t.last_access,
        )
        witness = z3.And(spec.assumption(), z3.Or([_bool(c) for c in chosen]))
        yield Obligation(
            spec.assumption(),
            _bool(reference_policy.well_formed(Z3OPS, after)),
            spec.explain({"evicted": chosen}),
            witness if largest else None,
        )


def _e2_evictable_exact(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n, node = spec.st.view, spec.size, spec.st.node
        computed = _bool(subjects.policy.evictable(Z3OPS, t, node))
        expected = [
            z3.And(
                v != 0,
                t.in_l1[v],
                z3.Not(spec.locked_below[v]),
                *(z3.Not(z3.And(t.parent[d] == v, t.in_l1[d])) for d in range(v + 1, n)),
            )
            for v in range(n)
        ]
        has_children = [z3.Or([t.parent[d] == v for d in range(v + 1, n)]) for v in range(n)]
        witness = z3.And(spec.assumption(), computed, spec.at_node(has_children))
        yield Obligation(
            spec.assumption(),
            computed == spec.at_node(expected),
            spec.explain({}, node=True),
            witness if largest else None,
        )


def _closure_order(subjects: Subjects, spec: _TreeSpec) -> list[Any]:
    """Eviction rounds as TreeCore runs them after failures: on the resident closure of the view."""
    closure = subjects.policy.resident_closure(Z3OPS, spec.st.view)
    return [_int(o) for o in subjects.policy.eviction_order(Z3OPS, closure, spec.st.pages_needed)]


def _e2_closure_evicts_only_resident(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """On any shaped tree (prefix closure not assumed): the closure is well formed; no victim is the
    root or on a path to a lock; a victim that is not resident has a resident node below it evicted
    earlier (it frees nothing: TreeCore passes over it); every resident node below a victim went first."""
    for spec, largest in _trees(subjects, bounds):
        t, n = spec.st.view, spec.size
        closure = subjects.policy.resident_closure(Z3OPS, t)
        order = _closure_order(subjects, spec)
        clauses = [_bool(reference_policy.well_formed(Z3OPS, closure)), order[0] == 0]
        for v in range(1, n):
            below = range(v + 1, n)
            first = [z3.Implies(z3.And(spec.ancestor[v][d], t.in_l1[d]), z3.And(order[d] > 0, order[d] < order[v])) for d in below]
            cause = z3.Or([z3.And(spec.ancestor[v][d], t.in_l1[d], order[d] > 0, order[d] < order[v]) for d in below])
            clauses.append(z3.Implies(order[v] > 0, z3.And(z3.Not(spec.locked_below[v]), z3.Or(t.in_l1[v], cause), *first)))
        not_closed = z3.Or([z3.And(t.in_l1[v], t.parent[v] != 0, z3.Not(spec.at_parent_resident(v))) for v in range(1, n)])
        witness = z3.And(spec.shaped(), not_closed, z3.Or([z3.And(order[v] > 0, z3.Not(t.in_l1[v])) for v in range(1, n)]))
        yield Obligation(spec.shaped(), z3.And(clauses), spec.explain({"evicted_round": order}), witness if largest else None)


def _e3_closure_frees_enough(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """On any shaped tree: if the resident pages off every locked path are enough, the resident
    victims free enough (the pages TreeCore's evictions actually free)."""
    for spec, largest in _trees(subjects, bounds):
        t, n, need = spec.st.view, spec.size, spec.st.pages_needed
        order = _closure_order(subjects, spec)
        evictable_pages = z3.Sum([z3.IntVal(0)] + [z3.If(z3.And(t.in_l1[v], z3.Not(spec.locked_below[v])), t.page_count[v], 0) for v in range(1, n)])
        freed = _freed(t, tuple(z3.And(o > 0, r) for o, r in zip(order, t.in_l1, strict=True)))
        not_closed = z3.Or([z3.And(t.in_l1[v], t.parent[v] != 0, z3.Not(spec.at_parent_resident(v))) for v in range(1, n)])
        witness = z3.And(spec.shaped(), not_closed, freed >= need, need > 0)
        yield Obligation(
            spec.shaped(),
            z3.Implies(evictable_pages >= need, freed >= need),
            spec.explain({"evicted_round": order}),
            witness if largest else None,
        )


# --------------------------------------------------------------------------------------
# E3: enough pages, and no more than the last leaf needs
# --------------------------------------------------------------------------------------


def _freed(t: Any, chosen: tuple[Any, ...]) -> Any:
    return z3.Sum([z3.If(_bool(c), pages, 0) for c, pages in zip(chosen, t.page_count, strict=True)])


def _e3_frees_enough(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n, need = spec.st.view, spec.size, spec.st.pages_needed
        chosen = subjects.policy.select_victims(Z3OPS, t, need)
        evictable_pages = z3.Sum([z3.IntVal(0)] + [z3.If(z3.And(t.in_l1[v], z3.Not(spec.locked_below[v])), t.page_count[v], 0) for v in range(1, n)])
        freed = _freed(t, chosen)
        witness = z3.And(spec.assumption(), freed >= need, z3.Sum([z3.If(_bool(c), 1, 0) for c in chosen]) >= 3)
        yield Obligation(
            spec.assumption(),
            z3.Implies(evictable_pages >= need, freed >= need),
            spec.explain({"evicted": chosen}),
            witness if largest else None,
        )


def _e3_stops_at_last_leaf(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n, need = spec.st.view, spec.size, spec.st.pages_needed
        order = [_int(o) for o in subjects.policy.eviction_order(Z3OPS, t, need)]
        count = z3.Sum([z3.IntVal(0)] + [z3.If(o > 0, 1, 0) for o in order])
        freed = _freed(t, tuple(o > 0 for o in order))
        clauses = [z3.And(o >= 0, o <= count) for o in order]
        clauses += [z3.Implies(z3.And(order[v] > 0, order[w] > 0), order[v] != order[w]) for v in range(n) for w in range(v + 1, n)]
        clauses += [z3.Implies(z3.And(count > 0, order[v] == count), freed - t.page_count[v] < need) for v in range(n)]
        witness = z3.And(spec.assumption(), count >= 3)
        yield Obligation(spec.assumption(), z3.And(clauses), spec.explain({"evicted_round": order}), witness if largest else None)


# --------------------------------------------------------------------------------------
# E4: lock/unlock
# --------------------------------------------------------------------------------------


def _e4_lock_adds_one(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n = spec.st.view, spec.size
        locked = [_int(r) for r in subjects.policy.lock(Z3OPS, t, spec.st.node)]
        claim = z3.And([locked[k] == t.lock_ref[k] + z3.If(spec.on_path(k), 1, 0) for k in range(n)])
        witness = z3.And(spec.assumption(), spec.st.node == n - 1, *(t.parent[i] == i - 1 for i in range(1, n)))
        yield Obligation(spec.assumption(), claim, spec.explain({"locked_to": locked}, node=True), witness if largest else None)


def _e4_roundtrip(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n = spec.st.view, spec.size
        locked = subjects.policy.lock(Z3OPS, t, spec.st.node)
        ok, back = subjects.policy.unlock(Z3OPS, attrs.evolve(t, lock_ref=locked), spec.st.node)
        back = [_int(r) for r in back]
        claim = z3.And(_bool(ok), *(back[k] == t.lock_ref[k] for k in range(n)))
        witness = z3.And(spec.assumption(), spec.st.node > 0, z3.And([r == 0 for r in t.lock_ref]))
        yield Obligation(spec.assumption(), claim, spec.explain({"back_to": back}, node=True), witness if largest else None)


def _e4_rejects_without_lock(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t, n = spec.st.view, spec.size
        ok, after = subjects.policy.unlock(Z3OPS, t, spec.st.node)
        ok, after = _bool(ok), [_int(r) for r in after]
        allowed = z3.And([z3.Implies(spec.on_path(k), t.lock_ref[k] >= 1) for k in range(n)])
        claim = z3.And(
            ok == allowed,
            *(after[k] == z3.If(allowed, t.lock_ref[k] - z3.If(spec.on_path(k), 1, 0), t.lock_ref[k]) for k in range(n)),
        )
        witness = z3.And(spec.assumption(), z3.Not(ok), spec.at_node([r > 0 for r in t.lock_ref]))
        yield Obligation(spec.assumption(), claim, spec.explain({"unlocked_to": after}, node=True), witness if largest else None)


def _e4_no_underflow(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    for spec, largest in _trees(subjects, bounds):
        t = spec.st.view
        ok, after = subjects.policy.unlock(Z3OPS, t, spec.st.node)
        after = [_int(r) for r in after]
        witness = z3.And(spec.assumption(), _bool(ok), spec.st.node > 0)
        yield Obligation(
            spec.assumption(),
            z3.And([r >= 0 for r in after]),
            spec.explain({"unlocked_to": after}, node=True),
            witness if largest else None,
        )


# --------------------------------------------------------------------------------------
# Page runs
# --------------------------------------------------------------------------------------


def _coalesce_exact(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """expand(coalesce(pages)) == pages for every input, and membership is exact."""
    for length in range(bounds.pages + 1):
        pages = symbolic.pages(length)
        slots = subjects.pageruns.coalesce_slots(Z3OPS, pages)
        page = z3.Int("page")
        clauses = []
        for s, slot in enumerate(slots):
            valid, count = _bool(slot.valid), _int(slot.page_count)
            clauses.append(z3.Implies(valid, z3.And(count >= 1, s + count <= length)))
            if s > 0:  # maximal: a run starts only where the page does not continue the one before
                clauses.append(z3.Implies(valid, pages[s] != pages[s - 1] + 1))
        for j in range(length):  # position j lies in exactly one run, at its offset from the run's start
            holders = [z3.And(_bool(slots[s].valid), j < s + _int(slots[s].page_count)) for s in range(j + 1)]
            clauses.append(z3.Sum([z3.If(h, 1, 0) for h in holders]) == 1)
            clauses += [z3.Implies(h, pages[j] == _int(slots[s].first_page) + (j - s)) for s, h in enumerate(holders)]
        member = _bool(subjects.pageruns.contains_slots(Z3OPS, slots, page))
        clauses.append(member == z3.Or([p == page for p in pages]))
        witness = None
        if length == bounds.pages:
            witness = z3.And(_bool(slots[-1].valid), z3.Not(_bool(slots[1].valid)) if length > 1 else True)
        yield Obligation(
            z3.BoolVal(True),
            z3.And(clauses),
            lambda m, pages=pages, slots=slots, page=page: f"{render.values(m, pages=pages, page=page)}\ncoalesce -> {render.slots(m, slots)}",
            witness,
        )


def _coalesce_sorted(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """For increasing pages: the runs are sorted, disjoint and never adjacent (maximal)."""
    for length in range(bounds.pages + 1):
        pages = symbolic.pages(length)
        slots = subjects.pageruns.coalesce_slots(Z3OPS, pages)
        increasing = z3.And([pages[j] < pages[j + 1] for j in range(length - 1)])
        clauses = [
            z3.Implies(
                z3.And(_bool(slots[s].valid), _bool(slots[u].valid)),
                _int(slots[s].first_page) + _int(slots[s].page_count) < _int(slots[u].first_page),
            )
            for s in range(length)
            for u in range(s + 1, length)
        ]
        witness = None
        if length == bounds.pages and length >= 3:
            witness = z3.And(increasing, _bool(slots[2].valid), _int(slots[0].page_count) >= 2)
        yield Obligation(
            increasing,
            z3.And(clauses),
            lambda m, pages=pages, slots=slots: f"{render.values(m, pages=pages)}\ncoalesce -> {render.slots(m, slots)}",
            witness,
        )


def _split_union(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """Splitting disjoint runs at 0..total: head has `at` pages, head + tail = the runs, in order."""
    for count in range(bounds.runs + 1):
        runs = symbolic.runs(count)
        at, page = z3.Int("at_page"), z3.Int("page")
        total = z3.Sum([z3.IntVal(0)] + [r.page_count for r in runs])
        assumption = z3.And(
            0 <= at,
            at <= total,
            *(r.page_count >= 1 for r in runs),
            *(
                z3.Or(a.first_page + a.page_count <= b.first_page, b.first_page + b.page_count <= a.first_page)
                for i, a in enumerate(runs)
                for b in runs[i + 1 :]
            ),
        )
        head, tail = subjects.pageruns.split_slots(Z3OPS, runs, at)

        def pages_in(slots: Any) -> Any:
            return z3.Sum([z3.IntVal(0)] + [z3.If(_bool(s.valid), _int(s.page_count), 0) for s in slots])

        def member(slots: Any, page: Any = page) -> Any:
            return _bool(subjects.pageruns.contains_slots(Z3OPS, slots, page))

        original = _bool(subjects.pageruns.contains_slots(Z3OPS, runs, page))
        clauses = [
            pages_in(head) == at,
            pages_in(tail) == total - at,
            original == z3.Or(member(head), member(tail)),
            z3.Not(z3.And(member(head), member(tail))),
        ]
        for r, run in enumerate(runs):  # each run is kept whole, or cut in place at one page boundary
            h_valid, h_first, h_count = _bool(head[r].valid), _int(head[r].first_page), _int(head[r].page_count)
            t_valid, t_first, t_count = _bool(tail[r].valid), _int(tail[r].first_page), _int(tail[r].page_count)
            clauses.append(z3.Implies(h_valid, z3.And(h_count >= 1, h_first == run.first_page)))
            clauses.append(z3.Implies(t_valid, z3.And(t_count >= 1, t_first + t_count == run.first_page + run.page_count)))
            clauses.append(z3.Implies(z3.And(h_valid, t_valid), h_first + h_count == t_first))
            clauses += [z3.Not(z3.And(h_valid, _bool(tail[s].valid))) for s in range(r)]  # head never after tail
        witness = None
        if count == bounds.runs and count >= 2:
            witness = z3.And(assumption, _bool(head[1].valid), _bool(tail[1].valid))
        yield Obligation(
            assumption,
            z3.And(clauses),
            lambda m, runs=runs, head=head, tail=tail, at=at, page=page: (
                f"runs = {render.slots(m, runs)}, {render.values(m, at_page=at, page=page)}\n"
                f"split -> head {render.slots(m, head)}, tail {render.slots(m, tail)}"
            ),
            witness,
        )


# --------------------------------------------------------------------------------------
# H2: fixed-width generations
# --------------------------------------------------------------------------------------


def _h2_stale_horizon(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """A handle of generation g is stale after k reuses; it matches again only when g + k wraps to g."""
    w = bounds.generation_bits
    issued = z3.BitVec("handle_generation", w)
    reuses = z3.BitVec("reuses", w + 1)
    live = issued + z3.Extract(w - 1, 0, reuses)
    horizon = z3.BitVecVal(2**w - 1, w + 1)
    yield Obligation(
        z3.And(z3.UGE(reuses, 1), z3.ULE(reuses, horizon)),
        live != issued,
        lambda m: render.values(m, handle_generation=issued, reuses=reuses, live_generation=live),
        witness=z3.And(reuses == horizon + 1, live == issued),  # one more reuse and it matches: exact
    )


def _h2_monotone(subjects: Subjects, bounds: Bounds) -> Iterator[Obligation]:
    """From generation 0, each of the first 2^w - 1 reuses increases the generation; the next wraps."""
    w = bounds.generation_bits
    generation = z3.BitVec("generation", w)  # the slot's generation after some reuses from 0
    yield Obligation(
        z3.ULT(generation, 2**w - 1),
        z3.UGT(generation + 1, generation),
        lambda m: render.values(m, generation=generation, next_generation=generation + 1),
        witness=z3.And(generation == 2**w - 1, z3.ULT(generation + 1, generation)),
    )


# --------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------


def _runs_bound(bounds: Bounds) -> str:
    return f"runs <= {bounds.runs}, any lengths"


def _pages_bound(bounds: Bounds) -> str:
    return f"page lists <= {bounds.pages}"


def _generation_bound(bounds: Bounds) -> str:
    return f"{bounds.generation_bits}-bit, exactly 2^{bounds.generation_bits}-1 reuses"


CHECKS: tuple[Check, ...] = (
    Check("e1_locked_path_never_evicted", "E1", "no node with lock_ref > 0, or above one, is selected; nor the root", "tree", _tree_bound, _e1_never_evicted),
    Check("e1_on_path_to_locked_exact", "E1", "on_path_to_locked(i) iff i is an ancestor-or-self of a locked node", "tree", _tree_bound, _e1_on_path_exact),
    Check("e2_leaves_first", "E2", "a victim is in L1 and every L1 node below it was evicted in an earlier round", "tree", _tree_bound, _e2_leaves_first),
    Check("e2_l1_stays_prefix_closed", "E2", "after eviction L1 residency is still prefix-closed", "tree", _tree_bound, _e2_prefix_closed),
    Check(
        "e2_closure_evicts_only_resident",
        "E2",
        "after failures (L1 not prefix-closed): eviction on the resident closure takes unlocked nodes, leaves first, resident ones only",
        "tree",
        _tree_bound,
        _e2_closure_evicts_only_resident,
    ),
    Check(
        "e3_closure_frees_enough",
        "E3",
        "after failures: if resident unlocked pages >= pages asked for, the resident victims free at least that many",
        "tree",
        _tree_bound,
        _e3_closure_frees_enough,
    ),
    Check("e2_evictable_is_unlocked_l1_leaf", "E2", "evictable(i) iff i is a non-root, unlocked-below L1 leaf", "tree", _tree_bound, _e2_evictable_exact),
    Check("e3_frees_enough", "E3", "if evictable pages >= pages asked for, the victims free at least that many", "tree", _tree_bound, _e3_frees_enough),
    Check("e3_stops_at_last_leaf", "E3", "rounds are 1..count; without the last victim the pages fall short", "tree", _tree_bound, _e3_stops_at_last_leaf),
    Check("e4_lock_adds_one_on_path", "E4", "lock(i) adds 1 exactly on i and its ancestors", "tree", _tree_bound, _e4_lock_adds_one),
    Check("e4_lock_unlock_roundtrip", "E4", "unlock(lock(i), i) succeeds and restores every lock_ref", "tree", _tree_bound, _e4_roundtrip),
    Check(
        "e4_unlock_rejected_without_lock",
        "E4",
        "unlock(i) succeeds iff every lock_ref on the path is >= 1, else changes nothing",
        "tree",
        _tree_bound,
        _e4_rejects_without_lock,
    ),
    Check("e4_no_underflow", "E4", "after unlock every lock_ref is >= 0", "tree", _tree_bound, _e4_no_underflow),
    Check(
        "h2_stale_handle_horizon",
        "H2",
        "a stale handle never matches the live generation within 2^w-1 reuses; at 2^w it does",
        "generation",
        _generation_bound,
        _h2_stale_horizon,
    ),
    Check(
        "h2_generation_monotone",
        "H2",
        "from 0, each of the first 2^w-1 reuses increases the generation; the next wraps",
        "generation",
        _generation_bound,
        _h2_monotone,
    ),
    Check("runs_coalesce_exact", "PR", "coalesce covers exactly the input pages, each once, in order, in maximal runs", "runs", _pages_bound, _coalesce_exact),
    Check("runs_coalesce_sorted_disjoint", "PR", "for increasing pages the runs are sorted, disjoint and non-adjacent", "runs", _pages_bound, _coalesce_sorted),
    Check("runs_split_union", "R4", "split at k: head has k pages, head + tail are the original pages, disjoint, in order", "runs", _runs_bound, _split_union),
)
