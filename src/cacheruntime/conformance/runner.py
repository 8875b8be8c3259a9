"""Run the checks against one runtime and say, per check, passed, failed (with a replayable script) or skipped.

Both the command line and the pytest plugin go through `run_check`, so they give the same
verdicts. A check the runtime's claims do not cover is skipped with the reason; so are
the cross-cutting checks (`CROSS_CUTTING`) that need a claim, which `claims_report` lists.
"""

from __future__ import annotations

import time

import attrs
from hypothesis import settings as Settings
from hypothesis.stateful import run_state_machine_as_test

from cacheruntime.conformance.failure import ConformanceFailure
from cacheruntime.conformance.statemachine import CHECKS, machine_for, reproduction
from cacheruntime.conformance.target import Target
from cacheruntime.protocol import Capability

#: Checks applied inside every machine run when the capability is claimed, and skipped (reported) otherwise.
CROSS_CUTTING = {
    Capability.INTROSPECTION: "invariants (R1-R4, O1-O4, H1-H3, D1, B1) on probe() after every step",
    Capability.TAGGED_COMPUTE: "next_token and copy tags equal the model's (D1)",
    Capability.L2: "tier moves: backup, restore, demote, drop",
    Capability.RESTART: "restart",
    Capability.DELAY_KNOB: "ordering under slow transfers (O1-O3)",
}


@attrs.frozen
class Outcome:
    """The verdict of one check on one runtime."""

    check: str
    status: str  # "passed" | "failed" | "skipped"
    seconds: float
    ids: tuple[str, ...] = ()  # catalogue ids the failure is evidence for
    message: str = ""  # failure message or skip reason
    script: str = ""  # runnable reproduction of a failure
    steps: int = 0  # calls in the shrunk failing sequence


def claims_report(capabilities: frozenset[Capability]) -> list[str]:
    """One line per cross-cutting check: applied, or skipped because the runtime does not claim it."""
    return [
        f"{'applied' if cap in capabilities else 'SKIPPED'}: {what}" + ("" if cap in capabilities else f" (runtime does not claim {cap.name})")
        for cap, what in CROSS_CUTTING.items()
    ]


def _steps(notes: list[str]) -> list[str]:
    """The printed call sequence from Hypothesis's notes: from `state = ...` through `state.teardown()`."""
    start = next((i for i, line in enumerate(notes) if line.startswith("state = ")), None)
    if start is None:
        return []
    end = next((i for i, line in enumerate(notes) if line == "state.teardown()" and i >= start), len(notes) - 1)
    return notes[start : end + 1]


def _conformance_failure(raised: BaseException) -> ConformanceFailure:
    """The ConformanceFailure behind what Hypothesis raised (a flaky failure wraps it); a crash gets id `crash`."""
    if isinstance(raised, ConformanceFailure):
        return raised
    if isinstance(raised, BaseExceptionGroup):
        for inner in raised.exceptions:
            return _conformance_failure(inner)
    return ConformanceFailure(("crash",), f"{type(raised).__name__}: {raised}")


def _flaky_note(raised: BaseException) -> str:
    if isinstance(raised, BaseExceptionGroup) and not isinstance(raised, ConformanceFailure):
        return "\n(flaky: the failure did not recur on replay; the runtime's timing decides it, so the reproduction may need a few runs or a larger delay)"
    return ""


def run_check(target: Target, check: str, settings: Settings) -> Outcome:
    """Run one check; a failure comes back shrunk, with its ids, message and reproduction."""
    started = time.monotonic()
    capabilities = target.new().info().capabilities
    missing = CHECKS[check].needs - capabilities
    if missing:
        reason = f"runtime does not claim {', '.join(sorted(c.name for c in missing))}"
        return Outcome(check, "skipped", 0.0, message=reason)
    machine = machine_for(target, check=check)
    try:
        run_state_machine_as_test(machine, settings=settings)
    except Exception as raised:  # every way a runtime can fail is a verdict
        failure = _conformance_failure(raised)
        steps = _steps(list(getattr(raised, "__notes__", [])))
        count = sum(1 for s in steps if "state." in s and not s.startswith("state = ") and s not in ("state.start()", "state.teardown()"))
        return Outcome(
            check,
            "failed",
            time.monotonic() - started,
            failure.ids,
            str(failure) + _flaky_note(raised),
            reproduction(target, check, steps),
            count,
        )
    return Outcome(check, "passed", time.monotonic() - started)
