"""The Z3 checks prove the real code at a CI bound, and the runner's verdicts are honest.

`cacheruntime z3` runs the full bound (8 nodes); here every check runs at 6 nodes, which
keeps this file to seconds while still covering trees with several rounds of eviction.
Every run is bounded by the check's recorded rlimit budget, never by seconds.
"""

from __future__ import annotations

import argparse

import pytest
import z3

from cacheruntime.z3check import add_arguments, main, solve
from cacheruntime.z3check.proofs import CHECKS, Bounds, Check, Obligation

CI_BOUNDS = Bounds(nodes=6, pages=8, runs=4, generation_bits=32)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_check_proves_the_real_code(check):
    outcome = solve.run(check, solve.REAL, CI_BOUNDS, solve.budget(check.name, 1))
    assert outcome.result == "proved", outcome.detail
    assert 0 < outcome.rlimit_used <= outcome.rlimit


def test_every_tree_invariant_has_a_check():
    assert {c.invariant for c in CHECKS} >= {"E1", "E2", "E3", "E4", "H2"}


def test_generation_horizon_is_exact_for_a_small_width():
    """At 8 bits the stale-handle horizon is 255 reuses: proved up to it, and the witness at 256 holds."""
    check = solve.BY_NAME["h2_stale_handle_horizon"]
    outcome = solve.run(check, solve.REAL, Bounds(generation_bits=8), solve.budget(check.name, 1))
    assert outcome.result == "proved" and outcome.bound == "8-bit, exactly 2^8-1 reuses"


def _fake_check(claim, witness):
    x = z3.Int("x")
    obligation = Obligation(x >= 0, claim(x), lambda m: f"x = {m.eval(x)}", witness(x))
    return Check("fake", "E1", "a test double", "tree", lambda b: "x >= 0", lambda s, b: iter([obligation]))


def test_runner_reports_a_counterexample():
    outcome = solve.run(_fake_check(lambda x: x > 0, lambda x: None), solve.REAL, CI_BOUNDS, 10**6)
    assert outcome.result == "counterexample" and outcome.detail == "x = 0"


def test_runner_reports_a_vacuous_proof():
    outcome = solve.run(_fake_check(lambda x: x >= 0, lambda x: z3.And(x > 0, x < 0)), solve.REAL, CI_BOUNDS, 10**6)
    assert outcome.result == "vacuous"


def test_every_check_has_a_recorded_budget():
    assert set(solve.RLIMITS) == set(solve.BY_NAME)
    assert all(budget == max(solve.FLOOR, solve.MARGIN * solve.MEASURED[name]) for name, budget in solve.RLIMITS.items())


def test_runner_reports_a_spent_budget_as_a_failure():
    """Pigeonhole: 7 distinct values in 0..5 is unsat, but not within 50 units of Z3's count."""
    xs = z3.Ints(" ".join(f"x{i}" for i in range(7)))
    obligation = Obligation(z3.And([z3.And(0 <= x, x < 6) for x in xs]), z3.Not(z3.Distinct(xs)), lambda m: "")
    check = Check("fake", "E1", "a test double", "tree", lambda b: "", lambda s, b: iter([obligation]))
    outcome = solve.run(check, solve.REAL, CI_BOUNDS, 50)
    assert outcome.result == solve.RESOURCE_LIMIT and not outcome.ok
    assert outcome.rlimit == 50 and outcome.rlimit_used >= 50 and "of 50 rlimit units" in outcome.detail
    assert solve.run(check, solve.REAL, CI_BOUNDS, 10**8).result == "proved"


def test_cli_exit_status_and_table(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--nodes", "3", "--jobs", "1", "--only", "e4_no_underflow", "--only", "runs_split_union"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "e4_no_underflow" in out and "trees <= 3 nodes" in out and "proved" in out and "rlimit used" in out
    assert main(parser.parse_args(["--only", "no_such_check"])) == 2


def _rows(out):
    """The table's rows without the seconds column: what must not depend on the machine's load."""
    return [line.rsplit(None, 1)[0] for line in out.splitlines() if line.startswith(("e4_", "runs_"))]


def test_cli_verdicts_and_counts_are_reproducible(capsys):
    """Each check runs in a fresh process, so its rlimit count is the same on every run."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--nodes", "4", "--only", "e4_no_underflow", "--only", "runs_split_union"])
    assert main(args) == 0
    first = _rows(capsys.readouterr().out)
    assert main(args) == 0
    assert _rows(capsys.readouterr().out) == first and len(first) == 2


def test_cli_a_spent_budget_fails(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args(["--nodes", "3", "--only", "e4_no_underflow", "--rlimit-scale", "1e-9"])) == 1
    out = capsys.readouterr().out
    assert "e4_no_underflow: resource limit" in out and "--rlimit-scale" in out and "FAILED" in out


def test_cli_timeout_is_gone(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args(["--timeout", "600"])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rlimit-scale" in err


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_every_check_renders_its_inputs(check):
    """A counterexample would print: every explainer renders some model of its assumption."""
    obligation = list(check.obligations(solve.REAL, Bounds(nodes=3, pages=3, runs=2, generation_bits=8)))[-1]
    solver = z3.Solver()
    solver.add(obligation.assumption)
    assert solver.check() == z3.sat
    text = obligation.explain(solver.model())
    assert text and "=" in text
