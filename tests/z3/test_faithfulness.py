"""The Z3 terms mean what the concrete code computes.

The proofs are about `policy` and `pageruns` evaluated on Z3 terms; TreeCore and the model
run them on values. Hypothesis draws concrete inputs, the code runs on them, the same
values are substituted into the symbolic result, and both must agree. This also checks the
ops whose Z3 implementation differs from the concrete one (`Get`/`Scatter` with a symbolic
index, `ArgMin`, `IsFalse`).
"""

from __future__ import annotations

import functools

import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheruntime import pageruns
from cacheruntime.control import policy
from cacheruntime.ops import CONCRETE
from cacheruntime.protocol import PageRun
from cacheruntime.z3check import symbolic
from cacheruntime.z3check.z3ops import Z3OPS

MAX_NODES = 8
EXAMPLES = max(300, settings().max_examples)


@functools.cache
def _symbolic_tree(size: int):
    tree = symbolic.tree(policy, size)
    view, node, need = tree.view, tree.node, tree.pages_needed
    terms = {
        "well_formed": policy.well_formed(Z3OPS, view),
        "locked_paths": policy.locked_paths(Z3OPS, view),
        "on_path_to_locked": policy.on_path_to_locked(Z3OPS, view, node),
        "evictable": policy.evictable(Z3OPS, view, node),
        "lock": policy.lock(Z3OPS, view, node),
        "unlock": policy.unlock(Z3OPS, view, node),
        "eviction_order": policy.eviction_order(Z3OPS, view, need),
        "select_victims": policy.select_victims(Z3OPS, view, need),
        "shaped": policy.shaped(Z3OPS, view),
        "resident_closure": _fields(policy.resident_closure(Z3OPS, view)),
        "closure_eviction_order": policy.eviction_order(Z3OPS, policy.resident_closure(Z3OPS, view), need),
    }
    return tree, terms


def _fields(view):
    return (view.parent, view.lock_ref, view.page_count, view.in_l1, view.last_access)


def _substitute(terms, pairs):
    """Evaluate a nest of tuples of terms with the variables replaced by values."""
    if isinstance(terms, tuple):
        return tuple(_substitute(t, pairs) for t in terms)
    if isinstance(terms, (bool, int)):
        return terms
    result = z3.simplify(z3.substitute(terms, *pairs))
    assert z3.is_true(result) or z3.is_false(result) or z3.is_int_value(result), result
    return z3.is_true(result) if z3.is_bool(result) else result.as_long()


def _pairs(variables, values):
    return [(var, z3.BoolVal(val) if isinstance(val, bool) else z3.IntVal(val)) for var, val in zip(variables, values, strict=True)]


@st.composite
def trees(draw):
    size = draw(st.integers(1, MAX_NODES))
    return policy.TreeView(
        parent=(0,) + tuple(draw(st.integers(0, i - 1)) for i in range(1, size)),
        lock_ref=tuple(draw(st.lists(st.integers(0, 3), min_size=size, max_size=size))),
        page_count=tuple(draw(st.lists(st.integers(0, 4), min_size=size, max_size=size))),
        in_l1=tuple(draw(st.lists(st.booleans(), min_size=size, max_size=size))),
        last_access=tuple(draw(st.lists(st.integers(0, 5), min_size=size, max_size=size))),  # ties on purpose
    )


@settings(max_examples=EXAMPLES)
@given(tree=trees(), data=st.data())
def test_policy_terms_evaluate_to_the_concrete_results(tree, data):
    node = data.draw(st.integers(0, tree.size - 1))
    need = data.draw(st.integers(-1, 16))
    sym, terms = _symbolic_tree(tree.size)
    pairs = []
    for field, variables in sym.variables().items():
        concrete = getattr(tree, field)
        pairs += _pairs(variables, concrete[1:] if field == "parent" else concrete)
    pairs += _pairs((sym.node, sym.pages_needed), (node, need))
    concrete = {
        "well_formed": policy.well_formed(CONCRETE, tree),
        "locked_paths": policy.locked_paths(CONCRETE, tree),
        "on_path_to_locked": policy.on_path_to_locked(CONCRETE, tree, node),
        "evictable": policy.evictable(CONCRETE, tree, node),
        "lock": policy.lock(CONCRETE, tree, node),
        "unlock": policy.unlock(CONCRETE, tree, node),
        "eviction_order": policy.eviction_order(CONCRETE, tree, need),
        "select_victims": policy.select_victims(CONCRETE, tree, need),
        "shaped": policy.shaped(CONCRETE, tree),
        "resident_closure": _fields(policy.resident_closure(CONCRETE, tree)),
        "closure_eviction_order": policy.eviction_order(CONCRETE, policy.resident_closure(CONCRETE, tree), need),
    }
    for name, result in concrete.items():
        assert _substitute(terms[name], pairs) == result, name


@functools.cache
def _symbolic_coalesce(length: int):
    pages = symbolic.pages(length)
    return pages, pageruns.coalesce_slots(Z3OPS, pages)


@functools.cache
def _symbolic_split(count: int):
    runs = symbolic.runs(count)
    at, page = z3.Int("at_page"), z3.Int("page")
    head, tail = pageruns.split_slots(Z3OPS, runs, at)
    return runs, at, page, head, tail, pageruns.contains_slots(Z3OPS, runs, page)


def _runs(slots, pairs):
    out = []
    for s in slots:
        if _substitute(s.valid, pairs):
            out.append(PageRun(_substitute(s.first_page, pairs), _substitute(s.page_count, pairs)))
    return tuple(out)


@settings(max_examples=EXAMPLES)
@given(pages=st.lists(st.integers(0, 12), max_size=8))
def test_coalesce_terms_evaluate_to_the_concrete_runs(pages):
    variables, slots = _symbolic_coalesce(len(pages))
    assert _runs(slots, _pairs(variables, pages)) == pageruns.coalesce(pages)


@settings(max_examples=EXAMPLES)
@given(
    runs=st.lists(st.builds(PageRun, st.integers(0, 20), st.integers(1, 5)), max_size=4),
    at=st.integers(-2, 25),
    page=st.integers(-2, 30),
)
def test_split_and_contains_terms_evaluate_to_the_concrete_results(runs, at, page):
    variables, at_var, page_var, head, tail, member = _symbolic_split(len(runs))
    pairs = _pairs((at_var, page_var), (at, page))
    for slot, run in zip(variables, runs, strict=True):
        pairs += _pairs((slot.first_page, slot.page_count), (run.first_page, run.page_count))
    assert (_runs(head, pairs), _runs(tail, pairs)) == pageruns.split_runs(runs, at)
    assert _substitute(member, pairs) == pageruns.contains(runs, page)
