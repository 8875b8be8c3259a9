"""`cacheruntime bench --only cpu-sglang`: the decode step against SGLang's own CPU path, quick.

SGLang is importable only in its own environment (`.venv-sglang`, which
`conformance/adapters/sglang/install.sh` builds and CI installs), so the section runs in a
subprocess under that python; without it the test skips. It checks the rows' structure
and that SGLang ran its CPU path (never a timing: the figures belong to the record).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sglangcpu import installed

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"


def _sglang_python() -> str | None:
    if installed():
        return sys.executable
    return str(VENV_PYTHON) if VENV_PYTHON.exists() else None


PYTHON = _sglang_python()


@pytest.mark.skipif(PYTHON is None, reason="no SGLang environment: run conformance/adapters/sglang/install.sh to build .venv-sglang")
def test_cpu_sglang_section_runs_sglangs_cpu_path(tmp_path: Path) -> None:
    assert PYTHON is not None
    out = tmp_path / "bench.json"
    paths = [ROOT / "src", ROOT, ROOT / "conformance" / "adapters" / "sglang" / "stubs"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "cacheruntime.cli",
            "bench",
            "--repo",
            str(ROOT),
            "--device",
            "cpu",
            "--quick",
            "--only",
            "cpu-sglang",
            "--cpu-batches",
            "1,16",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and "skipped" not in doc["meta"]
    rows = doc["rows"]
    assert {r["section"] for r in rows} == {"cpu-sglang"}
    kinds = ("vs SGLang's CPU path", "vs in-process", "vs SGLang's alloc_for_decode", "vs SGLang's CPU path, boundary on simulated streams")
    assert sorted((r["detail"]["batch"], r["measurement"].split(" ", 5)[-1]) for r in rows) == sorted((b, k) for b in (1, 16) for k in kinds)
    for r in rows:
        for key in ("value", "baseline", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["measurement"], key, r[key])
        detail = r["detail"]
        assert set(detail["median_block_us"]) == {"boundary", "boundary_simulated_streams", "in_process", "sglang_cpu_path", "sglang_alloc_for_decode"}
        assert detail["sglang_triton"] is False
        assert detail["sglang_source"]["alloc_decode_naive (the body that runs on CPU)"].startswith("sglang/srt/mem_cache/allocator/paged.py:")
        assert (r["met"] is None) == r["measurement"].endswith(("alloc_for_decode", "simulated streams"))
