"""The `faults` check (issue 17): it passes the landed runtime and kills each mutant of a failure path.

The mutants (`cacheruntime.conformance.mutants.faults`) each mishandle one fault: a failed
copy taken for landed, write-back that drops the device copy before its backup lands, a
failed backup that leaves the demote in force, a failed batch committed, compute over a
restore that failed, a dead stream worker unnoticed. CI profile, first violation each.
"""

from __future__ import annotations

import pytest

from cacheruntime.conformance.mutants import faults
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import run_check
from cacheruntime.conformance.target import Target


def test_the_faults_check_passes_the_landed_runtime():
    outcome = run_check(Target("cacheruntime.runtime.factories:conformance", ()), "faults", profile("ci", shrink=False))
    assert outcome.status == "passed", outcome


@pytest.mark.parametrize("name", sorted(faults.MUTANTS))
def test_the_faults_check_kills_each_fault_mutant(name):
    target = Target(f"cacheruntime.conformance.mutants.faults:{faults.MUTANTS[name].__name__}", ())
    outcome = run_check(target, "faults", profile("ci", shrink=False), keep_going=False)
    assert outcome.status == "failed", f"{name} survives the faults check"
