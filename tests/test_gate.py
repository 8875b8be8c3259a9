"""`cacheruntime check` runs its stages, reports each, and fails when one fails."""

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _check(*argv, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "cacheruntime.cli", "check", *argv], cwd=cwd, capture_output=True, text=True)


def test_gate_passes_and_writes_junit(tmp_path):
    junit = tmp_path / "gate.xml"
    proc = _check("--skip", "tlc", "--skip", "z3", "--skip", "conformance", "--junitxml", str(junit))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate: passed" in proc.stdout
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    assert [case.get("name") for case in suite.iter("testcase")] == ["traceability"]


def test_gate_fails_when_a_stage_fails(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "invariants.md").write_text("| id | spec | TLA+ | model | conformance | Z3 |\n")
    (tmp_path / "spec" / "protocol.md").write_text("")
    junit = tmp_path / "gate.xml"
    proc = _check("--skip", "tlc", "--skip", "z3", "--skip", "conformance", "--junitxml", str(junit), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gate: FAILED: traceability" in proc.stdout
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_cli_lists_every_subcommand():
    proc = subprocess.run([sys.executable, "-m", "cacheruntime.cli", "--help"], capture_output=True, text=True)
    for command in ("run", "conformance", "tlc", "z3", "bench", "check"):
        assert command in proc.stdout


def test_gate_end_to_end_on_the_local_runtime(tmp_path):
    """Every stage for real: traceability, TLC on the manifest, Z3 proofs, conformance on LocalGPURuntime."""
    junit = tmp_path / "gate.xml"
    proc = _check("--no-shrink", "--junitxml", str(junit))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    names = [case.get("name") for case in ET.parse(junit).getroot().iter("testcase")]
    assert names == ["traceability", "tlc", "z3", "conformance"]
    assert "gate: passed" in proc.stdout
