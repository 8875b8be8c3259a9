"""`cacheruntime conformance` on the real runtime, the expected-failures gate, and a runnable reproduction."""

import subprocess
import sys

from cacheruntime.cli import main

LOCAL = "cacheruntime.runtime.factories:conformance"
MUTANT = "cacheruntime.conformance.mutants:build"


def test_local_runtime_conforms_in_ci_profile(tmp_path, capsys):
    assert main(["conformance", "--runtime", LOCAL, "--junitxml", str(tmp_path / "j.xml")]) == 0
    out = capsys.readouterr().out
    assert "OK: 0 new failure(s)" in out
    assert 'failures="0"' in (tmp_path / "j.xml").read_text()


def test_failure_prints_a_runnable_reproduction_and_exits_1(tmp_path, capsys):
    argv = ["conformance", "--runtime", MUTANT, "--option", "name=local.no_generation_bump_on_close", "--check", "core"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "[H2]" in out
    script = out[out.index("# Reproduces") : out.index("FAILED: 1 new failure")]
    (tmp_path / "repro.py").write_text(script)
    run = subprocess.run([sys.executable, str(tmp_path / "repro.py")], capture_output=True, text=True)
    assert run.returncode != 0 and "ConformanceFailure: [H2]" in run.stderr


def test_expected_failure_gates_and_stale_entry_is_reported(tmp_path, capsys):
    expected = tmp_path / "expected.toml"
    expected.write_text('[[expected]]\nid = "O4"\nreason = "known"\n\n[[expected]]\nid = "R4"\nreason = "fixed long ago"\n')
    argv = ["conformance", "--runtime", MUTANT, "--option", "name=model.execute_twice", "--check", "core", "--no-shrink", "--expected", str(expected)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "XFAIL" in out and "XPASS: expected failure 'R4'" in out
