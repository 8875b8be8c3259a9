"""Each planted bug is refuted by the check meant for it, with a readable counterexample."""

from __future__ import annotations

import pytest

from cacheruntime.z3check import solve
from cacheruntime.z3check.mutants import MUTANTS
from cacheruntime.z3check.proofs import Bounds


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_caught(mutant):
    outcome = solve.run_mutant(mutant.name, Bounds(nodes=6), scale=1)
    assert outcome.killed_by == mutant.killed_by, f"{mutant.name} survived {mutant.killed_by}"
    if mutant.family == "tree":
        assert "pages_needed =" in outcome.counterexample and "root" in outcome.counterexample
    else:
        assert "->" in outcome.counterexample  # the input runs and what the code made of them


def test_mutants_change_the_real_source_exactly_once():
    for mutant in MUTANTS:
        assert mutant.subjects() is not None  # raises if the replaced text is gone or ambiguous
