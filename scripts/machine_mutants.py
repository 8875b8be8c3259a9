"""Machine-made mutants of the runtime's bookkeeping, judged by the conformance suite (a slow run).

cosmic-ray makes every single-site mutation of the ledger modules (an operator swapped, a
comparison flipped, a constant changed, a condition negated, a loop emptied, ...); each
mutant is the landed `LocalGPURuntime` with that one change, and it is killed when the
conformance suite's CI profile fails on it (first violation only): every check
`cacheruntime.runtime.factories:conformance` claims (core, tiers, restart, ordering,
faults, in that order), then the storage check on `conformance_l3` in both host modes, as
CI runs it. The ledger serves all of them, so a mutant judged by fewer checks (the first
four, as this script ran until 2026-12-04) survives in code only the others reach: failure
paths and L3.

    python scripts/machine_mutants.py                       # every mutant of pages.py
    python scripts/machine_mutants.py --module transfers.py --sample 40 --seed 1
    python scripts/machine_mutants.py --list                # what would run, and what is set aside

The run works on a scratch copy of `src/` (cosmic-ray edits the module in place, one
mutant at a time), so the checkout is never touched. It prints the score: total,
killed, survived, equivalent (set aside), timeout, with every survivor's diff.

**Equivalent mutants** are set aside before they run, by a syntactic rule
(`equivalence_class`): the span cosmic-ray changes lies wholly inside

- a string literal or f-string: error texts, which the contract leaves to the runtime
  (`spec/protocol.md` section 2.1: "the `what` and `fix` texts"), and docstrings;
- a type annotation or an `if TYPE_CHECKING:` block: never executed.

Nothing else is set aside: a survivor stays a survivor, with its diff printed for review,
even where it may be equivalent, so the score never hides a blind spot behind a judgement.

`--test` is the test command cosmic-ray runs for each mutant (exit 0: survived).
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CHECKS = ("core", "tiers", "restart", "ordering", "faults")
LEDGER = Path("src/cacheruntime/runtime/ledger")
TARGET = "cacheruntime.runtime.factories:conformance"
#: the storage check's runtime: L3 over the file store, in each host mode (tests/conformance/test_storage_check.py)
L3_TARGET = "cacheruntime.runtime.factories:conformance_l3"
HOST_MODES = ("resident", "buffer_only")


# -- the equivalence rule -------------------------------------------------------------------


def _spans(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(class, node) of every part of the module whose mutation cannot change behaviour."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            yield "text", node
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield "type-checking", node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg):
                if arg is not None and arg.annotation is not None:
                    yield "annotation", arg.annotation
            if node.returns is not None:
                yield "annotation", node.returns
        elif isinstance(node, ast.AnnAssign):
            yield "annotation", node.annotation


def equivalence_class(source: str, start: tuple[int, int], end: tuple[int, int]) -> str | None:
    """The class ("text", "type-checking", "annotation") that makes a mutation of `source`
    between `start` and `end` (cosmic-ray's 1-based line, 0-based column) equivalent, or None."""
    for kind, node in _spans(ast.parse(source)):
        first = (node.lineno, node.col_offset)  # type: ignore[attr-defined]
        last = (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        if first <= start and end <= last:
            return kind
    return None


# -- the test command -----------------------------------------------------------------------


def test_command() -> int:
    """Run the CI profile's checks in order on the (mutated) runtime; exit 1 at the first violation."""
    from cacheruntime.conformance.profiles import profile
    from cacheruntime.conformance.runner import run_check
    from cacheruntime.conformance.target import Target

    runs = [(check, Target(TARGET)) for check in CHECKS]
    runs += [("storage", Target(L3_TARGET, (("host_mode", mode),))) for mode in HOST_MODES]
    for check, target in runs:
        outcome = run_check(target, check, profile("ci", shrink=False), keep_going=False)
        print(f"{check} {dict(target.options) or ''}: {outcome.status} {','.join(outcome.ids)} ({outcome.seconds:.1f}s)", flush=True)
        if outcome.status == "failed":
            print(outcome.message[:2000])
            return 1
    return 0


# -- the run --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", help="ledger module(s) to mutate (default: pages.py)")
    parser.add_argument("--sample", type=int, help="run only this many mutants, drawn with --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (printed)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant before it counts as a timeout")
    parser.add_argument("--list", action="store_true", help="list the mutants and the equivalence verdicts; run nothing")
    parser.add_argument("--test", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.test:
        return test_command()

    from cosmic_ray.commands import init
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    repo = Path(__file__).resolve().parent.parent
    scratch = Path(tempfile.mkdtemp(prefix="machine-mutants-"))
    try:
        shutil.copytree(repo / "src", scratch / "src", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(Path(__file__), scratch / "machine_mutants.py")
        modules = [scratch / LEDGER / name for name in args.module or ["pages.py"]]
        command = f"{sys.executable} {scratch / 'machine_mutants.py'} --test"
        os.environ["PYTHONPATH"] = str(scratch / "src")
        os.chdir(scratch)
        with use_db(str(scratch / "session.sqlite"), WorkDB.Mode.create) as db:
            init(modules, db, {})
            items = sorted(db.work_items, key=lambda item: (str(item.mutations[0].module_path), item.mutations[0].start_pos, item.mutations[0].operator_name))
            sources = {path: path.read_text() for path in modules}
            equivalent, candidates = {}, []
            for item in items:
                mutation = item.mutations[0]
                kind = equivalence_class(sources[Path(mutation.module_path)], tuple(mutation.start_pos), tuple(mutation.end_pos))
                if kind is None:
                    candidates.append(item)
                else:
                    equivalent[item.job_id] = kind
            chosen = (
                candidates if args.sample is None else sorted(random.Random(args.seed).sample(candidates, min(args.sample, len(candidates))), key=items.index)
            )
            print(
                f"modules: {', '.join(p.name for p in modules)}; mutants: {len(items)}; equivalent (set aside): {len(equivalent)}; "
                f"run: {len(chosen)}" + ("" if args.sample is None else f" (a sample of {len(candidates)}, seed {args.seed})"),
                flush=True,
            )
            if args.list:
                for item in items:
                    m = item.mutations[0]
                    verdict = f"equivalent:{equivalent[item.job_id]}" if item.job_id in equivalent else ("run" if item in chosen else "not sampled")
                    print(f"  {Path(m.module_path).name}:{m.start_pos[0]} {m.operator_name} #{m.occurrence} {verdict}")
                return 0
            baseline = test_command_outcome(command, args.timeout)
            if baseline != "survived":
                print(f"the unmutated runtime does not pass the suite ({baseline}): no score")
                return 2
            counts = {"killed": 0, "survived": 0, "timeout": 0, "no mutation": 0}
            survivors = []
            for number, item in enumerate(chosen, 1):
                mutation = item.mutations[0]
                started = time.monotonic()
                result: WorkResult = mutate_and_test(item.mutations, command, args.timeout)
                if result.worker_outcome is WorkerOutcome.NO_TEST:
                    verdict = "no mutation"
                elif result.output == "timeout":
                    verdict = "timeout"
                elif result.test_outcome is TestOutcome.SURVIVED:
                    verdict = "survived"
                    survivors.append(result.diff or "")
                else:
                    verdict = "killed"
                counts[verdict] += 1
                last = (result.output or "").strip().splitlines()
                print(
                    f"[{number}/{len(chosen)}] {Path(mutation.module_path).name}:{mutation.start_pos[0]} {mutation.operator_name} "
                    f"#{mutation.occurrence}: {verdict} ({time.monotonic() - started:.0f}s) {last[-1] if last and verdict == 'killed' else ''}",
                    flush=True,
                )
            total = len(chosen) + len(equivalent)
            print(
                f"\nscore: total {total}, killed {counts['killed']}, survived {counts['survived']}, equivalent (set aside) {len(equivalent)}, "
                f"timeout {counts['timeout']}" + (f", no mutation {counts['no mutation']}" if counts["no mutation"] else "")
            )
            judged = counts["killed"] + counts["survived"] + counts["timeout"]
            if judged:
                print(f"killed / (killed + survived + timeout): {counts['killed'] / judged:.0%}")
            for diff in survivors:
                print("\nsurvivor:\n" + diff)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def test_command_outcome(command: str, timeout: float) -> str:
    """The unmutated runtime under the test command: "survived" when the suite passes it."""
    from cosmic_ray.testing import run_tests

    outcome, output = run_tests(command, timeout)
    return "timeout" if output == "timeout" else str(outcome.value)


if __name__ == "__main__":
    sys.exit(main())
