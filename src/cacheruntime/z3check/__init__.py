"""`cacheruntime z3`: prove the eviction, lock, generation and page-run properties with Z3.

The proofs run on the code TreeCore and the model run: `control/policy.py` and
`pageruns.py`, evaluated on Z3 terms through `z3ops.Z3OPS`. `proofs` states the checks,
`solve` runs them, `mutants` plants known bugs the checks must catch, `render` prints
counterexamples. This module only parses options and prints tables; z3 is imported when
`main` runs, so that building the CLI parser stays light.

Each check is bounded by a recorded Z3 resource budget (`solve.RLIMITS`), not by seconds,
so a loaded machine reaches the same verdicts as an idle one; `--rlimit-scale` multiplies
the budgets (for bounds larger than the defaults they were measured at). Each check and
each mutant runs in a fresh process, so its count does not depend on what ran before it.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from cacheruntime.cliargs import positive_float, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=positive_int, default=8, help="prove for every tree of up to N nodes (default 8)")
    parser.add_argument("--pages", type=positive_int, default=8, help="page lists of up to this length for coalesce (default 8)")
    parser.add_argument("--runs", type=positive_int, default=4, help="run lists of up to this many runs for split (default 4)")
    parser.add_argument("--generation-bits", type=positive_int, default=32, help="width of the slot generation counter (default 32)")
    parser.add_argument(
        "--rlimit-scale",
        type=positive_float,
        default=1.0,
        help="multiply every check's recorded Z3 resource budget (rlimit) by X; a check that spends it fails (default 1)",
    )
    parser.add_argument("--timeout", help=argparse.SUPPRESS)  # removed: says so in one line instead of a usage error
    parser.add_argument("--jobs", type=positive_int, default=min(2, os.cpu_count() or 1), help="checks run side by side")
    parser.add_argument("--only", action="append", default=[], help="run only the named check (repeatable)")
    parser.add_argument("--mutants", action="store_true", help="also plant the known bugs and print which check kills each")


def main(args: argparse.Namespace) -> int:
    from cacheruntime.z3check import mutants, solve
    from cacheruntime.z3check.proofs import CHECKS, Bounds

    if args.timeout is not None:
        print("cacheruntime z3: --timeout is gone: checks are bounded by Z3 resource budgets, not seconds; use --rlimit-scale X", file=sys.stderr)
        return 2
    bounds = Bounds(nodes=args.nodes, pages=args.pages, runs=args.runs, generation_bits=args.generation_bits)
    names = args.only or [c.name for c in CHECKS]
    unknown = sorted(set(names) - set(solve.BY_NAME))
    if unknown:
        print(f"unknown checks: {', '.join(unknown)}; known: {', '.join(solve.BY_NAME)}")
        return 2
    print(
        f"Z3 proofs on control/policy.py and pageruns.py: trees <= {bounds.nodes} nodes, page lists <= {bounds.pages}, "
        f"run lists <= {bounds.runs}, {bounds.generation_bits}-bit generations"
    )
    print(f"each check bounded by its recorded Z3 rlimit budget x {args.rlimit_scale:g} (budgets measured at the default bounds)")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), max_tasks_per_child=1) as pool:
        outcomes = list(pool.map(solve.run_named, names, [bounds] * len(names), [args.rlimit_scale] * len(names)))
        _table(
            ("check", "id", "bound", "result", "rlimit used", "rlimit budget", "seconds"),
            [(o.check, o.invariant, o.bound, o.result, str(o.rlimit_used), str(o.rlimit), f"{o.seconds:.2f}") for o in outcomes],
        )
        for o in outcomes:
            if not o.ok:
                print(f"\n{o.check}: {o.result}\n{o.detail}")
            if o.result == solve.RESOURCE_LIMIT:
                print(
                    f"the budget is {solve.MARGIN}x what the check spent at the default bounds on the pinned z3-solver: at larger bounds "
                    "raise --rlimit-scale; at the defaults the code under proof, the check or z3-solver changed (re-measure)"
                )
        ok = all(o.ok for o in outcomes)
        if args.mutants:
            planted = [m.name for m in mutants.MUTANTS]
            results = list(pool.map(solve.run_mutant, planted, [bounds] * len(planted), [args.rlimit_scale] * len(planted)))
            print("\nMutants (each a known bug planted in a copy of the source):")
            _table(
                ("mutant", "bug", "expected killer", "killed by", "rlimit used", "seconds"),
                [(m.mutant, m.bug, m.expected, m.killed_by or "SURVIVED", str(m.rlimit_used), f"{m.seconds:.2f}") for m in results],
            )
            for m in results:
                print(f"\n{m.mutant} ({m.bug}), counterexample from {m.killed_by or 'no check'}:\n{m.counterexample}")
            ok = ok and all(m.ok for m in results)
    print("\nall proved" if ok else "\nFAILED")
    return 0 if ok else 1


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
