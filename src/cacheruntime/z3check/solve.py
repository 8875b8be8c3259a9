"""Running a check: one solver query per obligation, a time budget, a verdict.

`run_named` is the unit of parallel work: it takes and returns plain values, so a process
pool can run checks side by side (Z3 terms cannot cross processes).
"""

from __future__ import annotations

import time

import attrs
import z3

from cacheruntime import pageruns
from cacheruntime.control import policy
from cacheruntime.z3check import mutants
from cacheruntime.z3check.proofs import CHECKS, Bounds, Check, Subjects

REAL = Subjects(policy, pageruns)
BY_NAME = {check.name: check for check in CHECKS}


@attrs.frozen
class Outcome:
    """What a check came to: `proved`, `counterexample`, `vacuous` (a witness failed) or `timeout`."""

    check: str
    invariant: str
    bound: str
    result: str
    seconds: float
    detail: str = ""  # the counterexample, or what was vacuous or timed out

    @property
    def ok(self) -> bool:
        return self.result == "proved"


def run(check: Check, subjects: Subjects, bounds: Bounds, timeout_s: float) -> Outcome:
    """Discharge every obligation of `check` within `timeout_s` seconds in all."""
    start = time.perf_counter()

    def outcome(result: str, detail: str = "") -> Outcome:
        return Outcome(check.name, check.invariant, check.bound(bounds), result, time.perf_counter() - start, detail)

    def solve(*formulas: z3.BoolRef) -> z3.Solver:
        solver = z3.Solver()
        solver.set("timeout", max(1, int(1000 * (timeout_s - (time.perf_counter() - start)))))
        solver.add(*formulas)
        return solver

    for obligation in check.obligations(subjects, bounds):
        if time.perf_counter() - start >= timeout_s:
            return outcome("timeout", "the time budget ran out between obligations")
        solver = solve(obligation.assumption, z3.Not(obligation.claim))
        answer = solver.check()
        if answer == z3.sat:
            return outcome("counterexample", obligation.explain(solver.model()))
        if answer == z3.unknown:
            return outcome("timeout", solver.reason_unknown())
        if obligation.witness is not None:
            solver = solve(obligation.witness)
            answer = solver.check()
            if answer == z3.unsat:
                return outcome("vacuous", "the witness is unsatisfiable: no interesting input meets the assumption")
            if answer == z3.unknown:
                return outcome("timeout", f"witness: {solver.reason_unknown()}")
    return outcome("proved")


def run_named(check: str, bounds: Bounds, timeout_s: float) -> Outcome:
    """`run` on the real code, by check name."""
    return run(BY_NAME[check], REAL, bounds, timeout_s)


@attrs.frozen
class MutantOutcome:
    """Which check refuted a mutant first (`killed_by` empty if none did)."""

    mutant: str
    bug: str
    expected: str
    killed_by: str
    seconds: float
    counterexample: str

    @property
    def ok(self) -> bool:
        return self.killed_by == self.expected


def run_mutant(name: str, bounds: Bounds, timeout_s: float) -> MutantOutcome:
    """The mutant's family of checks, its expected killer first, until one finds a counterexample."""
    mutant = next(m for m in mutants.MUTANTS if m.name == name)
    subjects = mutant.subjects()
    family = [BY_NAME[mutant.killed_by]] + [c for c in CHECKS if c.family == mutant.family and c.name != mutant.killed_by]
    start = time.perf_counter()
    for check in family:
        outcome = run(check, subjects, bounds, timeout_s)
        if outcome.result == "counterexample":
            return MutantOutcome(name, mutant.bug, mutant.killed_by, check.name, time.perf_counter() - start, outcome.detail)
    return MutantOutcome(name, mutant.bug, mutant.killed_by, "", time.perf_counter() - start, "")
