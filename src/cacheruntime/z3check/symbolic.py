"""Symbolic inputs for the proofs: trees, page lists and run lists made of Z3 variables.

The proofs and the faithfulness tests build their inputs here, so that a test can put
concrete values in for exactly the variables a proof quantifies over.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import attrs
import z3

from cacheruntime.pageruns import RunSlot


@attrs.frozen
class SymbolicTree:
    """A tree of `size` nodes with every field symbolic, a request size and a node to (un)lock."""

    view: Any  # policy.TreeView of Z3 terms
    pages_needed: z3.ArithRef
    node: z3.ArithRef  # the node a lock/unlock names, constrained to 0..size-1 by the proofs

    @property
    def size(self) -> int:
        return self.view.size

    def variables(self) -> dict[str, tuple[Any, ...]]:
        """The variables by field, for substituting concrete values."""
        v = self.view
        return {
            "parent": v.parent[1:],
            "lock_ref": v.lock_ref,
            "page_count": v.page_count,
            "in_l1": v.in_l1,
            "last_access": v.last_access,
        }


def tree(policy: ModuleType, size: int) -> SymbolicTree:
    """A symbolic tree of `size` nodes built with `policy.TreeView`; the root's parent is 0."""
    view = policy.TreeView(
        parent=(0,) + tuple(z3.Int(f"parent_{i}") for i in range(1, size)),
        lock_ref=tuple(z3.Int(f"lock_ref_{i}") for i in range(size)),
        page_count=tuple(z3.Int(f"page_count_{i}") for i in range(size)),
        in_l1=tuple(z3.Bool(f"in_l1_{i}") for i in range(size)),
        last_access=tuple(z3.Int(f"last_access_{i}") for i in range(size)),
    )
    return SymbolicTree(view, z3.Int("pages_needed"), z3.Int("node"))


def pages(length: int) -> tuple[z3.ArithRef, ...]:
    """`length` symbolic page names."""
    return tuple(z3.Int(f"page_{j}") for j in range(length))


def runs(count: int) -> tuple[RunSlot, ...]:
    """`count` symbolic runs, all valid (a run list as an extent holds it)."""
    return tuple(RunSlot(True, z3.Int(f"first_page_{r}"), z3.Int(f"page_count_{r}")) for r in range(count))
