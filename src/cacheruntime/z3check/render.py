"""Counterexamples as a person reads them: a tree drawn by indentation, a run list, a counter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import z3

from cacheruntime.pageruns import RunSlot
from cacheruntime.z3check.symbolic import SymbolicTree


def value(model: z3.ModelRef, term: Any) -> Any:
    """`term` under `model` as a Python bool or int (terms that folded to constants pass through)."""
    if isinstance(term, (bool, int)):
        return term
    result = model.eval(term, model_completion=True)
    return z3.is_true(result) if z3.is_bool(result) else result.as_long()


def tree(model: z3.ModelRef, st: SymbolicTree, marks: dict[str, Sequence[Any]], node: bool = False) -> str:
    """The tree under `model`, one node a line, children indented under their parent.

    `marks` adds per-node fields: a flag (e.g. EVICTED) shown where true, a number (e.g.
    an eviction round) where non-zero, and a number whose name ends in `_to` (a lock_ref
    after lock or unlock) always.
    """
    t = st.view
    parent = [value(model, p) for p in t.parent]
    children: dict[int, list[int]] = {}
    for i in range(1, st.size):
        children.setdefault(parent[i], []).append(i)
    header = f"pages_needed = {value(model, st.pages_needed)}"
    if node:
        header += f", node = {value(model, st.node)}"
    lines = [header]

    def describe(i: int, depth: int) -> None:
        if i == 0:  # the root holds no pages and is never evicted: only its lock_ref matters
            fields = ["root", f"lock_ref={value(model, t.lock_ref[i])}"]
        else:
            fields = [
                f"node {i}",
                f"pages={value(model, t.page_count[i])}",
                f"lock_ref={value(model, t.lock_ref[i])}",
                "L1" if value(model, t.in_l1[i]) else "not-L1",
                f"last_access={value(model, t.last_access[i])}",
            ]
        for name, terms in marks.items():
            mark = value(model, terms[i])
            if mark is True:
                fields.append(name.upper())
            elif mark is not False and (mark != 0 or name.endswith("_to")):
                fields.append(f"{name.upper()}={mark}")
        lines.append("  " * depth + ("`- " if depth else "") + " ".join(fields))
        for child in children.get(i, []):
            describe(child, depth + 1)

    describe(0, 0)
    return "\n".join(lines)


def slots(model: z3.ModelRef, run_slots: Sequence[RunSlot]) -> str:
    """The valid runs among `run_slots` as `[first..last]` ranges (an empty run shows as `[first..]`)."""
    shown = []
    for s in run_slots:
        if value(model, s.valid):
            first, count = value(model, s.first_page), value(model, s.page_count)
            shown.append(f"[{first}..{first + count - 1}]" if count > 0 else f"[{first}.. count={count}]")
    return "(" + ", ".join(shown) + ")"


def values(model: z3.ModelRef, **named: Any) -> str:
    """`name = value` pairs, sequences shown as lists."""
    parts = []
    for name, term in named.items():
        if isinstance(term, (tuple, list)):
            parts.append(f"{name} = {[value(model, x) for x in term]}")
        else:
            parts.append(f"{name} = {value(model, term)}")
    return ", ".join(parts)
