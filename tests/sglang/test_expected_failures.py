"""The adapter's expected-failures file gates exactly: today's SGLang passes with it, and
dropping an entry that a run matched makes the same run fail.

Runs `cacheruntime conformance` in a subprocess (the gate's `--no-shrink` path, ~20 s a
run) under the SGLang venv's python; skips elsewhere (test_venv.py re-runs this folder
under the venv when it exists).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
from _sglang_env import ADAPTER_DIR, HAVE_SGLANG, REPO, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.needs_sglang

FACTORY = "conformance.adapters.sglang.adapter:make_runtime"
EXPECTED = ADAPTER_DIR / "expected-failures.toml"


def _conformance(expected, *extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(ADAPTER_DIR / "stubs")]))
    proc = subprocess.run(
        [sys.executable, "-m", "cacheruntime.cli", "conformance", "--runtime", FACTORY, "--expected", str(expected), "--no-shrink", *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _without(entry_id: str, path) -> str:
    """The TOML text of EXPECTED minus the [[expected]] entry whose id is entry_id."""
    entries = tomllib.loads(EXPECTED.read_text())["expected"]
    kept = [e for e in entries if e["id"] != entry_id]
    assert len(kept) == len(entries) - 1, entry_id
    path.write_text("".join(f"[[expected]]\nid = {json.dumps(e['id'])}\nreason = {json.dumps(e['reason'])}\n\n" for e in kept))
    return path


def test_expected_file_passes_today_and_each_matched_entry_is_needed(tmp_path):
    code, out = _conformance(EXPECTED)
    assert code == 0, out[-6000:]
    matched = re.findall(r"^(\w+)\s+XFAIL\s.*?\[([^\]]*)\]", out, flags=re.M)
    assert matched, out[-6000:]  # at least one check fails as expected on today's SGLang
    ids = {e["id"] for e in tomllib.loads(EXPECTED.read_text())["expected"]}
    for check, failure_ids in matched:
        entry = next(i for i in failure_ids.split(", ") if i in ids)
        code, out = _conformance(_without(entry, tmp_path / f"without-{check}.toml"), "--check", check)
        assert code == 1, f"dropping {entry!r} should fail check {check}:\n{out[-6000:]}"
        assert f"{check:10} FAILED" in out, out[-6000:]
