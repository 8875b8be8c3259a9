"""The bench section `e2e` on CPU (llama-small): every configuration serves the whole workload,
and each one's prefixes come from where it says (none, L1, L1 and L2); its plots render.
Structure only: CPU timings decide nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_e2e_section_serves_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    command = [sys.executable, "-m", "cacheruntime.cli", "bench", "--repo", str(ROOT), "--device", "cpu", "--quick", "--only", "e2e", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {row["measurement"]: row for row in result["rows"]}
    assert not result["failures"], result["failures"]
    stats = {name: rows[f"{name}: throughput"]["detail"]["stats"] for name in ("l1", "l1+l2", "l1+l2 one-phase")}
    recompute = rows["l1: throughput"]["detail"]["baseline_stats"]
    turns = recompute["turns_served"]
    assert turns == 24 and all(s["turns_served"] == turns and s["generated_tokens"] == recompute["generated_tokens"] for s in stats.values())
    assert recompute["hit_tokens_l1"] == recompute["hit_tokens_l2"] == 0 and recompute["computed_prompt_tokens"] == recompute["prompt_tokens"]
    assert stats["l1"]["hit_tokens_l1"] > 0 and stats["l1"]["hit_tokens_l2"] == 0
    assert all(stats[name]["hit_tokens_l2"] > 0 and stats[name]["restored_pages"] > 0 for name in ("l1+l2", "l1+l2 one-phase"))
    assert {"TTFT L2 hit, 32-token prefix + 8 new", "TTFT L1 hit, 32-token prefix + 8 new"} <= set(rows)
    assert all(row["ratio"] > 0 for row in rows.values())

    from benchmarks.e2eplots import render

    pngs = render(result, tmp_path / "plots")
    assert sorted(path.name for path in pngs) == ["e2e-l1-l2-one-phase.png", "e2e-l1-l2.png", "e2e-l1.png"]
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in pngs)
