"""The conformance checks as pytest tests, for `from cacheruntime.conformance.suite import *`.

One test per check (`core`, `tiers`, `restart`, `ordering`, `faults`, `storage`), so a team sees which area
fails, which is skipped for lack of a claim, and which fails as expected. The fixtures
come from `cacheruntime.conformance.plugin`.
"""

from __future__ import annotations

import pytest

from cacheruntime.conformance import expected as expected_file
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import describe, run_check
from cacheruntime.conformance.statemachine import CHECKS

__all__ = ["test_cacheruntime_conformance"]


@pytest.mark.parametrize("check", list(CHECKS))
def test_cacheruntime_conformance(check, cacheruntime_target, cacheruntime_expected, cacheruntime_record, request):
    """Hold the runtime to the reference model in one check; a failure shows the runnable reproduction."""
    config = request.config
    settings = profile(
        config.getoption("--cacheruntime-profile"), config.getoption("--cacheruntime-database"), shrink=not config.getoption("--cacheruntime-no-shrink")
    )
    outcome = run_check(cacheruntime_target, check, settings)
    cacheruntime_record(outcome)
    if outcome.status == "skipped":
        pytest.skip(outcome.message)
    if outcome.status == "failed":
        new = expected_file.new_violations(cacheruntime_expected, outcome)
        if not new:
            pytest.xfail(f"[{', '.join(outcome.ids)}] every violation expected: " + "; ".join(str(v.signature) for v in outcome.violations))
        pytest.fail("\n\n".join(describe(v) for v in new), pytrace=False)
