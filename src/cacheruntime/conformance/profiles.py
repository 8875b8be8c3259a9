"""Hypothesis settings for the suite: `ci` (deterministic, bounded) and `deep` (randomized, replayable).

`ci` is derandomized, so the same runtime gives the same verdict on every machine: a
gate must not flake. `deep` explores at random for much longer and keeps every failing
example in an example database directory, so `--profile deep` again (or `--replay`)
re-runs the saved failures first.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

_COMMON = dict(
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

#: Default example database directory of the deep profile.
DEFAULT_DATABASE = ".cacheruntime-conformance"


def profile(name: str, database: str | None = None, max_examples: int | None = None, shrink: bool = True) -> settings:
    """The settings of profile `name` ("ci" or "deep"); `max_examples` overrides its budget.

    `shrink=False` stops at the first failing example: a kill is a kill, and shrinking a
    long sequence of slow steps costs minutes (the mutant test uses it).
    """
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.reuse, Phase.generate)
    if name == "ci":
        return settings(
            derandomize=True,
            database=None,
            max_examples=max_examples or 60,
            stateful_step_count=50,
            phases=phases,
            **_COMMON,
        )
    if name == "deep":
        from hypothesis.database import DirectoryBasedExampleDatabase

        return settings(
            derandomize=False,
            database=DirectoryBasedExampleDatabase(database or DEFAULT_DATABASE),
            max_examples=max_examples or 2000,
            stateful_step_count=80,
            phases=phases,
            **_COMMON,
        )
    raise ValueError(f"unknown profile {name!r}: use ci or deep")
