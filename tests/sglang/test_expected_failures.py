"""The adapter's expected-failures file gates exactly: today's SGLang passes with it, and
dropping an entry that a run matched makes the same run fail, naming that violation.

Runs `cacheruntime conformance` in a subprocess (the gate's `--no-shrink` path; each check
keeps going past every known violation, about a minute a check on 2 cores) under the
SGLang venv's python; skips elsewhere (test_venv.py re-runs this folder under the venv
when it exists).
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
    # src first, as scripts/gate_sglang.sh: this checkout's suite, not the one the venv's editable install names
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), str(ADAPTER_DIR / "stubs")]))
    proc = subprocess.run(
        [sys.executable, "-m", "cacheruntime.cli", "conformance", "--runtime", FACTORY, "--expected", str(expected), "--no-shrink", *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _without(signature: str, path) -> str:
    """The TOML text of EXPECTED minus the [[expected]] entry naming `signature`."""
    entries = tomllib.loads(EXPECTED.read_text())["expected"]
    kept = [e for e in entries if e["signature"] != signature]
    assert len(kept) == len(entries) - 1, signature
    path.write_text("".join(f"[[expected]]\nsignature = {json.dumps(e['signature'])}\nreason = {json.dumps(e['reason'])}\n\n" for e in kept))
    return path


def test_expected_file_passes_today_and_a_dropped_entry_fails_the_gate(tmp_path):
    code, out = _conformance(EXPECTED)
    assert code == 0, out[-6000:]
    core = out[out.index("\ncore ") : out.index("\ntiers ")]
    matched = re.findall(r"^  expected\s+(.+?)  \(", core, flags=re.M)
    assert matched, out[-6000:]  # today's SGLang has known violations, each named by an entry
    dropped = matched[-1]  # the last one core found: the check went past every other to reach it
    code, out = _conformance(_without(dropped, tmp_path / "without.toml"), "--check", "core")
    assert code == 1, f"dropping {dropped!r} should fail the gate:\n{out[-6000:]}"
    assert re.search(rf"^  NEW\s+{re.escape(dropped)}$", out, flags=re.M), out[-6000:]
