"""The bench section `process` runs on CPU and says what it claims: one decode step's host time per
topology, a call's round trip, 3 calls per step in 2 messages (B1: the poll after an execute that
leaves nothing in flight is answered without one), and the interference rows with the
control thread really matching (CPU cannot show GPU-host figures, so no value is judged)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_process_section_measures_both_topologies(tmp_path: Path) -> None:
    out = tmp_path / "process.json"
    argv = ["bench", "--repo", str(ROOT), "--device", "cpu", "--quick", "--only", "process", "--process-batches", "1,16", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "cacheruntime.cli", *argv], capture_output=True, text=True, timeout=1800
    )  # a hang guard only: loaded 2-core machines took 300 s
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    rows = {r["measurement"]: r for r in doc["rows"]}
    steps = [r for name, r in rows.items() if name.startswith("host time per decode step")]
    assert [r["detail"]["batch"] for r in steps] == [1, 16]
    assert all((r["detail"]["messages_per_step"], r["detail"]["calls_without_message_per_step"]) == (2, 1) for r in steps)
    assert all(r["detail"]["short_messages_per_step"] == 2 for r in steps)  # the plan again, its completion as tokens
    assert "round trip of one call (poll_completions, nothing in flight)" in rows
    busy = [r for name, r in rows.items() if "control thread matches prefixes" in name]
    assert len(busy) == 2 and all(r["detail"]["prefixes_matched_per_s"] > 0 for r in busy)
    itl = [r for name, r in rows.items() if name.startswith("decode ITL")]  # the real-model rows (a tiny preset on CPU)
    assert [(r["detail"]["batch"], r["measurement"].rsplit(", ", 1)[1]) for r in itl] == [(2, "spin 0 us"), (2, "spin 1000 us")]
    assert all(r["target"] == "ratio <= 1.03" for r in itl)
    assert all(r["detail"]["per_step"] == {"messages": 2, "unsent": 1, "short": 2} for r in itl)
    assert all(set(r["detail"]["control_gc_us"]) == {"local", r["measurement"].split(" runner, ")[1]} for r in itl)
    assert not any(name.startswith("GPU idle") for name in rows)  # CUDA events only: skipped on CPU, said so
    for r in doc["rows"]:
        assert r["section"] == "process" and all(math.isfinite(r[k]) and r[k] > 0 for k in ("value", "baseline", "ratio"))
