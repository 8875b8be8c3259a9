"""The bench section `l3` (benchmarks/l3.py): a CPU smoke run at the quick sizes, its rows and what they carry.

CPU figures say nothing about the H200's targets, so this checks structure: every row of
each store is there, with its object size, a finite positive value and baseline, and the
file store's fetch rows with the 0.90 target; the store's folder is emptied after. The
Mooncake store runs where the [mooncake] extra is installed (CI has it).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = importlib.util.find_spec("mooncake") is not None
STORES = ["file", "mooncake"] if MOONCAKE else ["file"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    folder = tmp_path_factory.mktemp("l3")
    out, store_dir = folder / "l3.json", folder / "store"
    command = [sys.executable, "-m", "cacheruntime.cli", "bench", "--repo", str(ROOT), "--device", "cpu", "--quick", "--only", "l3"]
    command += ["--l3-stores", ",".join(STORES), "--l3-dir", str(store_dir), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout, store_dir


def test_every_row_of_every_store_is_there(smoke: tuple[dict, str, Path]) -> None:
    doc, stdout, _ = smoke
    assert doc["failures"] == []
    rows = doc["rows"]
    assert {r["section"] for r in rows} == {"l3"}
    for store in STORES:
        names = [r["measurement"] for r in rows if f"{store} store" in r["measurement"]]
        caches = ("warm", "cold") if store == "file" else ("memory",)
        expected = ["l3 persist L1->L3"]
        expected += [f"l3 {what}" for _ in caches for what in ("fetch L3->L1", "host blocked in prepare_batch issuing the fetch")]
        expected += ["l3 step time, fetch in flight", "l3 step time, persist in flight"]
        assert [name.split(",")[0].split(" (")[0] for name in names] == [e.split(",")[0] for e in expected], names
        for cache in caches:
            assert sum(name.endswith(f", {cache}") or f", {cache} (apart: " in name for name in names) == 2
    assert "l3 fetch L3->L1, file store" in stdout  # the table is printed


def test_rows_state_the_object_size_and_carry_finite_figures(smoke: tuple[dict, str, Path]) -> None:
    doc, _, _ = smoke
    for r in doc["rows"]:
        for key in ("value", "baseline", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["measurement"], key, r[key])
        assert "KiB objects" in r["measurement"] or "MiB objects" in r["measurement"]
        detail = r["detail"]
        if "fetch L3->L1" in r["measurement"] or "persist L1->L3" in r["measurement"]:
            assert detail["bytes"] == detail["objects"] * detail["object_bytes"] > 0
            assert len(detail["seconds_per_rep"]) == len(detail["raw_seconds_per_rep"]) == doc["meta"]["config"]["reps"]
        if "fetch L3->L1" in r["measurement"]:
            assert detail["store_get_alone_s"] > 0 and detail["staging_to_device_alone_s"] > 0
        if r["measurement"].startswith("l3 step time"):
            assert detail["transfer_alone_s"] > 0 and math.isfinite(detail["exposed_fraction"])


def test_targets_are_the_issues(smoke: tuple[dict, str, Path]) -> None:
    doc, _, _ = smoke
    for r in doc["rows"]:
        name = r["measurement"]
        if name.startswith("l3 fetch L3->L1, file store"):
            assert r["target"] == "ratio >= 0.9" and r["met"] is (r["ratio"] >= 0.9)
        elif name.startswith(("l3 fetch", "l3 persist")):
            assert r["target"] == "" and r["met"] is None  # no target stated for these
        else:
            assert r["target"].startswith("ratio <= ") and isinstance(r["met"], bool)


def test_the_store_folder_is_emptied_after(smoke: tuple[dict, str, Path]) -> None:
    _, _, store_dir = smoke
    assert not [p for p in store_dir.rglob("*") if p.is_file() and not p.name.endswith(".log")]
