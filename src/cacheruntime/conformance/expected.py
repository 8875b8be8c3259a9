"""Expected failures: a team gates on "no new failures" while it works through known ones.

The file is TOML, one table per known failure:

    [[expected]]
    id = "ordering"             # a check name, or a catalogue id a failure carries (R4, D1, contract:submit)
    reason = "D2H is not ordered after compute yet (ENG-123)"

A failure is expected when an entry names its check or one of its ids. An entry that
matched nothing in checks that ran is reported as now passing, so the file shrinks as the
runtime is fixed instead of hiding regressions forever.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs

from cacheruntime.conformance.runner import Outcome


@attrs.frozen
class Expected:
    """One known failure: what it is named by, and why it is tolerated."""

    id: str
    reason: str


def load(path: str | Path) -> tuple[Expected, ...]:
    """Read an expected-failures file; every entry needs an id and a reason."""
    data = tomllib.loads(Path(path).read_text())
    entries = []
    for i, entry in enumerate(data.get("expected", [])):
        if not entry.get("id") or not entry.get("reason"):
            raise ValueError(f"{path}: entry {i} needs both id and reason")
        entries.append(Expected(str(entry["id"]), str(entry["reason"])))
    return tuple(entries)


def matches(entry: Expected, outcome: Outcome) -> bool:
    """Whether the entry covers this failed outcome."""
    return outcome.status == "failed" and (entry.id == outcome.check or entry.id in outcome.ids)


def expected_by(entries: tuple[Expected, ...], outcome: Outcome) -> Expected | None:
    """The first entry that covers a failure, or None for a new failure."""
    return next((e for e in entries if matches(e, outcome)), None)


def now_passing(entries: tuple[Expected, ...], outcomes: list[Outcome]) -> list[Expected]:
    """Entries no failure matched although checks ran: the runtime may be fixed; remove them."""
    if not any(o.status != "skipped" for o in outcomes):
        return []
    return [e for e in entries if not any(matches(e, o) for o in outcomes)]
