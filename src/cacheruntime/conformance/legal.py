"""`cacheruntime conformance --legal`: run every legal variant through the checks it claims, print the table.

The counterpart of the mutant kill table: there every mutant must fail a check, here
every legal variant (`cacheruntime.conformance.variants`) must pass every check it
claims. A failure here is the suite's bug (it demands something the contract leaves to
the runtime), or the variant's (it takes a freedom the contract does not grant).
"""

from __future__ import annotations

import argparse
import time

from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import Outcome, describe, run_check
from cacheruntime.conformance.statemachine import CHECKS
from cacheruntime.conformance.variants import VARIANTS


def legal_table(max_examples: int | None = None, names: list[str] | None = None, checks: list[str] | None = None) -> list[tuple[str, list[Outcome]]]:
    """Per variant, the outcome of each check it claims (in the CI profile, unshrunk)."""
    settings = profile("ci", max_examples=max_examples, shrink=False)
    rows = []
    for name in names or list(VARIANTS):
        variant = VARIANTS[name]
        rows.append((name, [run_check(variant.target, check, settings) for check in variant.checks if not checks or check in checks]))
    return rows


def main(args: argparse.Namespace) -> int:
    """Print the table; exit 1 if any variant failed a check it claims."""
    started = time.monotonic()
    checks = list(CHECKS)
    print(f"{'variant':24} " + " ".join(f"{check:16}" for check in checks) + "  freedom taken")
    failures = []
    for name, outcomes in legal_table(args.max_examples, checks=args.check):
        by_check = {o.check: o for o in outcomes}
        cells = []
        for check in checks:
            o = by_check.get(check)
            cells.append(f"{'-':16}" if o is None else f"{o.status:7} {o.seconds:6.1f}s  ")
            if o is not None and o.status == "failed":
                failures.append((name, o))
        print(f"{name:24} " + " ".join(cells) + f"  {VARIANTS[name].how}")
    for name, o in failures:
        print(f"\n# ---- {name}: {o.check} FAILED\n" + "\n\n".join(describe(v) for v in o.violations))
    print(f"{len(VARIANTS) - len({n for n, _ in failures})}/{len(VARIANTS)} legal variants passed every check they claim ({time.monotonic() - started:.0f}s)")
    return 1 if failures else 0
