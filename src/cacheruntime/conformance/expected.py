"""Expected failures: a team gates on "no new violations" while it works through known ones.

The file is TOML, one table per known violation, named by its signature exactly as the
suite prints it (`ids operation: kind`, see `failure.Signature`):

    [[expected]]
    signature = "contract:submit submit: returns where the model raises NotBackedUp"
    reason = "Demote does not check for a host copy yet (ENG-123)"

A check keeps going past each violation it finds, so every violation is matched on its
own: one that no entry names fails the run, however many known ones the check found
before it. A signature is narrower than an id or an operation (it says how the runtime
disagreed), so a new bug under the same id or in the same operation still fails. An
entry that matched nothing in checks that ran is reported as now passing, so the file
shrinks as the runtime is fixed instead of hiding regressions forever.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs

from cacheruntime.conformance.runner import Outcome, Violation


@attrs.frozen
class Expected:
    """One known violation: its signature, and why it is tolerated."""

    signature: str
    reason: str


def load(path: str | Path) -> tuple[Expected, ...]:
    """Read an expected-failures file; every entry needs a signature and a reason."""
    data = tomllib.loads(Path(path).read_text())
    entries = []
    for i, entry in enumerate(data.get("expected", [])):
        if "id" in entry and "signature" not in entry:
            raise ValueError(
                f"{path}: entry {i} names only an id ({entry['id']!r}), which would hide every new violation under it; "
                "name the violation's signature as the suite prints it (ids operation: kind)"
            )
        if not entry.get("signature") or not entry.get("reason"):
            raise ValueError(f"{path}: entry {i} needs both signature and reason")
        entries.append(Expected(str(entry["signature"]), str(entry["reason"])))
    return tuple(entries)


def expected_by(entries: tuple[Expected, ...], violation: Violation) -> Expected | None:
    """The entry that names a violation, or None for a new one."""
    return next((e for e in entries if e.signature == str(violation.signature)), None)


def new_violations(entries: tuple[Expected, ...], outcome: Outcome) -> list[Violation]:
    """The violations of an outcome that no entry names."""
    return [v for v in outcome.violations if expected_by(entries, v) is None]


def now_passing(entries: tuple[Expected, ...], outcomes: list[Outcome]) -> list[Expected]:
    """Entries no violation matched although checks ran: the runtime may be fixed; remove them."""
    if not any(o.status != "skipped" for o in outcomes):
        return []
    found = {str(v.signature) for o in outcomes for v in o.violations}
    return [e for e in entries if e.signature not in found]
