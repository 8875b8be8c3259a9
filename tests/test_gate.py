"""`cacheruntime check` runs its stages, reports each, and fails when one fails."""

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from cacheruntime import gate
from cacheruntime.conformance import cli as conformance_cli

ROOT = Path(__file__).resolve().parents[1]
MUTANT = "cacheruntime.conformance.mutants:build"


def _check(*argv, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "cacheruntime.cli", "check", *argv], cwd=cwd, capture_output=True, text=True)


def _cases(junit):
    """(name, outcome) per test case of a JUnit file: outcome is failure, skipped or passed."""
    suite = ET.parse(junit).getroot()
    outcome = lambda case: next((tag for tag in ("failure", "skipped") if case.find(tag) is not None), "passed")  # noqa: E731
    return suite, [(case.get("name"), outcome(case)) for case in suite.iter("testcase")]


def test_gate_passes_and_writes_junit(tmp_path):
    junit = tmp_path / "gate.xml"
    proc = _check("--skip", "tlc", "--skip", "runtime-traces", "--skip", "z3", "--skip", "conformance", "--junitxml", str(junit))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate: passed" in proc.stdout
    suite, cases = _cases(junit)
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("5", "0", "4")
    assert cases == [("traceability", "passed"), ("tlc", "skipped"), ("runtime-traces", "skipped"), ("z3", "skipped"), ("conformance", "skipped")]


def test_gate_fails_when_a_stage_fails(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "invariants.md").write_text("| id | spec | TLA+ | model | conformance | Z3 |\n")
    (tmp_path / "spec" / "protocol.md").write_text("")
    junit = tmp_path / "gate.xml"
    proc = _check("--skip", "tlc", "--skip", "runtime-traces", "--skip", "z3", "--skip", "conformance", "--junitxml", str(junit), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gate: FAILED: traceability" in proc.stdout
    assert ET.parse(junit).getroot().get("failures") == "1"


def test_cli_lists_every_subcommand():
    proc = subprocess.run([sys.executable, "-m", "cacheruntime.cli", "--help"], capture_output=True, text=True)
    for command in ("run", "conformance", "tlc", "z3", "bench", "check"):
        assert command in proc.stdout


#: The models the end-to-end gate's TLC stages check: one that passes and steps every action,
#: one mutant that must fail, and the two trace checks. tests/tla/test_tlc.py checks every model
#: of the manifest; here the stages' wiring is what is tested, so the rest would only run twice.
GATE_MODELS = ("every-action", "mutant-no-kv-ready-wait", "trace-check", "runtime-traces")


def _checkout_with_models(folder: Path, names: tuple[str, ...]) -> Path:
    """A copy of this checkout's spec files whose TLC manifest keeps only the models `names`."""
    for part in ("spec", "tla"):
        shutil.copytree(ROOT / part, folder / part)
    manifest = folder / "tla" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["models"] = [m for m in data["models"] if m["name"] in names]
    assert [m["name"] for m in data["models"]] == [
        n for n in (m["name"] for m in json.loads((ROOT / "tla" / "manifest.json").read_text())["models"]) if n in names
    ]
    manifest.write_text(json.dumps(data, indent=1))
    return folder


def test_gate_end_to_end_on_the_local_runtime(tmp_path):
    """Every stage for real: traceability, TLC, runtime traces, Z3 proofs (at their default bounds,
    with their mutants), conformance on LocalGPURuntime.

    TLC checks a manifest cut to `GATE_MODELS` (a checkout given with `--repo`): every model is
    checked by the tests in tests/tla/. The conformance stage runs 5 cases per check: the full CI
    profile's verdict and reach on this runtime are asserted by tests/conformance/test_coverage.py.
    """
    junit = tmp_path / "gate.xml"
    repo = _checkout_with_models(tmp_path / "checkout", GATE_MODELS)
    proc = _check("--junitxml", str(junit), "--max-examples", "5", "--repo", str(repo))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    names = [case.get("name") for case in ET.parse(junit).getroot().iter("testcase")]
    assert names == ["traceability", "tlc", "runtime-traces", "z3", "core", "tiers", "restart", "ordering", "faults", "storage"]  # one per conformance check
    assert "gate: passed" in proc.stdout


def _gate_args(*argv):
    parser = argparse.ArgumentParser()
    gate.add_arguments(parser)
    return parser.parse_args(argv)


def test_gate_runs_conformance_without_shrinking_unless_asked():
    """Hypothesis's shrink phase stops at a wall-clock limit, so a loaded machine could shrink less: the gate leaves it out."""
    (conformance,) = [s for s in gate.stages(_gate_args()) if s.name == "conformance"]
    assert "--no-shrink" in conformance.argv
    (conformance,) = [s for s in gate.stages(_gate_args("--shrink")) if s.name == "conformance"]
    assert "--no-shrink" not in conformance.argv


def test_gate_prints_the_command_that_shrinks_a_failure(tmp_path):
    junit = tmp_path / "gate.xml"
    only = ("--skip", "traceability", "--skip", "tlc", "--skip", "runtime-traces", "--skip", "z3", "--check", "core")
    proc = _check(*only, "--runtime", MUTANT, "--option", "name=model.execute_out_of_order", "--junitxml", str(junit))
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# ---- unshrunk reproduction" in proc.stdout and "# ---- shrunk reproduction" not in proc.stdout
    assert "# ---- boundary calls sent to the runtime" in proc.stdout
    suite, cases = _cases(junit)
    assert cases == [("traceability", "skipped"), ("tlc", "skipped"), ("runtime-traces", "skipped"), ("z3", "skipped"), ("core", "failure")]
    (failure,) = suite.iter("failure")
    assert failure.get("message").startswith("O4 execute_batch:") and "# ---- boundary calls sent" in failure.text
    summary = proc.stdout[proc.stdout.index("to shrink each locally:") :].splitlines()[1:]
    commands = [line.strip() for line in summary if line.startswith("  cacheruntime conformance")]
    assert f"cacheruntime conformance --runtime {MUTANT} --option name=model.execute_out_of_order --profile ci --check core" in commands
    parser = argparse.ArgumentParser()
    conformance_cli.add_arguments(parser)
    for command in commands:  # each reruns one check of the same runtime, shrinking
        args = parser.parse_args(shlex.split(command)[2:])
        assert args.runtime == MUTANT and args.option == ["name=model.execute_out_of_order"] and not args.no_shrink and len(args.check) == 1


def test_gate_passes_conformance_options_by_the_suites_names(tmp_path):
    """`check` takes the suite's option names and runs just the checks named; its JUnit has one case per check."""
    junit = tmp_path / "gate.xml"
    expected = tmp_path / "expected.toml"
    expected.write_text("")
    only = ("--skip", "traceability", "--skip", "tlc", "--skip", "runtime-traces", "--skip", "z3")
    proc = _check(*only, "--check", "core", "--check", "tiers", "--max-examples", "2", "--profile", "ci", "--expected", str(expected), "--junitxml", str(junit))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("== conformance:")]
    argv = shlex.split(line.partition(": ")[2])[2:]  # after `cacheruntime conformance`
    parser = argparse.ArgumentParser()
    conformance_cli.add_arguments(parser)
    args = parser.parse_args(argv)  # what the stage ran parses as `cacheruntime conformance` options
    assert (args.check, args.max_examples, args.profile, str(args.expected)) == (["core", "tiers"], 2, "ci", str(expected))
    _, cases = _cases(junit)
    assert cases == [("traceability", "skipped"), ("tlc", "skipped"), ("runtime-traces", "skipped"), ("z3", "skipped"), ("core", "passed"), ("tiers", "passed")]


def test_bad_option_values_are_one_line_errors():
    for argv, says in (
        (("--profile", "fast"), "argument --profile: invalid choice: 'fast'"),
        (("--max-examples", "0"), "argument --max-examples: expected a positive integer, got 0"),
        (("--check", "everything"), "argument --check: unknown check 'everything': choose from core"),
        (("--skip", "conformance", "--check", "core"), "--skip conformance leaves out"),
        (("--expected", "no-such-file.toml"), "argument --expected: no file 'no-such-file.toml'"),
    ):
        proc = _check(*argv)
        assert proc.returncode == 2 and proc.stdout == "", (argv, proc.stdout, proc.stderr)
        (line,) = [line for line in proc.stderr.splitlines() if "Warning" not in line and "_conversion_method_template" not in line]
        assert line.startswith("cacheruntime check: error: ") and says in line, (argv, proc.stderr)
