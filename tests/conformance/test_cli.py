"""`cacheruntime conformance` on the real runtime, the expected-failures gate, and a runnable reproduction."""

import re
import subprocess
import sys

from cacheruntime.cli import main

MUTANT = "cacheruntime.conformance.mutants:build"


def test_failure_prints_a_runnable_reproduction_and_exits_1(tmp_path, capsys):
    argv = ["conformance", "--runtime", MUTANT, "--option", "name=local.no_generation_bump_on_close", "--check", "core", "--no-shrink"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "[H2]" in out
    first = out[out.index("# Reproduces") :]
    script = first[: min(first.index(end) for end in ("\nsignature: ", "\nFailures above", "\nFAILED: ") if end in first)]
    (tmp_path / "repro.py").write_text(script)
    run = subprocess.run([sys.executable, str(tmp_path / "repro.py")], capture_output=True, text=True)
    assert run.returncode != 0 and "ConformanceFailure: [H2]" in run.stderr


def test_expected_failure_gates_and_stale_entry_is_reported(tmp_path, capsys):
    argv = ["conformance", "--runtime", MUTANT, "--option", "name=model.execute_twice", "--check", "core", "--no-shrink"]
    assert main(argv) == 1
    found = re.findall(r"^  NEW\s+(.*)$", capsys.readouterr().out, flags=re.M)
    assert found and all(signature.startswith("O4 execute_batch: ") for signature in found)
    expected = tmp_path / "expected.toml"
    entries = [*found, "R4 release: breaks R4"]
    expected.write_text("".join(f'[[expected]]\nsignature = "{s}"\nreason = "known"\n\n' for s in entries))
    assert main([*argv, "--expected", str(expected)]) == 0
    out = capsys.readouterr().out
    assert "XFAIL" in out and "XPASS: expected violation 'R4 release: breaks R4'" in out
