"""The traceability check passes on this checkout and fails when a named artifact is missing."""

import shutil
from pathlib import Path

from cacheruntime import traceability

ROOT = Path(__file__).resolve().parents[1]


def test_every_named_artifact_exists():
    assert traceability.check(ROOT) == []


def test_a_missing_artifact_is_reported(tmp_path):
    for part in ("spec", "tla", "src"):
        if (ROOT / part).exists():
            shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "states"))
    catalogue = tmp_path / "spec" / "invariants.md"
    text = catalogue.read_text().replace("`R4_no_double_free`", "`R4_no_such_predicate`", 1)
    catalogue.write_text(text)
    problems = traceability.check(tmp_path)
    assert any("R4_no_such_predicate" in p for p in problems), problems


def test_a_missing_row_is_reported(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "invariants.md").write_text("| id | spec | TLA+ | model | conformance | Z3 |\n|---|---|---|---|---|---|\n")
    (tmp_path / "spec" / "protocol.md").write_text("")
    problems = traceability.check(tmp_path)
    assert "H1: no row in spec/invariants.md" in problems
