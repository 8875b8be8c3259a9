"""`cacheruntime conformance` on the real runtime, the expected-failures gate, and a runnable reproduction."""

import re
import subprocess
import sys

import pytest

from cacheruntime.cli import main
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.local import LocalGPURuntime

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
    argv = ["conformance", "--runtime", MUTANT, "--option", "name=model.execute_out_of_order", "--check", "core", "--no-shrink"]
    assert main(argv) == 1
    found = re.findall(r"^  NEW\s+(.*)$", capsys.readouterr().out, flags=re.M)
    assert found and all(signature.startswith("O4 execute_batch: ") for signature in found)
    expected = tmp_path / "expected.toml"
    entries = [*found, "R4 release: breaks R4"]
    expected.write_text("".join(f'[[expected]]\nsignature = "{s}"\nreason = "known"\n\n' for s in entries))
    assert main([*argv, "--expected", str(expected)]) == 0
    out = capsys.readouterr().out
    assert "XFAIL" in out and "XPASS: expected violation 'R4 release: breaks R4'" in out


class RetainBeforeCheck(Ledger):
    """A ledger whose `retain_extent` counts the reference before checking its argument, unjournaled."""

    def retain_extent(self, extent):
        record = self.state.extents.get(getattr(extent, "generation", None))
        if record is not None:
            record.refcount += 1
        super().retain_extent(extent)


def retain_before_check(**options):
    """Factory of the bad-input test: the conformance runtime with `RetainBeforeCheck`."""
    return LocalGPURuntime(**{**CONFORMANCE_OPTIONS, **options}, ledger_class=RetainBeforeCheck)


def test_bad_input_fuzz_passes_the_runtime_and_fails_a_ledger_that_changes_state_on_error(capsys):
    argv = ["conformance", "--runtime", "cacheruntime.runtime.factories:conformance", "--check", "core", "--max-examples", "2", "--bad-input", "60"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^bad-input  passed  seed 0: .*: 60 bad calls; 0 untyped errors, 0 state changes on error", out, flags=re.M), out
    argv = ["conformance", "--runtime", "test_cli:retain_before_check", "--check", "core", "--max-examples", "2", "--bad-input", "200", "--seed", "3"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "bad-input  FAILED  seed 3: " in out and re.search(r"^  changed\s+retain\(", out, flags=re.M), out


def test_bad_input_count_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["conformance", "--runtime", "cacheruntime.runtime.factories:conformance", "--bad-input", "0"])
    assert exit_.value.code == 2 and "expected a positive integer, got 0" in capsys.readouterr().err
