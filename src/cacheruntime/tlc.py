"""`cacheruntime tlc`: model-check tla/CacheRuntime.tla with TLC, as tla/manifest.json says.

The manifest lists models. Each has a config (`tla/MC*.cfg`), the result it must give
(`pass`, or `violation` of a named invariant or property), the distinct states and
depth TLC reports, and the seconds it took when pinned. A mutant model names an exact
text replacement in CacheRuntime.tla (a guard removed, an event wait dropped, ...); the
driver applies it to a copy and expects TLC to fail with exit code 12 or 13 and the
invariant's name in the output. Any difference from the manifest, the state count
included, fails the command. A model may check another module of tla/ (`module`, e.g. the
SharedGPURuntime design test); its mutations then apply to that module.

A model may also name actions that must be taken (`actions_taken`): TLC then runs with
`-coverage` and the model fails unless each named action found at least one distinct
state (how MCFaults.cfg shows that every failure action of the environment happens), and
`actions_stepped` names actions that must take at least one step, new state or not
(WaitCompletions only ever reaches states PollCompletions reaches too): together the CI models
step every action of the spec's Next (a test holds them to it).

A model with `simulate` (`traces`, `depth`, `seed`) runs TLC's random simulation instead of
the exhaustive search, with one worker so that the seed reproduces it: the deep model,
whose exhaustive search does not complete within a machine's time (tla/README.md), is checked
that way, and its pinned count is the states the simulation checked.

Models are grouped: `ci` (the default run), `deep` (with `--deep`), `design` (with
`--design`: the SharedGPURuntime design test, run in CI by tests/tla/test_shared.py), `trace` (the
model <-> spec trace check, see cacheruntime.tlatrace), `runtime` (the runtime <-> spec
trace check, `--model runtime-traces`: `cacheruntime check` runs it as its own stage; see
cacheruntime.runtimetrace). `--runtime-traces N` records N executions of a runtime
(`--runtime MODULE:FACTORY`, default LocalGPURuntime) and checks them; `--record-to DIR`
also writes them, `--record-only` skips the check (no Java needed), and `--traces-from DIR`
checks traces written earlier (say, recorded on a GPU machine). `--spec-mutants` weakens the spec
itself, one guard or effect at a time, and prints which invariant kills each (cacheruntime.specmutants:
the full table is slow; `--spec-mutants ci` runs the manifest's fixed subset). The spec files are this checkout's,
`--repo DIR`'s, or the copy in the wheel (cacheruntime.specfiles).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cacheruntime import runtimetrace, specfiles
from cacheruntime.cliargs import input_file, positive_int
from cacheruntime.tlatools import ToolMissing, find_jar, find_java, tlc_java

TLA_DIR = specfiles.tla_dir()
MANIFEST = TLA_DIR / "manifest.json"
SPEC = "CacheRuntime.tla"


@dataclass
class Outcome:
    """What one TLC run gave."""

    name: str
    expected: str
    got: str
    distinct: int | None
    depth: int | None
    seconds: float
    exit_code: int
    pinned_distinct: int | None = None
    pinned_depth: int | None = None
    note: str = ""
    workers: int = 1

    @property
    def depth_ok(self) -> bool:
        """The depth against the pin, which is one worker's (the exact breadth-first diameter).
        With more workers TLC's search is breadth-first only roughly: a state can be reached first
        along a longer path, so the depth it reports can exceed the diameter (by a level on the
        2-core CI machine, with the same distinct states) and never fall below it."""
        if self.pinned_depth is None:
            return True
        if self.workers == 1 or self.depth is None:
            return self.depth == self.pinned_depth
        return self.depth >= self.pinned_depth

    @property
    def ok(self) -> bool:
        if self.got != self.expected:
            return False
        if self.pinned_distinct is not None and self.distinct != self.pinned_distinct:
            return False
        return self.depth_ok


def load_manifest(path: Path = MANIFEST) -> dict:
    return json.loads(path.read_text())


def expected_label(model: dict) -> str:
    return "pass" if model["expect"] == "pass" else f"violation:{model['invariant']}"


def parse_output(out: str, exit_code: int, *, simulated: bool = False) -> tuple[str, int | None, int | None]:
    """(result label, distinct states, depth) from TLC's output.

    A simulation (`-simulate`) reports no distinct states: its count is the states it
    checked, the same for the same seed, traces and depth with one worker, and its depth
    is the bound it was given (not reported)."""
    if simulated:
        checked = re.findall(r"Progress: ([\d,]+) states checked", out)
        count = int(checked[-1].replace(",", "")) if checked else None
        if exit_code == 0 and re.search(r"^Finished in ", out, re.M) and not re.search(r"^Error", out, re.M):
            return "pass", count, None
        found, distinct = [], count
    else:
        found = re.findall(r"([\d,]+) distinct states found", out)
        distinct = int(found[-1].replace(",", "")) if found else None
    m = re.search(r"The depth of the complete state graph search is (\d+)", out)
    depth = int(m.group(1)) if m else None
    if exit_code == 0 and "Model checking completed. No error has been found." in out:
        return "pass", distinct, depth
    m = re.search(r"Error: Invariant (\S+) is violated", out)
    if m and exit_code in (12, 13):
        return f"violation:{m.group(1)}", distinct, depth
    m = re.search(r"Error: (?:Action property|Temporal properties were violated)", out)
    if m and exit_code in (12, 13):
        # TLC 2.15 names the violated property in the next lines (or not at all for liveness)
        m2 = re.search(r"Error: Action property (\S+) is violated", out)
        if m2:
            return f"violation:{m2.group(1)}", distinct, depth
        m3 = re.search(r"The property (\S+) is violated|property (\S+)", out)
        return f"violation:{'temporal' if not m3 else (m3.group(1) or m3.group(2))}", distinct, depth
    if "Deadlock reached" in out:
        return "deadlock", distinct, depth
    first_error = next((line for line in out.splitlines() if line.startswith("Error")), f"exit {exit_code}")
    return f"error:{first_error[:60]}", distinct, depth


def action_coverage(out: str, *, steps: bool = False, spec_text: str = "") -> dict[str, int]:
    """Distinct states each action found (`steps`: steps it took), from TLC's `-coverage` report
    (`<Name line ...>: distinct:total`).

    An action TLC reports more than once (one per disjunct of Next that names it) sums its counts.
    TLC reports some disjuncts of Next as `Next` with the disjunct's place (`(L C L C)`); given the
    spec's text, such a line counts for the action that the disjunct's line applies.
    """
    lines = spec_text.splitlines()
    found: dict[str, int] = {}
    for name, place, distinct, total in re.findall(r"^<(\w+) line [^>(]*(?:\((\d+) [^)]*\))?>: (\d+):(\d+)$", out, re.MULTILINE):
        if name == "Next" and place and int(place) <= len(lines):
            m = _DISJUNCT.match(lines[int(place) - 1])
            name = m.group(1) if m else name
        found[name] = found.get(name, 0) + int(total if steps else distinct)
    return found


#: A disjunct of Next and the action it applies (under quantifiers or a model bound).
_DISJUNCT = re.compile(r"\s*\\/ (?:.*: |MaxSubmitIntents >= 2 /\\ .*: )?(\w+)(?:\(|$)")


def next_actions(spec_text: str) -> list[str]:
    """The actions of the spec's Next: the operator each of its disjuncts applies, in order."""
    body = spec_text.split("\nNext ==\n", 1)[1].split("\n\n", 1)[0]
    names = []
    for line in body.splitlines():
        m = _DISJUNCT.match(line)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


def untaken(model: dict, out: str, spec_text: str = "") -> list[str]:
    """The model's `actions_taken` that found no distinct state in this run, and its
    `actions_stepped` that took no step."""
    coverage = action_coverage(out, spec_text=spec_text)
    steps = action_coverage(out, steps=True, spec_text=spec_text)
    missing = [name for name in model.get("actions_taken", []) if coverage.get(name, 0) == 0]
    return missing + [name for name in model.get("actions_stepped", []) if steps.get(name, 0) == 0 and name not in missing]


def run_model(model: dict, *, workers: int, java: str, jar: Path, tla_dir: Path = TLA_DIR, verbose: bool = False) -> Outcome:
    """Run one manifest model (applying its mutation, if any) and compare with the manifest."""
    name = model["name"]
    expected = expected_label(model)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"cacheruntime-tlc-{name}-") as tmp:
        work = Path(tmp)
        module = model.get("module", SPEC)
        spec_text = (tla_dir / module).read_text()
        for mutation in model.get("mutations", []):
            hits = spec_text.count(mutation["from"])
            if hits != 1:
                return Outcome(name, expected, f"error:mutation text found {hits} times", None, None, 0.0, -1)
            spec_text = spec_text.replace(mutation["from"], mutation["to"])
        if module != SPEC:
            shutil.copy(tla_dir / SPEC, work / SPEC)
        (work / module).write_text(spec_text)
        for extra in model.get("modules", []):
            shutil.copy(tla_dir / extra, work / Path(extra).name)
        shutil.copy(tla_dir / model["config"], work / "MC.cfg")
        simulate = model.get("simulate")
        cmd = [
            *tlc_java(java, jar, work),
            "-workers",
            # a simulation is reproducible from its seed with one worker only (with more, which
            # worker draws which trace depends on timing)
            "1" if simulate else str(workers),
            "-metadir",
            str(work / "states"),
            "-config",
            "MC.cfg",
        ]
        if simulate:
            cmd += ["-simulate", f"num={simulate['traces']}", "-depth", str(simulate["depth"]), "-seed", str(simulate["seed"])]
        if not model.get("check_deadlock", False):
            cmd.append("-deadlock")
        if model.get("actions_taken") or model.get("actions_stepped"):
            cmd += ["-coverage", "60"]  # reported once, at the end, for runs under an hour
        cmd.append(module)
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    seconds = time.monotonic() - started
    got, distinct, depth = parse_output(out, proc.returncode, simulated=bool(model.get("simulate")))
    missing = untaken(model, out, spec_text) if got == "pass" else []
    if missing:
        got = f"error:never taken: {', '.join(missing)}"
    if verbose or (got != expected):
        sys.stderr.write(f"--- TLC output for {name} ---\n{out[-4000:]}\n")
    pinned = model.get("distinct_states") if model.get("expect") == "pass" else None
    return Outcome(
        name,
        expected,
        got,
        distinct,
        depth,
        seconds,
        proc.returncode,
        pinned_distinct=pinned,
        pinned_depth=model.get("depth") if model.get("expect") == "pass" else None,
        workers=1 if simulate else workers,
    )


def run_trace_check(model: dict, *, workers: int, java: str, jar: Path, tla_dir: Path = TLA_DIR) -> Outcome:
    """The trace-check model: random reference-model traces replayed by TLC on `tla_dir`'s spec."""
    from cacheruntime import tlatrace

    n, steps, seed = model.get("traces", 60), model.get("steps", 40), model.get("seed", 0)
    traces = [tlatrace.random_trace(seed + i, steps) for i in range(n)]
    result = tlatrace.validate(traces, spec=tla_dir / SPEC, workers=workers, java=java, jar=str(jar))
    return trace_outcome(model, "pass" if result.ok else "divergence", result.distinct, result.seconds, result.divergence)


def trace_outcome(model: dict, got: str, distinct: int, seconds: float, note: str) -> Outcome:
    """A trace check's outcome (no depth: TLC replays traces), its state count held to the manifest's."""
    return Outcome(
        model["name"], expected_label(model), got, distinct, None, seconds, 0 if got == "pass" else 1, pinned_distinct=model.get("distinct_states"), note=note
    )


def run_runtime_traces(model: dict, *, workers: int, java: str, jar: Path, tla_dir: Path = TLA_DIR) -> Outcome:
    """The runtime-trace model: traces of LocalGPURuntime recorded on CPU and checked by TLC (cacheruntime.runtimetrace)."""
    result, note = runtimetrace.run_manifest_model(model, workers=workers, java=java, jar=jar, tla_dir=tla_dir)
    return trace_outcome(model, "pass" if result.ok else ("error" if result.error else "rejected"), result.distinct, result.seconds, note)


def format_table(outcomes: list[Outcome]) -> str:
    rows = [("model", "expected", "got", "distinct", "depth", "seconds", "")]
    for o in outcomes:
        flag = "ok" if o.ok else "DIFFERS"
        distinct = "-" if o.distinct is None else f"{o.distinct}"
        if o.pinned_distinct is not None and o.distinct != o.pinned_distinct:
            distinct += f" (pinned {o.pinned_distinct})"
        depth = "-" if o.depth is None else str(o.depth)
        if o.pinned_depth is not None and o.depth != o.pinned_depth:
            depth += f" (pinned {o.pinned_depth}{'' if o.workers == 1 else ', at least'})"
        rows.append((o.name, o.expected, o.got, distinct, depth, f"{o.seconds:.1f}", flag))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for o in outcomes:
        if o.note:
            lines.append(f"{o.name}: {o.note}")
    return "\n".join(lines)


def select(manifest: dict, *, deep: bool = False, design: bool = False, names: list[str] | None = None) -> list[dict]:
    models = manifest["models"]
    if names:
        known = {m["name"] for m in models}
        missing = [n for n in names if n not in known]
        if missing:
            raise SystemExit(f"unknown model(s) {missing}; the manifest has {sorted(known)}")
        return [m for m in models if m["name"] in names]
    groups = {"ci", "trace"} | ({"deep"} if deep else set()) | ({"design"} if design else set())
    return [m for m in models if m.get("group", "ci") in groups]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deep", action="store_true", help="also run the deep models (minutes to hours)")
    parser.add_argument("--design", action="store_true", help="also run the design-test models (SharedGPURuntime, about a minute)")
    parser.add_argument("--model", action="append", metavar="NAME", help="run only this manifest model (repeatable)")
    parser.add_argument("--workers", type=positive_int, default=2, help="TLC worker threads (default 2)")
    specfiles.add_repo_option(parser)
    parser.add_argument("--manifest", type=input_file, default=None, help="the manifest (default: tla/manifest.json of the spec files)")
    parser.add_argument("--list", action="store_true", help="list the manifest's models and exit")
    parser.add_argument("--verbose", action="store_true", help="print TLC's output for every model")
    parser.add_argument(
        "--spec-mutants",
        nargs="?",
        const="all",
        metavar="WHICH",
        help="run the spec's guard and effect mutants on tla/MCMutants.cfg and print the kill table "
        "(all, the default: every mutant, slow; ci: the manifest's fixed subset; or a comma-separated "
        "list of mutant ids and definition names, e.g. Split,Release.e2)",
    )
    parser.add_argument("--jobs", type=positive_int, default=1, help="spec mutants checked at once, each with --workers (default 1)")
    runtimetrace.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    manifest_path = args.manifest or specfiles.tla_dir(args.repo) / "manifest.json"
    manifest = load_manifest(manifest_path)
    if args.list:
        for m in manifest["models"]:
            print(f"{m['name']:28} {m.get('group', 'ci'):6} {expected_label(m):28} {m.get('distinct_states', '-')}")
        return 0
    if args.spec_mutants is not None:
        if args.model or args.deep or args.runtime_traces is not None or args.traces_from is not None:
            print("cacheruntime tlc: error: --spec-mutants runs alone, without --model, --deep or trace options", file=sys.stderr)
            return 2
        try:
            jar, java = find_jar(), find_java()
        except ToolMissing as error:
            print(error, file=sys.stderr)
            return 2
        from cacheruntime import specmutants

        return specmutants.run_cli(manifest, manifest_path.parent, subset=args.spec_mutants, java=java, jar=jar, workers=args.workers, jobs=args.jobs)
    wrong = runtimetrace.usage_error(args)
    if wrong:
        print(f"cacheruntime tlc: error: {wrong} (see cacheruntime tlc --help)", file=sys.stderr)
        return 2
    if args.runtime_traces is not None or args.traces_from is not None:
        if args.model or args.deep or args.design:
            print("cacheruntime tlc: error: --runtime-traces and --traces-from run alone, without --model, --deep or --design", file=sys.stderr)
            return 2
        try:
            if not args.record_only:  # recording alone needs no Java (the GPU machine has none)
                find_jar(), find_java()
        except ToolMissing as error:
            print(error, file=sys.stderr)
            return 2
        return runtimetrace.run_cli(args, manifest, manifest_path.parent, java=find_java, jar=find_jar)
    try:
        jar, java = find_jar(), find_java()
    except ToolMissing as error:
        print(error, file=sys.stderr)
        return 2
    models = select(manifest, deep=args.deep, design=args.design, names=args.model)
    outcomes = []
    for model in models:
        if model.get("kind") == "trace":
            outcome = run_trace_check(model, workers=args.workers, java=java, jar=jar, tla_dir=manifest_path.parent)
        elif model.get("kind") == "runtime-trace":
            outcome = run_runtime_traces(model, workers=args.workers, java=java, jar=jar, tla_dir=manifest_path.parent)
        else:
            outcome = run_model(model, workers=args.workers, java=java, jar=jar, tla_dir=manifest_path.parent, verbose=args.verbose)
        outcomes.append(outcome)
        print(f"{outcome.name}: {outcome.got} ({outcome.distinct} states, {outcome.seconds:.1f}s)", flush=True)
    print(format_table(outcomes))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="cacheruntime tlc", description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
