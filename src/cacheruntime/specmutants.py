"""`cacheruntime tlc --spec-mutants`: the spec's own mutants and what kills each.

A spec is only as strong as the invariants that would notice it being wrong. This module
weakens tla/CacheRuntime.tla one conjunct at a time, mechanically, and runs TLC on each
copy with a small dedicated model (tla/MCMutants.cfg):

- a guard mutant replaces one precondition conjunct of an action or helper by TRUE;
- an effect mutant drops one effect: `v' = e` becomes `v' = v`, and a conjunct that calls
  an operator with effects (`SetTiers(...)`, `DropHolders(...)`, `Leave(...)`) becomes
  `UNCHANGED` of the variables that operator sets;
- an altered-effect mutant leaves one field of a tier-state update (`!.f = e` inside an
  EXCEPT) as it was (`!.f = @`).

Conjuncts are found by TLA+'s alignment rule: a `/\\` that opens a line (or follows `==`,
`IN`, `THEN`, `ELSE` or a quantifier's `:`) starts a conjunct that runs until a line starts
at or left of its column; a one-line conjunct of plain `/\\`-joined terms is split into them.
A conjunct holding further conjuncts is not mutated itself, only its leaves are; a guard
commented `model bound` is not a protocol precondition (it keeps TLC inside the finite
sets) and is listed but not run. A ghost variable's update (commented `ghost`) is the yardstick an
invariant measures the spec by, so it is not mutated.

Each mutant is killed (TLC reports a named invariant or property violated), redundant (TLC
passes with the baseline's distinct-state count under the spec's VIEW, and the guard's
comment says why: `redundant: <reason>`), legal (an effect the contract leaves to the runtime,
such as where a new epoch's numbering starts: commented `legal: <reason>`, and TLC must pass it,
whatever its count, or the spec forbids a legal runtime), survives (anything else that passes), or
ends in an evaluation error, which is reported in its own column and is not a kill.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cacheruntime.tlatools import tlc_java

#: Definitions that are not actions or their helpers: the type invariant, the initial predicate.
NOT_MUTATED = frozenset({"TypeOK", "Init"})
#: Where the mutated part of the module ends: Next and what follows are not mutated.
LAST = "Next"

_DEF = re.compile(r"^([A-Za-z_]\w*)(\([^)]*\))?\s*==", re.MULTILINE)
_BULLET_AFTER = re.compile(r"(==|\bIN|\bTHEN|\bELSE|:)\s*$")
_PRIMED = re.compile(r"\b([A-Za-z_]\w*)'")
_FIELD = re.compile(r"!\.(\w+) = ")


@dataclass(frozen=True)
class Mutant:
    """One weakening of the spec: the text at [start, end) replaced by `replacement`."""

    ident: str  # Definition.gN (guard), .eN (effect dropped), .aN (effect altered)
    definition: str
    kind: str  # "guard", "effect", "altered"
    line: int
    start: int
    end: int
    original: str
    replacement: str
    comment: str  # the comments on the conjunct's lines

    @property
    def bound(self) -> bool:
        """A model bound, not a protocol precondition (commented so in the spec)."""
        return self.kind == "guard" and "model bound" in self.comment

    @property
    def reason(self) -> str | None:
        """The one-line reason the spec gives beside the guard for its being redundant."""
        m = re.search(r"redundant: (.*)", self.comment)
        return m.group(1).strip() if m else None

    @property
    def legal(self) -> str | None:
        """Why the mutant is another legal runtime (the contract leaves the value free), as the
        spec's comment beside the effect says it (`legal: <reason>`)."""
        m = re.search(r"legal: (.*)", self.comment)
        return m.group(1).strip() if m else None

    def apply(self, text: str) -> str:
        assert text[self.start : self.end] == self.original
        return text[: self.start] + self.replacement + text[self.end :]

    @property
    def summary(self) -> str:
        return f"{_squash(self.original)} -> {_squash(self.replacement)}"


def _squash(text: str, width: int = 70) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 3] + "..."


def _strip_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one line; `\\*` outside strings starts a comment."""
    in_string = False
    for i, ch in enumerate(line):
        if ch == '"':
            in_string = not in_string
        elif not in_string and line.startswith("\\*", i):
            return line[:i], line[i + 2 :].strip()
    return line, ""


@dataclass(frozen=True)
class _Definition:
    name: str
    start: int  # offset of the definition's first character
    end: int
    line: int


def definitions(text: str) -> list[_Definition]:
    """The module's operator definitions, each to the next line that starts at column 0."""
    found = []
    starts = [m for m in _DEF.finditer(text)]
    for m in starts:
        end = len(text)
        for nxt in re.finditer(r"^\S", text[m.end() :], re.MULTILINE):
            end = m.end() + nxt.start()
            break
        found.append(_Definition(m.group(1), m.start(), end, text.count("\n", 0, m.start()) + 1))
    return found


def _line_starts(text: str) -> list[int]:
    return [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]


@dataclass(frozen=True)
class _Conjunct:
    start: int  # first character after "/\ "
    end: int  # end of its last line's code (comments excluded)
    column: int
    leaf: bool
    comment: str


def conjuncts(text: str, d: _Definition) -> list[_Conjunct]:
    """The bulleted conjuncts of definition d, by TLA+'s alignment rule."""
    body = text[d.start : d.end]
    lines = body.split("\n")
    offsets = [d.start]
    for ln in lines[:-1]:
        offsets.append(offsets[-1] + len(ln) + 1)
    bullets = []  # (line index, column)
    for li, ln in enumerate(lines):
        code, _ = _strip_comment(ln)
        for m in re.finditer(r"/\\ ", code):
            before = code[: m.start()]
            if not before.strip() or _BULLET_AFTER.search(before):
                bullets.append((li, m.start()))
    found = []
    for li, col in bullets:
        last = li
        for lj in range(li + 1, len(lines)):
            code, _ = _strip_comment(lines[lj])
            if not code.strip():
                break
            if len(code) - len(code.lstrip()) <= col:
                break
            last = lj
        code_last, _ = _strip_comment(lines[last])
        start = offsets[li] + col + 3
        end = offsets[last] + len(code_last.rstrip())
        inner = any((li < l2 <= last) or (l2 == li and c2 > col) for l2, c2 in bullets)
        comment = " ".join(_strip_comment(lines[k])[1] for k in range(li, last + 1)).strip()
        found.append(_Conjunct(start, end, col, not inner, comment))
    return found


def _split_plain(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """A one-line conjunct of plain terms joined by `/\\` split into the terms' spans."""
    segment = text[start:end]
    if "\n" in segment or re.search(r"\\A|\\E|\bLET\b|\bIF\b|\bCASE\b|=>|\\/", segment):
        return [(start, end)]
    spans, depth, last = [], 0, 0
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch in "([{<" and not segment.startswith("<=", i):
            depth += 1 if ch != "<" or segment.startswith("<<", i) else 0
            if segment.startswith("<<", i):
                i += 1
        elif ch in ")]}>" and not segment.startswith(">=", i):
            if ch != ">" or segment.startswith(">>", i):
                depth -= 1
                if segment.startswith(">>", i):
                    i += 1
        elif depth == 0 and segment.startswith(" /\\ ", i):
            spans.append((start + last, start + i))
            last = i + 4
            i += 3
        i += 1
    spans.append((start + last, end))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def effect_variables(text: str) -> dict[str, set[str]]:
    """For each definition, the variables it primes, through the operators it calls."""
    defs = definitions(text)
    direct = {d.name: set(_PRIMED.findall(_code(text[d.start : d.end]))) for d in defs}
    calls = {d.name: {n for n in direct if n != d.name and re.search(rf"\b{n}\b", _code(text[d.start : d.end]))} for d in defs}
    changed = True
    while changed:
        changed = False
        for name in direct:
            for callee in calls[name]:
                if not direct[callee] <= direct[name]:
                    direct[name] |= direct[callee]
                    changed = True
    return direct


_UNCHANGED = re.compile(r"UNCHANGED\s*(<<[^>]*>>|\w+)")


def framed_variables(text: str) -> dict[str, set[str]]:
    """For each definition, the variables and groups its own `UNCHANGED` clauses name."""
    found = {}
    for d in definitions(text):
        names: set[str] = set()
        for m in _UNCHANGED.finditer(_code(text[d.start : d.end])):
            names |= {n.strip() for n in m.group(1).strip("<>").split(",") if n.strip()}
        found[d.name] = names
    return found


def _code(text: str) -> str:
    """The text with every comment blanked out (same length, so offsets still match)."""
    return "\n".join(code + " " * (len(line) - len(code)) for line in text.split("\n") for code in [_strip_comment(line)[0]])


def generate(text: str) -> list[Mutant]:
    """Every guard, effect and altered-effect mutant of the module text, in text order."""
    defs = definitions(text)
    names = [d.name for d in defs]
    effects = effect_variables(text)
    frames = framed_variables(text)
    mutants: list[Mutant] = []
    for d in defs[: names.index(LAST)]:
        if d.name in NOT_MUTATED:
            continue
        counters = {"guard": 0, "effect": 0, "altered": 0}
        for kind, start, end, replacement, comment in _changes(text, d, effects, frames):
            counters[kind] += 1
            ident = f"{d.name}.{kind[0] if kind != 'altered' else 'a'}{counters[kind]}"
            line = text.count("\n", 0, start) + 1
            mutants.append(Mutant(ident, d.name, kind, line, start, end, text[start:end], replacement, comment))
    mutants.sort(key=lambda m: m.start)
    return mutants


def _changes(text: str, d: _Definition, effects: dict[str, set[str]], frames: dict[str, set[str]]):
    """(kind, start, end, replacement, comment) of each mutant of definition d, in the order they are numbered."""
    for c in conjuncts(text, d):
        if not c.leaf:
            continue
        for a, b in _split_plain(text, c.start, c.end):
            term = text[a:b]
            if "UNCHANGED" in term or "ghost" in c.comment:  # a ghost's update is the yardstick, not the spec
                continue
            called = {n for n in effects if effects[n] and re.search(rf"\b{n}\b", term)}
            if _PRIMED.search(term):
                m = re.fullmatch(r"\s*(\w+)' = (.*)", term, re.DOTALL)
                if m and m.group(2).strip() != m.group(1):
                    yield "effect", a, b, f"{m.group(1)}' = {m.group(1)}", c.comment
            elif called:
                touched = set().union(*(effects[n] for n in called))
                if "UNCHANGED" not in _code(text[d.start : d.end]):
                    # the call frames the whole step (FailCompute's FailBatches): what it keeps
                    # UNCHANGED stays so too, or the mutant leaves those variables unspecified
                    touched |= set().union(*(frames[n] for n in called))
                touched = sorted(touched)
                yield "effect", a, b, f"UNCHANGED <<{', '.join(touched)}>>", c.comment
            else:
                yield "guard", a, b, "TRUE", c.comment
    for m in _FIELD.finditer(_code(text[d.start : d.end])):
        a = d.start + m.end()
        b = _field_end(text, a, d.end)
        if b is not None and text[a:b].strip() != "@":
            yield "altered", a, b, "@", ""


def _field_end(text: str, start: int, limit: int) -> int | None:
    """End of the expression of an EXCEPT field that starts at `start`: the `,` or `]` closing it."""
    depth = 0
    i = start
    while i < limit:
        ch = text[i]
        if text.startswith("\\*", i):
            nl = text.find("\n", i)
            i = nl if nl != -1 else limit
            continue
        if text.startswith("<<", i):
            depth += 1
            i += 2
            continue
        if text.startswith(">>", i):
            depth -= 1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i if ch == "]" else None
            depth -= 1
        elif ch == "," and depth == 0:
            return i
        i += 1
    return None


# --- running them --------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """What TLC made of one mutant."""

    mutant: Mutant
    got: str  # "pass", "violation:NAME", "error:...", "not run"
    distinct: int | None
    seconds: float
    config: str = ""  # the model it ran on

    def verdict(self, baseline: int) -> str:
        """killed / redundant / bound / survives / error, as the kill table's verdict column says it."""
        if self.mutant.bound:
            return "model bound"
        if self.mutant.legal:
            return "legal" if self.got == "pass" else "REJECTS LEGAL"
        if self.got.startswith("violation:"):
            return "killed"
        if self.got.startswith("error:") or self.got == "deadlock":
            return "error"
        if self.got == "pass" and self.distinct == baseline and self.mutant.reason:
            return "redundant"
        return "SURVIVES"

    def detail(self, baseline: int) -> str:
        v = self.verdict(baseline)
        if v == "killed":
            return self.got.split(":", 1)[1]
        if v == "redundant":
            return f"{self.mutant.reason} ({self.distinct} states, as the spec)"
        if v == "model bound":
            return "not a protocol guard; not run"
        if v == "legal":
            return f"{self.mutant.legal} ({self.distinct} states, every invariant holds)"
        if v == "REJECTS LEGAL":
            return f"{self.got}: the spec forbids what it calls legal: {self.mutant.legal}"
        if v == "error":
            return self.got
        same = "same" if self.distinct == baseline else "other"
        why = f"; the spec claims redundant: {self.mutant.reason}" if self.mutant.reason else ""
        return f"{self.distinct} states ({same} count as the spec){why}"


def heap_megabytes(jobs: int) -> int:
    """Java heap for each of `jobs` TLCs run together: half the machine's memory shared out, at
    most 4 GiB each. Java's default (a quarter of the memory each) lets sixteen TLCs ask for four
    times the machine, and on the 16-core machine some were killed (`exit -9`)."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return max(256, min(4096, total // 2 // max(1, jobs)))


def run_tlc(spec_text: str, config: Path, *, java: str, jar: Path, workers: int, heap_mb: int | None = None) -> tuple[str, int | None, float, str]:
    """TLC on one spec text with `config`: (label, distinct states, seconds, output)."""
    from cacheruntime.tlc import parse_output

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cacheruntime-specmut-") as tmp:
        work = Path(tmp)
        (work / "CacheRuntime.tla").write_text(spec_text)
        (work / "MC.cfg").write_text(config.read_text())
        cmd = [*tlc_java(java, jar, work, heap_mb), "-workers", str(workers)]
        cmd += ["-metadir", str(work / "states"), "-deadlock", "-config", "MC.cfg", "CacheRuntime.tla"]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    got, distinct, _ = parse_output(out, proc.returncode)
    return got, distinct, time.monotonic() - started, out


def model_of(m: Mutant, configs: dict[str, Path]) -> Path:
    """The model mutant m runs on: its own (`configs` by mutant id: one effect no model of its
    definition reaches, such as a plan intent applied at execute), else its definition's, else
    the dedicated one ("")."""
    return configs.get(m.ident, configs.get(m.definition, configs[""]))


def run_all(spec_text: str, mutants: list[Mutant], configs: dict[str, Path], *, java: str, jar: Path, workers: int, jobs: int, progress=None) -> list[Result]:
    """Every mutant through TLC (`jobs` at a time) on its model (`model_of`); model bounds are
    listed, not run."""

    def one(m: Mutant) -> Result:
        config = model_of(m, configs)
        if m.bound:
            return Result(m, "not run", None, 0.0, config.name)
        got, distinct, seconds, _ = run_tlc(m.apply(spec_text), config, java=java, jar=jar, workers=workers, heap_mb=heap_megabytes(jobs))
        r = Result(m, got, distinct, seconds, config.name)
        if progress:
            progress(r)
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, mutants))


VERDICTS = ("killed", "redundant", "legal", "SURVIVES", "REJECTS LEGAL", "error", "model bound")


def counts(results: list[Result], baselines: dict[str, int]) -> dict[str, int]:
    found = {v: 0 for v in VERDICTS}
    for r in results:
        found[r.verdict(baselines[r.config])] += 1
    return found


def format_table(results: list[Result], baselines: dict[str, int]) -> str:
    """The kill table: mutant, line, what changed, verdict, by what or why, model, seconds."""
    rows = [("mutant", "line", "change", "verdict", "killed by / reason", "model", "seconds")]
    for r in results:
        b = baselines[r.config]
        rows.append((r.mutant.ident, str(r.mutant.line), r.mutant.summary, r.verdict(b), r.detail(b), r.config, f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    c = counts(results, baselines)
    models = ", ".join(f"{name} {n}" if n >= 0 else f"{name} not run (no mutant passed)" for name, n in baselines.items())
    lines.append(f"{len(results)} mutants: " + ", ".join(f"{c[v]} {v}" for v in VERDICTS) + f" (distinct states of the spec: {models})")
    return "\n".join(lines)


def expected_of(result: Result, baseline: int) -> str:
    """The verdict as the manifest's CI subset writes it: `killed:NAME`, `redundant`, ..."""
    v = result.verdict(baseline)
    return f"killed:{result.detail(baseline)}" if v == "killed" else v


def run_cli(manifest: dict, tla_dir: Path, *, subset: str, java: str, jar: Path, workers: int, jobs: int) -> int:
    """`cacheruntime tlc --spec-mutants [all|ci|IDS]`: the baseline, then the mutants, then the kill table.

    Fails when the baseline's state count differs from the manifest's, when a mutant of the CI
    subset gets another verdict than the manifest's, and (all) when a mutant survives or ends in
    an evaluation error.
    """
    section = manifest["spec_mutants"]
    spec_text = (tla_dir / "CacheRuntime.tla").read_text()
    mutants = generate(spec_text)
    expected: dict[str, str] = {}
    if subset == "ci":
        expected = section["ci"]
        unknown = sorted(set(expected) - {m.ident for m in mutants})
        if unknown:
            print(f"cacheruntime tlc: error: the manifest's CI mutants {unknown} are not generated from the spec", file=sys.stderr)
            return 1
        mutants = [m for m in mutants if m.ident in expected]
    elif subset != "all":
        chosen = set(subset.split(","))
        unknown = sorted(chosen - {m.ident for m in mutants} - {m.definition for m in mutants})
        if unknown:
            print(f"cacheruntime tlc: error: no mutant or definition named {unknown}; `--spec-mutants all` lists every mutant id", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.ident in chosen or m.definition in chosen]
    # the dedicated model, and a model of its own for a definition (or one mutant) the dedicated one cannot reach
    pinned = {section["config"]: section["distinct_states"]} | {o["config"]: o["distinct_states"] for o in section.get("models", {}).values()}
    configs = {"": tla_dir / section["config"]} | {d: tla_dir / o["config"] for d, o in section.get("models", {}).items()}
    baselines: dict[str, int] = {}

    def baseline_of(name: str) -> bool:
        """TLC on the unmutated spec with model `name`: it must pass with the pinned count."""
        got, baseline, seconds, out = run_tlc(spec_text, tla_dir / name, java=java, jar=jar, workers=workers * jobs)
        print(f"the spec on {name}: {got} ({baseline} distinct states, {seconds:.1f}s)", flush=True)
        if got != "pass" or baseline != pinned[name]:
            print(out[-3000:])
            print(f"the unmutated spec must pass on {name} with {pinned[name]} distinct states (the manifest's)")
            return False
        baselines[name] = baseline
        return True

    # The baselines run first, so that a spec that fails by itself stops the run. The CI
    # subset pins only kills, which need no baseline (the CI model every-action pins the same
    # count): its baselines run only for a model on which a mutant passed.
    used = sorted({model_of(m, configs).name for m in mutants})
    if subset != "ci" and not all(baseline_of(name) for name in used):
        return 1

    def progress(r: Result) -> None:
        if r.got == "pass" and r.config not in baselines and not baseline_of(r.config):
            raise SystemExit(1)
        b = baselines.get(r.config, -1)
        print(f"  {r.mutant.ident}: {r.verdict(b)} {r.detail(b)} ({r.config}, {r.seconds:.1f}s)", flush=True)

    started = time.monotonic()
    results = run_all(spec_text, mutants, configs, java=java, jar=jar, workers=workers, jobs=jobs, progress=progress)
    baselines.update({name: -1 for name in used if name not in baselines})  # no mutant passed there: no count to compare
    print(format_table(results, baselines))
    print(f"{time.monotonic() - started:.0f}s for {len(results)} mutants, {jobs} at a time, {workers} TLC worker(s) each")
    if subset == "ci":
        got_of = {r.mutant.ident: expected_of(r, baselines[r.config]) for r in results}
        wrong = [f"{i}: {got_of[i]} (manifest: {expected[i]})" for i in expected if got_of[i] != expected[i]]
        for line in wrong:
            print(f"DIFFERS {line}")
        return 1 if wrong else 0
    c = counts(results, baselines)
    return 1 if c["SURVIVES"] or c["REJECTS LEGAL"] or c["error"] else 0
