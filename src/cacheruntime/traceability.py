"""The traceability check: every artifact `spec/invariants.md` names for an id must exist.

The catalogue's matrix has one row per invariant id and one column per artifact kind.
A cell is either `planned`, `n/a`, or one or more names in backticks. For each name the
check looks in the artifact's files for a definition of it:

| column | where | what counts as found |
|---|---|---|
| spec | `spec/protocol.md` | the id itself appears in the text |
| TLA+ | `tla/*.tla` | a definition `Name ==` |
| model | `src/cacheruntime/**/*.py` (non-test) | `def Name` |
| conformance | `src/cacheruntime/conformance/**/*.py` | the name appears (a rule, check or mutant) |
| Z3 | `src/cacheruntime/z3check*` | the name appears |

The files are this checkout's, `--repo DIR`'s, or (installed from a wheel) the copy of
spec/ and tla/ in the wheel beside the installed package's sources (cacheruntime.specfiles).

It also fails if an id of the design brief's catalogue has no row. Run it as
`cacheruntime trace`; the test suite runs it too. `cacheruntime trace` also runs the
glossary check (`cacheruntime.glossary`: every name of `spec/glossary.md` exists).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from cacheruntime import glossary, specfiles

#: The ids the design brief catalogues; every one must have a row.
CATALOGUE = ("H1", "H2", "H3", "R1", "R2", "R3", "R4", "E1", "E2", "E3", "E4", "O1", "O2", "O3", "O4", "B1", "B2", "D1")

COLUMNS = ("spec", "TLA+", "model", "conformance", "Z3")

_NAME = re.compile(r"`([^`]+)`")


def repository_root(repo: Path | None = None) -> Path:
    """The folder to check: `repo`, else the checkout at hand, else the wheel's copy (see cacheruntime.specfiles)."""
    return specfiles.root(repo)


def read_matrix(catalogue: Path) -> dict[str, dict[str, str]]:
    """The matrix rows of `spec/invariants.md`: id -> column -> cell text."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in catalogue.read_text().splitlines():
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "id" and all(col in cells for col in COLUMNS):
            header = cells
            continue
        if header and re.fullmatch(r"[A-Z]\d+", cells[0]):
            rows[cells[0]] = dict(zip(header, cells))
    return rows


def _sources(root: Path, pattern: str, exclude: str | None = None) -> str:
    texts = []
    for path in sorted(root.glob(pattern)):
        if path.is_file() and (exclude is None or exclude not in path.parts):
            texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def check(root: Path) -> list[str]:
    """Every traceability problem found; empty when the matrix is honest."""
    catalogue = root / "spec" / "invariants.md"
    if not catalogue.exists():
        return [f"{catalogue} is missing"]
    rows = read_matrix(catalogue)
    src = specfiles.sources(root)
    problems = [f"{i}: no row in spec/invariants.md" for i in CATALOGUE if i not in rows]
    corpora = {
        "spec": _sources(root, "spec/protocol.md"),
        "TLA+": _sources(root, "tla/*.tla"),
        "model": _sources(src, "**/*.py", exclude="conformance"),
        "conformance": _sources(src, "conformance/**/*.py"),
        "Z3": _sources(src, "z3check*") + _sources(src, "z3check/**/*.py"),
    }
    for invariant, row in rows.items():
        for column in COLUMNS:
            cell = row.get(column, "")
            if cell in ("planned", "n/a"):
                continue
            if column == "spec":
                if not re.search(rf"\b{invariant}\b", corpora["spec"]):
                    problems.append(f"{invariant}: spec/protocol.md never mentions {invariant}")
                continue
            names = _NAME.findall(cell)
            if not names:
                problems.append(f"{invariant}/{column}: cell {cell!r} names nothing (use `Name`, planned or n/a)")
            for name in names:
                if not _found(column, name, corpora[column]):
                    problems.append(f"{invariant}/{column}: `{name}` not found in the {column} artifacts")
    return problems


def _found(column: str, name: str, corpus: str) -> bool:
    if column == "TLA+":
        return re.search(rf"^{re.escape(name)}(\(.*\))?\s*==", corpus, re.MULTILINE) is not None
    if column == "model":
        return re.search(rf"\bdef {re.escape(name)}\b", corpus) is not None
    return re.search(rf"\b{re.escape(name)}\b", corpus) is not None


def planned(root: Path) -> list[str]:
    """Cells still marked planned: artifacts not yet built."""
    rows = read_matrix(root / "spec" / "invariants.md")
    return [f"{i}/{c}" for i, row in rows.items() for c in COLUMNS if row.get(c) == "planned"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    specfiles.add_repo_option(parser)


def main(args: argparse.Namespace) -> int:
    root = repository_root(args.repo)
    problems = check(root) + glossary.check(root)
    rows = read_matrix(root / "spec" / "invariants.md") if (root / "spec" / "invariants.md").exists() else {}
    for problem in problems:
        print(f"FAIL {problem}")
    todo = planned(root) if rows else []
    print(f"traceability: {len(rows)} ids, {len(problems)} problems, {len(todo)} cells planned")
    return 1 if problems else 0
