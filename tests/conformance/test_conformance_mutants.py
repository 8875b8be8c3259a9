"""Every mutant is killed by the CI profile: the suite has no blind spot for the invariants they break.

Kills run without shrinking (a kill is a kill; `cacheruntime conformance --mutants --shrink`
shows minimal sequences).

Mutants no run of the conformance configuration can tell from the landed runtime
(`families.EQUIVALENT`) are set aside. The exception are the known survivors of the
`family` mutants (`families.SURVIVORS`, empty since issue 14's item 4): the
suite's measured blind spots. Each is asserted to *survive* every check, so an improvement
of the suite that kills one fails here until its entry is removed. A survivor costs a full
run of every check (about a minute on 2 cores), so those assertions are `slow` runs
(`pytest -m slow tests/conformance/test_conformance_mutants.py`); CI checks that the list
is well formed. The `situation` family (`situations.SITUATION_SURVIVORS`, written without
reading the suite) had survivors of its own, held the same way (none since 2026-12-02). For the mutants that die,
the test tries first the check that killed them in the measured table (`KILLED_BY`), then
the others.
"""

import pytest

from cacheruntime.conformance.mutants import MUTANTS, families, faults, situations, storage
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import run_check
from cacheruntime.conformance.statemachine import CHECKS

#: Shipped mutants of the other families the CI profile no longer kills, with why: each is a
#: regression of the suite to fix (issue 14), asserted to survive so that its fix is noticed.
OTHER_SURVIVORS: dict[str, str] = {}
SURVIVORS = {f"family.{name}" for name in families.SURVIVORS} | {f"situation.{name}" for name in situations.SITUATION_SURVIVORS} | set(OTHER_SURVIVORS)
#: The check that killed each `local` and `model` mutant (measured 2026-12-02, model.execute_twice 2026-12-02 after its survival;
#: docs/mutation-score.md): tried first, it saves the checks before it (255 s of CI for one).
OTHER_KILLED_BY: dict[str, str] = {
    "model.execute_twice": "core",
    "local.skip_kv_ready_wait": "restart",
    "local.reuse_page_in_flight": "tiers",
    "local.demote_in_use": "tiers",
    "local.no_rollback": "tiers",
    "local.old_epoch_accepted": "restart",
    "model.skip_kv_ready_wait": "tiers",
    "model.reuse_page_in_flight": "restart",
    "model.submit_not_atomic": "tiers",
    "model.corrupt_restore": "tiers",
    "model.old_epoch_accepted": "restart",
    "model.demote_in_use": "tiers",
}
#: The check that killed each mutant in its family's measured table: tried first.
KILLED_BY = (
    {f"faults.{name}": "faults" for name in faults.MUTANTS}
    | {f"family.{name}": check for name, check in families.KILLED_BY.items()}
    | {f"situation.{name}": check for name, check in situations.SITUATION_KILLED_BY.items()}
    | {f"storage.{name}": "storage" for name in storage.MUTANTS}
    | OTHER_KILLED_BY
)
#: Mutants no run of their configuration can tell from the landed runtime (`families.EQUIVALENT`).
EQUIVALENT = {f"family.{name}" for name in families.EQUIVALENT}


def _outcomes(name):
    """Run the checks on mutant `name` until one fails (its known killer first, if any)."""
    first = KILLED_BY.get(name)
    outcomes = []
    for check in sorted(CHECKS, key=lambda check: check != first):
        outcome = run_check(MUTANTS[name].target, check, profile("ci", shrink=False), keep_going=False)
        outcomes.append(outcome)
        if outcome.status == "failed":
            break
    return outcomes


@pytest.mark.parametrize("name", sorted(set(MUTANTS) - SURVIVORS - EQUIVALENT))
def test_mutant_is_killed(name):
    mutant = MUTANTS[name]
    outcomes = _outcomes(name)
    killed = outcomes[-1].status == "failed"
    assert killed, f"{name} ({mutant.invariant}: {mutant.how}) survived every check"
    assert outcomes[-1].violations[0].script.startswith("# Reproduces")


@pytest.mark.slow
def test_known_survivors_survive():
    """One test over every listed survivor (none listed since 2026-12-02), so an empty list runs, not skips."""
    killed = {}
    for name in sorted(SURVIVORS):
        outcomes = _outcomes(name)
        if outcomes[-1].status == "failed":
            killed[name] = f"{MUTANTS[name].how}: killed by the {outcomes[-1].check} check"
    assert not killed, (
        f"now killed: {killed}; remove each from its family's survivors (families.SURVIVORS or situations.SITUATION_SURVIVORS) and add it to KILLED_BY"
    )


def test_survivors_are_listed_mutants_with_reasons():
    assert SURVIVORS | EQUIVALENT <= set(MUTANTS)
    assert all(reason.strip() for reason in [*families.SURVIVORS.values(), *families.EQUIVALENT.values(), *OTHER_SURVIVORS.values()])
    assert set(families.KILLED_BY) | set(families.SURVIVORS) | set(families.EQUIVALENT) == set(families.MUTANTS)
    assert len(families.KILLED_BY) + len(families.SURVIVORS) + len(families.EQUIVALENT) == len(families.MUTANTS)
    assert set(families.KILLED_BY.values()) <= set(CHECKS)
    assert set(OTHER_KILLED_BY) <= set(MUTANTS) - SURVIVORS and set(OTHER_KILLED_BY.values()) <= set(CHECKS)
    situation_names = {name.removeprefix("situation.") for name in MUTANTS if name.startswith("situation.")}
    assert all(reason.strip() for reason in situations.SITUATION_SURVIVORS.values())
    assert set(situations.SITUATION_KILLED_BY) | set(situations.SITUATION_SURVIVORS) == situation_names
    assert not set(situations.SITUATION_KILLED_BY) & set(situations.SITUATION_SURVIVORS)
    assert set(situations.SITUATION_KILLED_BY.values()) <= set(CHECKS)
