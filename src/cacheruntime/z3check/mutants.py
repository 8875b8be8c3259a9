"""Known bugs, planted in copies of the real source, that the proofs must catch.

A mutant is one textual replacement in `control/policy.py` or `pageruns.py`, executed as
a fresh module; the real modules are never touched. The replaced text must occur exactly
once, so that a change to the policy that moves it makes the mutant fail loudly instead of
silently testing nothing.
"""

from __future__ import annotations

import inspect
import types
from types import ModuleType

import attrs

from cacheruntime import pageruns
from cacheruntime.control import policy
from cacheruntime.z3check.proofs import Subjects


@attrs.frozen
class Mutant:
    """A planted bug: where, what it replaces, and the check that must refute it."""

    name: str
    bug: str
    module: ModuleType
    original: str
    replacement: str
    killed_by: str  # the check expected to find a counterexample

    @property
    def family(self) -> str:
        return "runs" if self.module is pageruns else "tree"

    def subjects(self) -> Subjects:
        """The real modules with this one replaced by its mutated copy."""
        source = inspect.getsource(self.module)
        found = source.count(self.original)
        if found != 1:
            raise ValueError(f"mutant {self.name}: {self.original!r} occurs {found} times in {self.module.__name__}")
        mutated = types.ModuleType(f"{self.module.__name__}__mutant_{self.name}")
        mutated.__file__ = f"<mutant {self.name}>"
        exec(compile(source.replace(self.original, self.replacement), mutated.__file__, "exec"), mutated.__dict__)
        if self.module is policy:
            return Subjects(mutated, pageruns)
        return Subjects(policy, mutated)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "skip_lock_check",
        "evict without looking at locks below the node",
        policy,
        "return ops.And(node != 0, in_l1, ops.Not(blocked), l1_children == 0)",
        "return ops.And(node != 0, in_l1, l1_children == 0)",
        "e1_locked_path_never_evicted",
    ),
    Mutant(
        "lock_check_at_node_only",
        "treat a node as locked only by its own lock_ref, not by locks below it",
        policy,
        "ops.Scatter(blocked, t.parent[child], lambda _, b, below=below: ops.Or(b, below))",
        "ops.Scatter(blocked, t.parent[child], lambda _, b, below=below: b)",
        "e1_locked_path_never_evicted",
    ),
    Mutant(
        "evict_internal_node",
        "evict a node whose children are still in L1",
        policy,
        "return ops.And(node != 0, in_l1, ops.Not(blocked), l1_children == 0)",
        "return ops.And(node != 0, in_l1, ops.Not(blocked))",
        "e2_leaves_first",
    ),
    Mutant(
        "closure_one_level",
        "after a failure, count a node resident only for a resident child, not for one further down",
        policy,
        "ops.Scatter(resident_below, t.parent[child], lambda _, r, below=below: ops.Or(r, below))",
        "ops.Scatter(resident_below, t.parent[child], lambda _, r, below=t.in_l1[child]: ops.Or(r, below))",
        "e2_closure_evicts_only_resident",
    ),
    Mutant(
        "closure_counts_host_only_pages",
        "after a failure, count the pages of a host-only node above a resident one as freed by its eviction",
        policy,
        "pages = tuple(ops.If(resident, count, 0) for resident, count in zip(t.in_l1, t.page_count, strict=True))",
        "pages = tuple(t.page_count)",
        "e3_closure_frees_enough",
    ),
    Mutant(
        "stop_one_page_early",
        "off-by-one in the page count: stop when one page is still missing",
        policy,
        "pick = ops.And(found, freed < pages_needed)",
        "pick = ops.And(found, freed + 1 < pages_needed)",
        "e3_frees_enough",
    ),
    Mutant(
        "evict_one_leaf_too_many",
        "off-by-one in the page count: go on while freed == pages_needed",
        policy,
        "pick = ops.And(found, freed < pages_needed)",
        "pick = ops.And(found, freed <= pages_needed)",
        "e3_stops_at_last_leaf",
    ),
    Mutant(
        "unlock_unchecked",
        "unlock without checking the path for a zero lock_ref",
        policy,
        "ok = ops.And(ok, ops.Or(ops.Not(on), ops.Get(t.lock_ref, node) > 0))",
        "ok = ops.And(ok, True)",
        "e4_no_underflow",
    ),
    Mutant(
        "lock_skips_root",
        "lock stops below the root",
        policy,
        "step = ops.If(on, 1, 0)\n        ops.Scatter(lock_ref, node, lambda _, ref, step=step: ref + step)",
        "step = ops.If(ops.And(on, node != 0), 1, 0)\n        ops.Scatter(lock_ref, node, lambda _, ref, step=step: ref + step)",
        "e4_lock_adds_one_on_path",
    ),
    Mutant(
        "split_boundary_off_by_one",
        "wrong split boundary: cut one page after at_page",
        pageruns,
        "cut = at_page - seen",
        "cut = at_page - seen + 1",
        "runs_split_union",
    ),
    Mutant(
        "coalesce_across_gap",
        "coalesce takes page + 2, not page + 1, as continuing a run",
        pageruns,
        "pages[j] != pages[j - 1] + 1",
        "pages[j] != pages[j - 1] + 2",
        "runs_coalesce_exact",
    ),
)
