"""Hypothesis profiles: `ci` (derandomized, bounded; Hypothesis loads it itself when CI is
set) and `deep` (randomized, long, failures kept in the example database for replay).

Select one with `--hypothesis-profile=deep` or `HYPOTHESIS_PROFILE=deep`.

Every test draws independently of which modules the session has imported
(`independent_of_loaded_modules`): a derandomized test passes or fails the same alone and
inside the whole suite.
"""

import contextlib
import os

from hypothesis import HealthCheck, settings

from cacheruntime.conformance.draws import independent_of_loaded_modules

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=5000,
    stateful_step_count=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_draws = contextlib.ExitStack()

#: The longest test files, longest first (durations of the 2-core CI machine). The README's test
#: command hands whole files to its workers in collection order (`-n auto --dist loadfile
#: --no-loadscope-reorder`: pytest-xdist's own order puts the files with most tests first), so a
#: long file collected last would run alone at the end while the other cores idle.
LONGEST_FILES = (
    "tests/test_gate.py",
    "tests/sglang/test_venv.py",
    "tests/conformance/test_legal_variants.py",
    "tests/tla/test_tlc.py",
    "tests/conformance/test_coverage.py",
    "tests/conformance/test_keep_going.py",
)


def pytest_configure(config):
    _draws.enter_context(independent_of_loaded_modules())


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.as_posix()
        return next((i for i, name in enumerate(LONGEST_FILES) if path.endswith(name)), len(LONGEST_FILES))

    items.sort(key=rank)  # stable: every other test keeps its place


def pytest_unconfigure(config):
    _draws.close()
