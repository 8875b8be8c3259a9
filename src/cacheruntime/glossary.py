"""The glossary check: every name `spec/glossary.md` gives a concept exists where it says.

One name per concept is a promise the spec, the TLA+ module, the model and the runtime's
ledger make together; this check is what keeps it. The glossary is a table with one row
per concept and one column per artifact:

| column | searched in | a name is found when |
|---|---|---|
| spec | `spec/protocol.md` | the word or phrase occurs as whole words (any case) |
| TLA+ | `tla/CacheRuntime.tla`, `tla/CacheRuntimeL3.tla` (the L3 tier) | the identifier occurs as a whole word; `var.field` also needs `.field` or `field \\|->` |
| model | `src/cacheruntime/model/**/*.py` | see below |
| runtime | `src/cacheruntime/runtime/local.py` and `runtime/l3calls.py` (the boundary operations), `src/cacheruntime/runtime/ledger/**/*.py` | see below |

In the Python columns a name `Record.field` is found when the files define
`class Record` and `field` occurs as a whole word in its body; a dotted name whose first
part is not a class defined there (`CopyState.ABSENT`, an enum of protocol.py) must occur
as written. Any other name must occur as a whole word, optionally with Python's private
`_` in front. A cell gives its names in backticks; a cell that starts with `n/a` says why
the concept has no name there (names quoted in that note are not checked).

Two more rules keep the glossary complete: every variable the TLA+ module declares is
named in the TLA+ column, and every annotated field of a record the Python columns name
(`class Slot` for `Slot.live`) is in the glossary, so a field added to the model or the
ledger without a row fails too.

`cacheruntime trace` runs it beside the invariant catalogue's check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cacheruntime import specfiles

GLOSSARY = Path("spec") / "glossary.md"

COLUMNS = ("spec", "TLA+", "model", "runtime")

#: Where each column's names must be found: globs relative to the folder holding the spec
#: files (spec, TLA+), or to the package's sources beside them (model, runtime), which
#: `specfiles.sources` finds in a checkout and in an installed wheel alike.
SOURCES: dict[str, tuple[str, ...]] = {
    "spec": ("spec/protocol.md",),
    "TLA+": ("tla/CacheRuntime.tla", "tla/CacheRuntimeL3.tla"),
    "model": ("model/**/*.py",),
    "runtime": ("runtime/local.py", "runtime/l3calls.py", "runtime/ledger/**/*.py"),
}
_IN_SOURCES = frozenset({"model", "runtime"})

_NAME = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    """One concept: its glossary line and the names each column gives it."""

    line: int
    concept: str
    cells: dict[str, str]

    def names(self, column: str) -> list[str]:
        """The names a cell gives (none for an `n/a` cell: names in its note are only quoted)."""
        cell = self.cells.get(column, "")
        return [] if cell.startswith("n/a") else _NAME.findall(cell)


@dataclass(frozen=True)
class Corpus:
    """The text one column is searched in, and the files it came from (for messages)."""

    where: str
    text: str

    @classmethod
    def read(cls, root: Path, base: Path, patterns: Sequence[str]) -> Corpus:
        """The files of `patterns` under `base`, named relative to `root` where they lie inside it."""
        files = sorted({p for pattern in patterns for p in base.glob(pattern) if p.is_file() and "__pycache__" not in p.parts})
        prefix = base.relative_to(root).as_posix() + "/" if base.is_relative_to(root) and base != root else ""
        return cls(", ".join(prefix + pattern for pattern in patterns), "\n".join(p.read_text(errors="replace") for p in files))


def read_rows(glossary: Path) -> list[Row]:
    """The table rows of the glossary: every table whose header is concept + the columns."""
    rows: list[Row] = []
    header: list[str] | None = None
    for number, line in enumerate(glossary.read_text().splitlines(), start=1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "concept" and all(c in cells for c in COLUMNS):
            header = cells
        elif header and not set(cells[0]) <= set("-: "):
            rows.append(Row(number, cells[0], dict(zip(header, cells, strict=False))))
    return rows


def check(root: Path, columns: Iterable[str] = COLUMNS) -> list[str]:
    """Every glossary problem found under `root`; empty when every name is where it should be."""
    glossary = root / GLOSSARY
    if not glossary.exists():
        return [f"{GLOSSARY} is missing"]
    rows = read_rows(glossary)
    if not rows:
        return [f"{GLOSSARY}: no table with the columns concept | {' | '.join(COLUMNS)}"]
    problems: list[str] = []
    for column in columns:
        corpus = Corpus.read(root, specfiles.sources(root) if column in _IN_SOURCES else root, SOURCES[column])
        if not corpus.text:
            problems.append(f"{column}: no files at {corpus.where}; its {sum(bool(r.names(column)) for r in rows)} rows are unchecked")
            continue
        for row in rows:
            problems += _check_cell(row, column, corpus)
        problems += _complete(rows, column, corpus)
    return problems


def _check_cell(row: Row, column: str, corpus: Corpus) -> list[str]:
    where = f"{GLOSSARY}:{row.line} ({row.concept!r}, {column})"
    names = row.names(column)
    if not names:
        if row.cells.get(column, "").startswith("n/a"):
            return []
        return [f"{where}: the cell names nothing (use `name`, or n/a and why)"]
    return [f"{where}: `{name}` not found in {corpus.where}" for name in names if not found(column, name, corpus.text)]


def found(column: str, name: str, text: str) -> bool:
    """Whether `name` of a glossary column occurs in that column's text (whole words only)."""
    if column == "spec":
        return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None
    if column == "TLA+":
        variable, _, field = name.partition(".")
        if not _word(variable, text):
            return False
        return not field or re.search(rf"\.{re.escape(field)}(?!\w)|(?<!\w){re.escape(field)} \|->", text) is not None
    record, _, field = name.partition(".")
    if field and "." not in field:
        body = class_body(record, text)
        if body is not None:
            return _word(field, body)
    return re.search(rf"(?<!\w)_?{re.escape(name)}(?!\w)", text) is not None


def _word(name: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def class_body(name: str, text: str) -> str | None:
    """The body of `class name` in Python source `text` (None if no such class)."""
    match = re.search(rf"^(?P<indent>[ \t]*)class {re.escape(name)}\b[^\n]*\n", text, re.MULTILINE)
    if match is None:
        return None
    indent = len(match.group("indent"))
    body = []
    for line in text[match.end() :].splitlines():
        if line.strip() and _indent(line) <= indent:
            break
        body.append(line)
    return "\n".join(body)


def _complete(rows: list[Row], column: str, corpus: Corpus) -> list[str]:
    """Names the artifact has and the glossary lacks: TLA+ variables, fields of named records."""
    named = {name for row in rows for name in row.names(column)}
    if column == "TLA+":
        blocks = re.findall(r"^VARIABLES?\b(.*?)\n(?=\S)", corpus.text, re.MULTILINE | re.DOTALL)  # one per variable group
        variables = [v for block in blocks for v in re.findall(r"^[ \t]*(\w+),?[ \t]*(?:\\\*.*)?$", block, re.MULTILINE)]
        mentioned = {n.partition(".")[0] for n in named}
        return [f"{GLOSSARY}: TLA+ variable `{v}` ({corpus.where}) has no row" for v in variables if v not in mentioned]
    if column not in ("model", "runtime"):
        return []
    problems = []
    records = sorted({n.partition(".")[0] for n in named if "." in n and class_body(n.partition(".")[0], corpus.text) is not None})
    for record in records:
        body = re.sub(r'("""|\'\'\').*?\1', "", class_body(record, corpus.text) or "", flags=re.DOTALL)
        lines = [line for line in body.splitlines() if line.strip()]
        top = min((_indent(line) for line in lines), default=0)
        fields = [m.group(1) for line in lines if _indent(line) == top and (m := re.match(r"\s*(\w+)\s*:", line))]
        problems += [
            f"{GLOSSARY}: {column} field `{record}.{f}` ({corpus.where}) has no row" for f in fields if f"{record}.{f}" not in named and not f.startswith("_")
        ]
    return problems


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
