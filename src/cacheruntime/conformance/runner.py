"""Run the checks against one runtime and say, per check, passed, failed (every violation, each replayable) or skipped.

Both the command line and the pytest plugin go through `run_check`, so they give the same
verdicts. A check the runtime's claims do not cover is skipped with the reason; so are
the cross-cutting checks (`CROSS_CUTTING`) that need a claim, which `claims_report` lists.

A check keeps going past what it found: after a violation it runs again with that
violation's signature set aside (`RuntimeConformance.set_aside`), until it passes or
finds nothing new, at most `MAX_VIOLATIONS` times. So a known failure never hides a new
one, and an expected-failures file can name each violation on its own.
"""

from __future__ import annotations

import time
import zlib

import attrs
from hypothesis import seed
from hypothesis import settings as Settings
from hypothesis.stateful import run_state_machine_as_test

from cacheruntime.conformance.draws import independent_of_loaded_modules
from cacheruntime.conformance.failure import ConformanceFailure, Signature, readable
from cacheruntime.conformance.statemachine import CHECKS, machine_for, reproduction
from cacheruntime.conformance.target import Target
from cacheruntime.protocol import Capability

#: Checks applied inside every machine run when the capability is claimed, and skipped (reported) otherwise.
CROSS_CUTTING = {
    Capability.INTROSPECTION: "invariants (R1-R4, O1-O4, H1-H3, D1, F1, F2, B1) on probe() after every step",
    Capability.TAGGED_COMPUTE: "next_token and copy tags equal the model's (D1)",
    Capability.L2: "tier moves: backup, restore, demote, drop",
    Capability.RESTART: "restart",
    Capability.DELAY_KNOB: "ordering under slow transfers (O1-O3)",
    Capability.SCHEDULE_SEED: "interleavings drawn per case (set_schedule_seed), the same on every machine",
    Capability.FAULT_INJECTION: "faults injected (inject_fault): failed copies, failed compute, a dead worker (the faults check)",
    Capability.L3: "L3 with the suite's store (l3=): persist, fetch, l3_exists, objects removed, store reads and writes failed, store writes held, S1-S3 (the storage check)",
}


#: Violations one check reports at most (each costs a run of the check).
MAX_VIOLATIONS = 32


@attrs.frozen
class Violation:
    """One distinct violation a check found: its signature, message, what was sent, and runnable reproduction.

    `script` replays the failing case at the level of the suite's rules; `calls` are the
    boundary calls those rules sent the runtime, with what each returned or raised, and
    `diff` the fields where the runtime's value differed from the model's.
    """

    signature: Signature
    message: str
    script: str  # runnable reproduction
    steps: int  # calls in the (shrunk, unless the run did not shrink) failing sequence
    calls: str = ""  # the boundary calls sent, one a line (cacheruntime.recording.format_calls)
    diff: str = ""  # the differing fields, runtime against model, one a line (failure.format_diff)


@attrs.frozen
class Outcome:
    """The verdict of one check on one runtime: every violation it found, in the order found."""

    check: str
    status: str  # "passed" | "failed" | "skipped"
    seconds: float
    violations: tuple[Violation, ...] = ()
    reason: str = ""  # why a check was skipped

    @property
    def ids(self) -> tuple[str, ...]:
        """The catalogue ids the violations are evidence for, first found first."""
        return tuple(dict.fromkeys(i for v in self.violations for i in v.signature.ids))

    @property
    def message(self) -> str:
        """The skip reason, or every violation's message."""
        return self.reason or "\n".join(v.message for v in self.violations)


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
    return ConformanceFailure(("crash",), f"{type(raised).__name__}: {raised}", "suite", f"crashes with {type(raised).__name__}")


def _flaky_note(raised: BaseException) -> str:
    if isinstance(raised, BaseExceptionGroup) and not isinstance(raised, ConformanceFailure):
        return "\n(flaky: the failure did not recur on replay; the runtime's timing decides it, so the reproduction may need a few runs or a larger delay)"
    return ""


def check_seed(check: str) -> int:
    """The fixed seed of a check's derandomized (ci) draws: its own per check, and independent of the
    suite's source. Hypothesis would otherwise seed a state machine from a digest of its harness's
    source, so that any edit of the harness (a docstring, a new check's code) drew every check's
    sequences anew, and the measured reach, survivors and expected failures with them."""
    return zlib.crc32(f"cacheruntime conformance {check}".encode())


def run_check(target: Target, check: str, settings: Settings, keep_going: bool = True) -> Outcome:
    """Run one check; every violation found comes back with its signature, message and reproduction.

    `keep_going=False` stops at the first violation (a mutant's kill needs only one).
    """
    started = time.monotonic()
    capabilities = target.new().info().capabilities
    missing = CHECKS[check].needs - capabilities
    if missing:
        reason = f"runtime does not claim {', '.join(sorted(c.name for c in missing))}"
        return Outcome(check, "skipped", 0.0, reason=reason)
    violations: list[Violation] = []
    while len(violations) < (MAX_VIOLATIONS if keep_going else 1):
        found = _run_once(target, check, settings, frozenset(str(v.signature) for v in violations))
        if found is None or any(v.signature == found.signature for v in violations):
            break  # passed with what is set aside, or found nothing new
        violations.append(found)
    return Outcome(check, "failed" if violations else "passed", time.monotonic() - started, tuple(violations))


def describe(violation: Violation, shrunk: bool = True) -> str:
    """A violation as the command line and pytest print it: signature, message, calls sent, diff, reproduction.

    The reproduction comes last, under its header, so it can be cut out and run as it is.
    """
    how = "shrunk" if shrunk else "unshrunk"
    shown = readable(violation.calls, violation.diff)
    parts = [f"signature: {violation.signature}\n{violation.message}", *([shown] if shown else [])]
    parts.append(f"# ---- {how} reproduction ({violation.steps} calls) ----\n{violation.script}")
    return "\n\n".join(parts)


def _run_once(target: Target, check: str, settings: Settings, set_aside: frozenset[str]) -> Violation | None:
    """One run of the check's machine with `set_aside` violations tolerated: the first other one, or None."""
    machine = machine_for(target, check=check)
    machine.set_aside = set_aside
    if settings.derandomize:
        seed(check_seed(check))(machine)
    try:
        with independent_of_loaded_modules():
            run_state_machine_as_test(machine, settings=settings)
    except Exception as raised:  # every way a runtime can fail is a verdict
        failure = _conformance_failure(raised)
        steps = _steps(list(getattr(raised, "__notes__", [])))
        count = sum(1 for s in steps if "state." in s and not s.startswith("state = ") and s not in ("state.start()", "state.teardown()"))
        script = reproduction(target, check, steps, set_aside)
        return Violation(failure.signature, str(failure) + _flaky_note(raised), script, count, failure.calls, failure.diff)
    return None
