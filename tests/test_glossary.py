"""The glossary check passes on a consistent tree and names the row and file of a missing name.

The model and the runtime ledger are being rewritten to the glossary's names, so the
consistent tree here is a copy of this checkout's spec and TLA+ module with a model
package and a ledger that hold the records and operations of the names list (`RECORDS`),
written out by hand from it: the glossary is checked against that list, not against
itself.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from cacheruntime import glossary, traceability

ROOT = Path(__file__).resolve().parents[1]

#: The records, fields and section operations the model and the ledger share (names list).
RECORDS = '''
from dataclasses import dataclass

from cacheruntime.protocol import BatchState, CopyState, Tier


@dataclass
class Slot:
    """A request slot."""

    generation: int
    live: bool
    pages: list
    num_tokens: int
    reserved_tokens: int
    produced: int
    appended: int
    last_output: int


@dataclass
class Copy:
    phys: int
    state: CopyState


@dataclass
class Page:
    holders: int
    versions: list
    copies: dict


@dataclass
class Pool:
    total: int
    free: list
    tags: list
    deferred: dict


@dataclass
class Extent:
    pages: tuple
    refcount: int
    runs: tuple


@dataclass
class Batch:
    plan: object
    state: BatchState
    slots: tuple
    slot_set: frozenset
    starts: tuple
    ends: tuple
    start_tokens: tuple
    requests: tuple
    one_token: bool


@dataclass
class Transfer:
    kind: object
    extent_generation: int
    pages: list
    waits_for: set
    ticket: object
    touched: frozenset
    keys: tuple


@dataclass
class State:
    epoch: int
    slots: list
    pages: dict
    pools: dict
    extents: dict
    batches: dict
    finished: dict
    transfers: dict
    unreported: list
    next_page: int
    next_extent: int
    next_batch: int
    next_transfer: int
    next_version: int
    calls: dict
    lost: bool
    faults: tuple
    doomed: frozenset
    objects: dict
    keys: dict

    def states(self):
        return (CopyState.ABSENT, CopyState.FILLING, CopyState.VALID, CopyState.DROPPING, Tier.L1,
                BatchState.PREPARED, BatchState.EXECUTED, BatchState.CANCELLED, BatchState.FAILED)


FINISHED_BATCHES_KEPT = 256
vocab_size = 97
NO_STAGING = -1
L3_KINDS = HostMode = None
'''

#: The ledger has no L3 tier yet (the glossary's runtime cells say `n/a: planned`).
LEDGER_RECORDS = RECORDS  # the ledger mirrors the model record for record, the L3 fields included

OPERATIONS = (
    "open_request close_request prepare_batch execute_batch cancel_batch publish split retain release submit "
    "poll_completions wait_completions restart complete_transfer close_slot check_origin check_generation "
    "drop_holder free_phys take_phys new_pages new_extent start_transfer await_restores report unreserve fail_batches "
    "fail_transfer lose drop_or_keep_until_landed keep_dropping has_copy count_toward_fault "
    "start_l3_transfer start_persist fetch_into_row complete_l3 fail_l3 l3_exists remove_object"
).split()


def _tree(tmp_path: Path) -> Path:
    """A copy of this checkout's spec and TLA+ module, with a model package and a ledger stub."""
    for part in ("spec", "tla"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("states"))
    operations = "\n".join(f"def {name}(state):\n    return state\n\n" for name in OPERATIONS)
    for package, records in (("src/cacheruntime/model", RECORDS), ("src/cacheruntime/runtime/ledger", LEDGER_RECORDS)):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "records.py").write_text(records)
        (tmp_path / package / "sections.py").write_text(operations)
    return tmp_path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _tree(tmp_path)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def test_a_consistent_tree_passes(tree):
    assert glossary.check(tree) == []


def test_the_spec_and_tla_of_this_checkout_pass():
    assert glossary.check(ROOT, columns=("spec", "TLA+")) == []


def test_every_row_names_something_or_says_why_not():
    rows = glossary.read_rows(ROOT / glossary.GLOSSARY)
    assert len(rows) > 80
    for row in rows:
        for column in glossary.COLUMNS:
            assert row.names(column) or row.cells[column].startswith("n/a"), (row.line, column)
        if row.cells["runtime"].startswith("n/a: planned"):  # the L3 tier, until the runtime integrates it (issue 21)
            assert row.names("model"), f"line {row.line}: a planned runtime name is the model's"
            continue
        assert row.names("model") == row.names("runtime"), f"line {row.line}: model and ledger share every name"


def test_a_name_missing_from_the_tla_module_is_reported(tree):
    _edit(tree / "tla" / "CacheRuntime.tla", "tags1", "c1")
    _edit(tree / "tla" / "CacheRuntimeL3.tla", "tags1", "c1")  # the L3 module shares the name
    problems = glossary.check(tree)
    assert any("tags" in p and "TLA+" in p and "`tags1` not found in tla/CacheRuntime.tla" in p for p in problems), problems


def test_a_name_missing_from_the_spec_is_reported(tree):
    _edit(tree / "spec" / "protocol.md", "deferred free", "delayed free")
    problems = glossary.check(tree)
    assert any(", spec): `deferred free` not found in spec/protocol.md" in p for p in problems), problems


def test_a_field_missing_from_the_ledger_is_reported_with_its_row(tree):
    _edit(tree / "src/cacheruntime/runtime/ledger/records.py", "    tags: list\n", "    believed: list\n")
    problems = glossary.check(tree)
    line = next(r.line for r in glossary.read_rows(tree / glossary.GLOSSARY) if "Pool.tags" in r.names("runtime"))
    assert any(
        f"spec/glossary.md:{line} " in p
        and "runtime" in p
        and "`Pool.tags` not found in src/cacheruntime/runtime/local.py, src/cacheruntime/runtime/l3calls.py, src/cacheruntime/runtime/ledger" in p
        for p in problems
    ), problems
    assert any("runtime field `Pool.believed`" in p and "has no row" in p for p in problems), problems


def test_an_operation_missing_from_the_model_is_reported(tree):
    _edit(tree / "src/cacheruntime/model/sections.py", "def complete_transfer(", "def retire_transfer(")
    problems = glossary.check(tree)
    assert any("model" in p and "`complete_transfer` not found in src/cacheruntime/model/" in p for p in problems), problems


def test_matching_is_by_whole_word(tree):
    _edit(tree / "src/cacheruntime/model/sections.py", "def drop_holder(", "def drop_holders(")
    _edit(tree / "tla" / "CacheRuntime.tla", "numTokens", "numTokensX")
    problems = glossary.check(tree)
    assert any("`drop_holder` not found" in p for p in problems), problems
    assert any("`numTokens` not found" in p for p in problems), problems


def test_a_private_python_name_counts(tree):
    _edit(tree / "src/cacheruntime/model/sections.py", "def drop_holder(", "def _drop_holder(")
    assert glossary.check(tree) == []


def test_a_tla_variable_without_a_row_is_reported(tree):
    _edit(tree / "tla" / "CacheRuntime.tla", "    nextVersion     \\*", "    nextVersion,    \\* x\n    spare           \\*")
    problems = glossary.check(tree)
    assert any("TLA+ variable `spare`" in p for p in problems), problems


def test_a_missing_ledger_fails(tree):
    shutil.rmtree(tree / "src/cacheruntime/runtime/ledger")
    problems = glossary.check(tree)
    assert any(
        p.startswith("runtime: no files at src/cacheruntime/runtime/local.py, src/cacheruntime/runtime/l3calls.py, src/cacheruntime/runtime/ledger/")
        for p in problems
    ), problems


def test_cacheruntime_trace_runs_the_glossary_check(tree, capsys):
    _edit(tree / "spec" / "protocol.md", "deferred free", "delayed free")
    assert traceability.main(argparse.Namespace(repo=tree)) == 1
    assert "`deferred free` not found in spec/protocol.md" in capsys.readouterr().out
