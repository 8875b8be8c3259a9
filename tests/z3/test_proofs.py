"""The Z3 checks prove the real code at a CI bound, and the runner's verdicts are honest.

`cacheruntime z3` runs the full bound (8 nodes); here every check runs at 6 nodes, which
keeps this file to seconds while still covering trees with several rounds of eviction.
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
    outcome = solve.run(check, solve.REAL, CI_BOUNDS, timeout_s=300)
    assert outcome.result == "proved", outcome.detail


def test_every_tree_invariant_has_a_check():
    assert {c.invariant for c in CHECKS} >= {"E1", "E2", "E3", "E4", "H2"}


def test_generation_horizon_is_exact_for_a_small_width():
    """At 8 bits the stale-handle horizon is 255 reuses: proved up to it, and the witness at 256 holds."""
    check = solve.BY_NAME["h2_stale_handle_horizon"]
    outcome = solve.run(check, solve.REAL, Bounds(generation_bits=8), timeout_s=60)
    assert outcome.result == "proved" and outcome.bound == "8-bit, exactly 2^8-1 reuses"


def _fake_check(claim, witness):
    x = z3.Int("x")
    obligation = Obligation(x >= 0, claim(x), lambda m: f"x = {m.eval(x)}", witness(x))
    return Check("fake", "E1", "a test double", "tree", lambda b: "x >= 0", lambda s, b: iter([obligation]))


def test_runner_reports_a_counterexample():
    outcome = solve.run(_fake_check(lambda x: x > 0, lambda x: None), solve.REAL, CI_BOUNDS, 10)
    assert outcome.result == "counterexample" and outcome.detail == "x = 0"


def test_runner_reports_a_vacuous_proof():
    outcome = solve.run(_fake_check(lambda x: x >= 0, lambda x: z3.And(x > 0, x < 0)), solve.REAL, CI_BOUNDS, 10)
    assert outcome.result == "vacuous"


def test_cli_exit_status_and_table(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--nodes", "3", "--jobs", "1", "--only", "e4_no_underflow", "--only", "runs_split_union"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "e4_no_underflow" in out and "trees <= 3 nodes" in out and "proved" in out
    assert main(parser.parse_args(["--only", "no_such_check"])) == 2


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_every_check_renders_its_inputs(check):
    """A counterexample would print: every explainer renders some model of its assumption."""
    obligation = list(check.obligations(solve.REAL, Bounds(nodes=3, pages=3, runs=2, generation_bits=8)))[-1]
    solver = z3.Solver()
    solver.add(obligation.assumption)
    assert solver.check() == z3.sat
    text = obligation.explain(solver.model())
    assert text and "=" in text
