"""The pytest plugin: run the conformance suite inside an engine team's own pytest.

Installed with cacheruntime (entry point `pytest11: cacheruntime`). A project adds one
test module containing

    from cacheruntime.conformance.suite import *  # noqa: F403

and runs `pytest --cacheruntime-factory MODULE:FACTORY [--cacheruntime-option key=value]
[--cacheruntime-expected FILE] [--cacheruntime-profile deep]`. Without the factory option
the suite's tests skip, so the module is harmless in runs that do not ask for it. The
terminal summary lists the checks skipped for lack of a claim and expected failures that
no longer fail.

pytest loads this plugin in every run of an environment that has cacheruntime, also one
without the [conformance] extra's Hypothesis: what needs Hypothesis is imported only when
the suite is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from cacheruntime.conformance.target import Target

if TYPE_CHECKING:
    from cacheruntime.conformance.expected import Expected
    from cacheruntime.conformance.runner import Outcome

_OUTCOMES = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cacheruntime", "cacheruntime conformance suite")
    group.addoption("--cacheruntime-factory", default=None, metavar="MODULE:FACTORY", help="runtime under test")
    group.addoption("--cacheruntime-option", action="append", default=[], metavar="KEY=VALUE", help="factory kwarg")
    group.addoption("--cacheruntime-expected", default=None, metavar="FILE", help="TOML expected-failures file")
    group.addoption("--cacheruntime-profile", choices=("ci", "deep"), default="ci", help="Hypothesis profile of the suite")
    group.addoption("--cacheruntime-database", default=None, help="example database of the deep profile (default: the suite's)")
    group.addoption(
        "--cacheruntime-no-shrink", action="store_true", help="report each failing case as found, unshrunk (faster; `cacheruntime conformance` shrinks it)"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_OUTCOMES] = []


@pytest.fixture(scope="session")
def cacheruntime_target(request: pytest.FixtureRequest) -> Target:
    """The runtime under test from `--cacheruntime-factory`; skips the suite when it is not given."""
    spec = request.config.getoption("--cacheruntime-factory")
    if not spec:
        pytest.skip("no --cacheruntime-factory given")
    return Target.parse(spec, request.config.getoption("--cacheruntime-option"))


@pytest.fixture(scope="session")
def cacheruntime_expected(request: pytest.FixtureRequest) -> tuple[Expected, ...]:
    """The entries of `--cacheruntime-expected`, or none."""
    from cacheruntime.conformance import expected as expected_file

    path = request.config.getoption("--cacheruntime-expected")
    return expected_file.load(path) if path else ()


@pytest.fixture(scope="session")
def cacheruntime_record(request: pytest.FixtureRequest):
    """Keep each check's outcome for the terminal summary."""
    return request.config.stash[_OUTCOMES].append


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    spec = config.getoption("--cacheruntime-factory")
    outcomes: list[Outcome] = config.stash.get(_OUTCOMES, [])
    if not spec or not outcomes:
        return
    from cacheruntime.conformance import expected as expected_file
    from cacheruntime.conformance.runner import claims_report

    target = Target.parse(spec, config.getoption("--cacheruntime-option"))
    terminalreporter.section("cacheruntime conformance")
    terminalreporter.write_line(f"runtime: {target}")
    for line in claims_report(target.new().info().capabilities):
        terminalreporter.write_line(f"  {line}")
    path = config.getoption("--cacheruntime-expected")
    if path:
        for entry in expected_file.now_passing(expected_file.load(path), outcomes):
            terminalreporter.write_line(f"XPASS: expected violation {entry.signature!r} did not occur ({entry.reason}); remove it from {path}")
