"""TTFT and ITL plots of an `e2e` run, one PNG per configuration, from its JSON.

Each PNG has two panels: the distribution (CDF) of TTFT per turn index and of ITL over
every gap, each beside recompute's (dashed), from the samples the section keeps in its
throughput rows. Usage: `python -m benchmarks.e2eplots RUN.json OUT_DIR` (needs matplotlib:
`pip install -e '.[plots]'`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def render(run: dict[str, Any], directory: Path) -> list[Path]:
    """Write `<configuration>.png` per configuration of the run into `directory`; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    rows = {row["measurement"]: row for row in run["rows"] if row["section"] == "e2e"}
    written = []
    for measurement, row in rows.items():
        if not measurement.endswith(": throughput"):
            continue
        name = measurement.removesuffix(": throughput")
        samples, base = row["detail"]["samples"], row["detail"]["baseline_samples"]
        figure, (ttft_axis, itl_axis) = plt.subplots(1, 2, figsize=(11, 4))
        for turn, values in samples["ttft_ms"].items():
            (line,) = ttft_axis.plot(*_cdf(values), label=f"turn {turn}")
            ttft_axis.plot(*_cdf(base["ttft_ms"].get(turn, [])), linestyle="--", color=line.get_color(), alpha=0.6)
        ttft_axis.set(xscale="log", xlabel="TTFT (ms)", ylabel="share of turns", title=f"{name}: TTFT (dashed: recompute)")
        ttft_axis.legend()
        itl_axis.plot(*_cdf(samples["itl_ms"]), label=name)
        itl_axis.plot(*_cdf(base["itl_ms"]), linestyle="--", label="recompute")
        itl_axis.set(xscale="log", xlabel="ITL (ms)", ylabel="share of gaps", title=f"{name}: ITL")
        itl_axis.legend()
        figure.suptitle(f"{run['meta']['device_name']}, {run['meta']['date']}")
        figure.tight_layout()
        path = directory / f"e2e-{name.replace('+', '-').replace(' ', '-')}.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.e2eplots RUN.json OUT_DIR", file=sys.stderr)
        return 2
    try:
        run = json.loads(Path(argv[0]).read_text())
    except (OSError, ValueError) as error:
        print(f"e2eplots: cannot read {argv[0]}: {error}", file=sys.stderr)
        return 2
    for path in render(run, Path(argv[1])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
