"""`cacheruntime conformance`: hold a runtime to the reference model from the command line.

    cacheruntime conformance --runtime MODULE:FACTORY [--option key=value ...]
        [--profile ci|deep] [--check NAME ...] [--expected FILE] [--junitxml PATH]
    cacheruntime conformance --mutants      # kill table of the suite's own mutants
    cacheruntime conformance --legal        # table of the legal variants, which must all pass
    cacheruntime conformance --runtime ... --coverage   # also the named situations reached, per check
    cacheruntime conformance --runtime ... --bad-input N [--seed S]   # also N ill-typed calls

Exit 0 when every check that ran passed or failed as expected; 1 on a new failure.
A failure prints the ids it is evidence for and a runnable Python reproduction; with
`--no-shrink` (the gate's default) also the command that shrinks it locally.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

from cacheruntime.cliargs import factory, input_file, output_file, positive_int
from cacheruntime.conformance import expected as expected_file
from cacheruntime.conformance.profiles import DEFAULT_DATABASE, profile
from cacheruntime.conformance.runner import Outcome, claims_report, describe, run_check
from cacheruntime.conformance.statemachine import CHECKS
from cacheruntime.conformance.target import Target

#: Bad-input violations printed in full (the count is always printed).
SHOWN_BAD_INPUT = 10


def run_bad_input(args: argparse.Namespace) -> int:
    """The bad-input fuzz on the target's runtimes: 1 when any call failed untyped or changed state on error.

    It is not a state-machine check: each example is a fresh runtime brought to a
    reference state and one corrupted call, so a failure is one call long and the seed
    reproduces the whole run.
    """
    from cacheruntime.conformance import badinput

    target = Target.parse(args.runtime, args.option)
    report = badinput.run(target.new, args.bad_input, args.seed, name=str(target))
    verdict = "FAILED" if report.violations else "passed"
    print(f"\nbad-input  {verdict}  seed {args.seed}: {report.summary()}")
    for violation in report.violations[:SHOWN_BAD_INPUT]:
        print(f"  {violation.kind:9} {violation.call} -> {violation.outcome}")
    if len(report.violations) > SHOWN_BAD_INPUT:
        print(f"  ... and {len(report.violations) - SHOWN_BAD_INPUT} more")
    return 1 if report.violations else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", type=factory, metavar="MODULE:FACTORY", help="factory returning a fresh runtime")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="factory kwarg (repeatable)")
    parser.add_argument("--profile", choices=("ci", "deep"), default="ci", help="ci: derandomized, bounded; deep: randomized, saved")
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="example database directory of the deep profile")
    parser.add_argument("--max-examples", type=positive_int, default=None, help="override the profile's number of cases per check")
    parser.add_argument("--check", action="append", choices=sorted(CHECKS), help="run only these checks (repeatable)")
    parser.add_argument("--expected", type=input_file, metavar="FILE", help="TOML expected-failures file")
    parser.add_argument("--junitxml", type=output_file, metavar="PATH", help="write a JUnit XML report")
    parser.add_argument("--mutants", action="store_true", help="run the suite against its mutants and print the kill table")
    parser.add_argument("--legal", action="store_true", help="run the legal variants through the checks they claim and print the table")
    parser.add_argument("--shrink", action="store_true", help="with --mutants: shrink each kill (slow; steps then minimal)")
    parser.add_argument("--no-shrink", action="store_true", help="report the first failing sequence unshrunk (faster gate)")
    parser.add_argument(
        "--bad-input",
        type=positive_int,
        default=0,
        metavar="N",
        help="also fuzz N ill-typed and out-of-range calls (cacheruntime.conformance.badinput): each must raise a typed error and change nothing",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the --bad-input fuzz (printed with its verdict)")
    parser.add_argument(
        "--coverage", action="store_true", help="also print, per check, how often each named situation was reached (cases and calls); exit 1 below a floor"
    )


#: How a line begins that gives the command to shrink an unshrunk failure (`cacheruntime check` repeats these lines).
SHRINK_HINT = "shrink locally: "


def shrink_command(args: argparse.Namespace, check: str) -> str:
    """The command that reruns `check` as `args` ran it, with Hypothesis's shrink phase.

    It finds the same failure first: the `ci` profile is derandomized (the same examples
    on every run) and the `deep` profile saved the failing example in its database, which
    the rerun replays before anything else. `--expected` is left out: the failure was new.
    """
    argv = ["cacheruntime", "conformance", "--runtime", args.runtime]
    for option in args.option:
        argv += ["--option", option]
    argv += ["--profile", args.profile]
    if args.profile == "deep":
        argv += ["--database", args.database]
    if args.max_examples is not None:
        argv += ["--max-examples", str(args.max_examples)]
    return shlex.join([*argv, "--check", check])


def _write_junit(path: str | Path, target: str, outcomes: list[Outcome], entries: tuple[expected_file.Expected, ...]) -> None:
    """One testcase per check: failed with its new violations, skipped (with why) when none is new."""
    new = {o.check: expected_file.new_violations(entries, o) for o in outcomes}
    suite = ElementTree.Element(
        "testsuite",
        name="cacheruntime-conformance",
        tests=str(len(outcomes)),
        failures=str(sum(bool(new[o.check]) for o in outcomes)),
        skipped=str(sum(o.status == "skipped" or (o.status == "failed" and not new[o.check]) for o in outcomes)),
    )
    for o in outcomes:
        case = ElementTree.SubElement(suite, "testcase", classname=target, name=o.check, time=f"{o.seconds:.3f}")
        if o.status == "skipped":
            ElementTree.SubElement(case, "skipped", message=o.message)
        elif new[o.check]:
            node = ElementTree.SubElement(case, "failure", message="; ".join(str(v.signature) for v in new[o.check])[:500])
            node.text = "\n\n".join(describe(v) for v in new[o.check])
        elif o.status == "failed":
            ElementTree.SubElement(case, "skipped", message="expected: " + "; ".join(str(v.signature) for v in o.violations))
    ElementTree.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def run_target(args: argparse.Namespace) -> int:
    target = Target.parse(args.runtime, args.option)
    entries = expected_file.load(args.expected) if args.expected else ()
    settings = profile(args.profile, args.database, args.max_examples, shrink=not args.no_shrink)
    info = target.new().info()
    print(f"conformance of {target} ({info.runtime_id}, profile {args.profile})")
    for line in claims_report(info.capabilities):
        print(f"  {line}")
    outcomes, tolerated, new, unshrunk = [], 0, 0, []
    for check in args.check or list(CHECKS):
        outcome = run_check(target, check, settings)
        outcomes.append(outcome)
        fresh = expected_file.new_violations(entries, outcome)
        if outcome.status == "failed":
            tolerated += len(outcome.violations) - len(fresh)
            new += len(fresh)
            verdict = "FAILED" if fresh else "XFAIL "
            print(f"{check:10} {verdict}  {outcome.seconds:6.1f}s  {len(outcome.violations)} violation(s), {len(fresh)} new")
            for violation in outcome.violations:
                entry = expected_file.expected_by(entries, violation)
                print(f"  {'expected' if entry else 'NEW':8} {violation.signature}" + (f"  ({entry.reason})" if entry else ""))
            for violation in fresh:
                print("\n" + describe(violation, shrunk=not args.no_shrink))
            if fresh and args.no_shrink:
                unshrunk.append(check)
        elif outcome.status == "skipped":
            print(f"{check:10} SKIPPED          {outcome.message}")
        else:
            print(f"{check:10} passed  {outcome.seconds:6.1f}s  {CHECKS[check].about}")
    for entry in expected_file.now_passing(entries, outcomes):
        print(f"XPASS: expected violation {entry.signature!r} did not occur ({entry.reason}): fixed, or not reached; remove it from {args.expected} once fixed")
    if args.junitxml:
        _write_junit(args.junitxml, str(target), outcomes, entries)
    if unshrunk:
        print("\nFailures above are unshrunk (--no-shrink: Hypothesis's shrink phase has a wall-clock limit of its own).")
        for check in unshrunk:
            print(f"{SHRINK_HINT}{shrink_command(args, check)}")
    print(f"{'FAILED' if new else 'OK'}: {new} new violation(s), {tolerated} expected")
    return 1 if new else 0


def kill_table(shrink: bool, names: list[str] | None = None) -> tuple[list[tuple], bool]:
    """Rows (mutant, invariant, killed, check, ids, steps, seconds) and whether every mutant died."""
    from cacheruntime.conformance.mutants import MUTANTS
    from cacheruntime.conformance.mutants.families import EQUIVALENT

    settings = profile("ci", shrink=shrink)
    rows = []
    for name in names or [n for n in MUTANTS if n.removeprefix("family.") not in EQUIVALENT]:
        mutant, started, killer = MUTANTS[name], time.monotonic(), None
        # a storage mutant differs from the landed runtime only in L3, which only the storage check drives: it goes first
        for check in sorted(CHECKS, key=lambda check: not (check == "storage" and name.startswith("storage."))):
            outcome = run_check(mutant.target, check, settings, keep_going=False)
            if outcome.status == "failed":
                killer = outcome
                break
        rows.append(
            (
                name,
                mutant.invariant,
                killer is not None,
                killer.check if killer else "-",
                ",".join(killer.ids) if killer else "-",
                killer.violations[0].steps if killer else "-",
                time.monotonic() - started,
            )
        )
    return rows, all(row[2] for row in rows)


def main(args: argparse.Namespace) -> int:
    if args.legal:
        from cacheruntime.conformance import legal

        return legal.main(args)
    if args.mutants:
        print(f"{'mutant':34} {'id':4} {'killed':6} {'by check':9} {'detected as':32} {'steps':>5} {'time':>6}")
        rows, all_killed = kill_table(args.shrink)
        for name, invariant, killed, check, ids, steps, seconds in rows:
            print(f"{name:34} {invariant:4} {'yes' if killed else 'NO':6} {check:9} {ids:32} {steps!s:>5} {seconds:5.1f}s")
        survivors = [r[0] for r in rows if not r[2]]
        from cacheruntime.conformance.mutants.families import SURVIVORS

        known = [name for name in survivors if name.startswith("family.") and name.partition(".")[2] in SURVIVORS]
        print(f"{len(rows) - len(survivors)}/{len(rows)} mutants killed; survivors: {', '.join(survivors) or 'none'}")
        if known:
            print(f"of those, {len(known)} are known blind spots of the suite (cacheruntime.conformance.mutants.families.SURVIVORS)")
        from cacheruntime.conformance.mutants.families import EQUIVALENT

        for name, why in EQUIVALENT.items():
            print(f"not run: family.{name}, equivalent in the conformance configuration: {why}")
        return 0 if all_killed else 1
    if not args.runtime:
        print("cacheruntime conformance: give --runtime MODULE:FACTORY (or --mutants)", file=sys.stderr)
        return 2
    if args.junitxml:
        Path(args.junitxml).parent.mkdir(parents=True, exist_ok=True)
    status = run_target(args) if not args.coverage else _with_coverage(args)
    return max(status, run_bad_input(args)) if args.bad_input else status


def _with_coverage(args: argparse.Namespace) -> int:
    """The checks, then the table of named situations they reached; 1 when a check failed or a count is below its floor."""
    from cacheruntime.conformance import coverage

    with coverage.recording() as reach:
        status = run_target(args)
    print("\ncoverage: named situations reached (cacheruntime.conformance.coverage)")
    for line in coverage.table(reach):
        print(f"  {line}")
    short = [f"{check}: {gap}" for check, tally in reach.items() for gap in tally.shortfalls(check)]
    for gap in short:
        print(f"BELOW FLOOR {gap}")
    return status or int(bool(short))
