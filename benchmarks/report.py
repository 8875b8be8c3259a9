"""Result rows, the printed table and the JSON file."""

from __future__ import annotations

import json
import math
import operator
from dataclasses import asdict, dataclass, field
from typing import Any

#: target kinds: which number the target applies to and how
_COMPARE = {">=": operator.ge, "<=": operator.le}


@dataclass
class Row:
    """One measurement beside its baseline, measured in the same run.

    `ratio` is value / baseline. `target` applies to `target_on` ("ratio" or "value")
    with `target_op` (">=" or "<=") against `target_value`; `met` is None without a target.
    """

    section: str
    measurement: str
    unit: str
    value: float
    baseline: float
    baseline_name: str
    target_on: str | None = None
    target_op: str | None = None
    target_value: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    ratio: float = field(init=False)
    met: bool | None = field(init=False)

    def __post_init__(self) -> None:
        self.ratio = self.value / self.baseline if self.baseline else math.inf
        if self.target_on is None:
            self.met = None
        else:
            subject = self.ratio if self.target_on == "ratio" else self.value
            self.met = bool(_COMPARE[self.target_op](subject, self.target_value))

    @property
    def target(self) -> str:
        return "" if self.target_on is None else f"{self.target_on} {self.target_op} {self.target_value:g}"


@dataclass
class Failure:
    """A measurement that raised: recorded, and the bench goes on with the next."""

    section: str
    measurement: str
    error: str


def _num(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 0.01:
        return f"{x:.3f}"
    return f"{x:.2e}"


def table(rows: list[Row], failures: list[Failure]) -> str:
    """The table: measurement, value, baseline, ratio, target, met."""
    header = ("measurement", "value", "baseline", "ratio", "target", "met")
    lines = [header]
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        lines.append((f"{r.measurement}", f"{_num(r.value)} {r.unit}", f"{_num(r.baseline)} {r.unit} ({r.baseline_name})", _num(r.ratio), r.target, met))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append(" | ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
        if n == 0:
            out.append("-+-".join("-" * w for w in widths))
    for f in failures:
        out.append(f"FAILED {f.section}: {f.measurement}: {f.error}")
    return "\n".join(out)


def markdown(rows: list[Row]) -> str:
    """The same table in Markdown, for docs/benchmarks.md."""
    out = ["| measurement | value | baseline | ratio | target | met |", "|---|---|---|---|---|---|"]
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "**no**")
        out.append(f"| {r.measurement} | {_num(r.value)} {r.unit} | {_num(r.baseline)} {r.unit} ({r.baseline_name}) | {_num(r.ratio)} | {r.target} | {met} |")
    return "\n".join(out)


def write_json(path: str, meta: dict[str, Any], rows: list[Row], failures: list[Failure]) -> None:
    doc = {
        "meta": meta,
        "rows": [dict(asdict(r), target=r.target) for r in rows],
        "failures": [asdict(f) for f in failures],
    }
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
        fh.write("\n")
