"""Every mutant is killed by the CI profile: the suite has no blind spot for the invariants they break.

Kills run without shrinking (a kill is a kill; `cacheruntime conformance --mutants --shrink`
shows minimal sequences).
"""

import pytest

from cacheruntime.conformance.mutants import MUTANTS
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import run_check
from cacheruntime.conformance.statemachine import CHECKS


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_killed(name):
    mutant = MUTANTS[name]
    outcomes = []
    for check in CHECKS:
        outcome = run_check(mutant.target, check, profile("ci", shrink=False))
        outcomes.append(outcome)
        if outcome.status == "failed":
            break
    killed = outcomes[-1].status == "failed"
    assert killed, f"{name} ({mutant.invariant}: {mutant.how}) survived every check"
    assert outcomes[-1].script.startswith("# Reproduces")
