"""Running a check: one solver query per obligation, a resource budget, a verdict.

A check is bounded by Z3's `rlimit`, a count of the solver's own steps, not by seconds:
the same check on the same z3-solver spends the same count whether the machine is idle or
loaded, so its verdict cannot change with load (a wall-clock timeout made a loaded CI
machine fail proofs that pass on an idle one). Two things keep the count reproducible:

- Queries go to `z3.SimpleSolver()`, Z3's SMT core. The default `z3.Solver()` hands a
  one-shot query to a tactic portfolio whose integer strategy (qflia) tries branches under
  wall-clock `try_for` limits of 2-15 s; a loaded machine cuts those short and the
  portfolio takes another path, with another count and possibly another verdict.
- The count is per Z3 context and depends on what the process solved before, so
  `cacheruntime z3` runs every check and every mutant in a fresh process.

`run_named` is the unit of parallel work: it takes and returns plain values, so a process
pool can run checks side by side (Z3 terms cannot cross processes).
"""

from __future__ import annotations

import math
import time

import attrs
import z3

from cacheruntime import pageruns
from cacheruntime.control import policy
from cacheruntime.z3check import mutants
from cacheruntime.z3check.proofs import CHECKS, Bounds, Check, Subjects

REAL = Subjects(policy, pageruns)
BY_NAME = {check.name: check for check in CHECKS}

#: The result of a check whose queries spent its budget before a verdict: a failure, like a counterexample.
RESOURCE_LIMIT = "resource limit"

#: How many times the measured count a check's budget allows (see RLIMITS).
MARGIN = 4

#: The least budget: a query's count also depends on what the process solved before (a
#: first query pays for setup), which a check of a few hundred units would feel.
FLOOR = 100_000

#: check name -> the rlimit units its queries spent at the default `Bounds()` (8 nodes, page
#: lists <= 8, run lists <= 4, 32-bit generations), the most of: proving the real code, and
#: refuting each mutant whose expected killer it is (a few thousand units at most). Measured
#: on z3-solver 5.4.1.0 with `cacheruntime z3 --mutants`, each check in a fresh process: the
#: "rlimit used" columns (a budget that is not spent does not change the count). One CPU
#: second of the 2-core CI machine is about 1-2 million units.
MEASURED: dict[str, int] = {
    "e1_locked_path_never_evicted": 376072,
    "e1_on_path_to_locked_exact": 168422,
    "e2_leaves_first": 100485985,
    "e2_l1_stays_prefix_closed": 97470888,
    "e2_closure_evicts_only_resident": 130230599,
    "e3_closure_frees_enough": 333558765,
    "e2_evictable_is_unlocked_l1_leaf": 423083,
    "e3_frees_enough": 281779124,
    "e3_stops_at_last_leaf": 70454492,
    "e4_lock_adds_one_on_path": 690637,
    "e4_lock_unlock_roundtrip": 1242594,
    "e4_unlock_rejected_without_lock": 1122256,
    "e4_no_underflow": 430102,
    "h2_stale_handle_horizon": 405,
    "h2_generation_monotone": 8376,
    "runs_coalesce_exact": 322309,
    "runs_coalesce_sorted_disjoint": 107023,
    "runs_split_union": 166319,
}

#: The most one query can be given: Z3's `rlimit` parameter is a 32-bit unsigned, larger values wrap.
QUERY_MAX = 2**32 - 1

#: check name -> its budget in rlimit units at `--rlimit-scale 1`: MARGIN times MEASURED, at least FLOOR.
RLIMITS: dict[str, int] = {name: max(FLOOR, MARGIN * used) for name, used in MEASURED.items()}


def budget(check: str, scale: float) -> int:
    """The rlimit budget of `check` times `scale` (at least 1 unit: Z3 reads 0 as no limit)."""
    return max(1, math.ceil(RLIMITS[check] * scale))


def _count(solver: z3.Solver) -> int:
    """The context's rlimit count as `solver` last saw it (Z3 counts per context, not per solver)."""
    return int(solver.statistics().get_key_value("rlimit count"))


@attrs.frozen
class Outcome:
    """What a check came to: `proved`, `counterexample`, `vacuous` (a witness failed) or `resource limit`."""

    check: str
    invariant: str
    bound: str
    result: str
    rlimit_used: int  # rlimit units its queries spent
    rlimit: int  # its budget
    seconds: float  # for the reader only: no verdict depends on it
    detail: str = ""  # the counterexample, or what was vacuous or ran out

    @property
    def ok(self) -> bool:
        return self.result == "proved"


def run(check: Check, subjects: Subjects, bounds: Bounds, rlimit: int) -> Outcome:
    """Discharge every obligation of `check` within `rlimit` units of Z3's resource count in all."""
    start = time.perf_counter()
    used = 0

    def outcome(result: str, detail: str = "") -> Outcome:
        return Outcome(check.name, check.invariant, check.bound(bounds), result, used, rlimit, time.perf_counter() - start, detail)

    def solve(*formulas: z3.BoolRef) -> tuple[z3.CheckSatResult, z3.Solver]:
        nonlocal used
        solver = z3.SimpleSolver()
        before = _count(solver)
        solver.set("rlimit", min(rlimit - used, QUERY_MAX))  # Z3 counts it from the context's count now
        solver.add(*formulas)
        answer = solver.check()
        used += _count(solver) - before
        return answer, solver

    def out_of_budget(query: str, solver: z3.Solver) -> Outcome:
        capped = f", one query at most {QUERY_MAX}" if used < rlimit else ""
        return outcome(RESOURCE_LIMIT, f"{query}: {used} of {rlimit} rlimit units spent{capped} (z3: {solver.reason_unknown()})")

    for number, obligation in enumerate(check.obligations(subjects, bounds), 1):
        if used >= rlimit:
            return outcome(RESOURCE_LIMIT, f"{used} of {rlimit} rlimit units spent before obligation {number}")
        answer, solver = solve(obligation.assumption, z3.Not(obligation.claim))
        if answer == z3.sat:
            return outcome("counterexample", obligation.explain(solver.model()))
        if answer == z3.unknown:
            return out_of_budget(f"obligation {number}, claim", solver)
        if obligation.witness is not None:
            answer, solver = solve(obligation.witness)
            if answer == z3.unsat:
                return outcome("vacuous", "the witness is unsatisfiable: no interesting input meets the assumption")
            if answer == z3.unknown:
                return out_of_budget(f"obligation {number}, witness", solver)
    return outcome("proved")


def run_named(check: str, bounds: Bounds, scale: float) -> Outcome:
    """`run` on the real code, by check name, with its recorded budget times `scale`."""
    return run(BY_NAME[check], REAL, bounds, budget(check, scale))


@attrs.frozen
class MutantOutcome:
    """Which check refuted a mutant first (`killed_by` empty if none did)."""

    mutant: str
    bug: str
    expected: str
    killed_by: str
    rlimit_used: int  # by every check it ran, together
    seconds: float
    counterexample: str

    @property
    def ok(self) -> bool:
        return self.killed_by == self.expected


def run_mutant(name: str, bounds: Bounds, scale: float) -> MutantOutcome:
    """The mutant's family of checks, its expected killer first, until one finds a counterexample."""
    mutant = next(m for m in mutants.MUTANTS if m.name == name)
    subjects = mutant.subjects()
    family = [BY_NAME[mutant.killed_by]] + [c for c in CHECKS if c.family == mutant.family and c.name != mutant.killed_by]
    start, used = time.perf_counter(), 0
    for check in family:
        outcome = run(check, subjects, bounds, budget(check.name, scale))
        used += outcome.rlimit_used
        if outcome.result == "counterexample":
            return MutantOutcome(name, mutant.bug, mutant.killed_by, check.name, used, time.perf_counter() - start, outcome.detail)
    return MutantOutcome(name, mutant.bug, mutant.killed_by, "", used, time.perf_counter() - start, "")
