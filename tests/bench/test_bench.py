"""`cacheruntime bench` (benchmarks/ of this checkout): the CPU smoke run's output structure, and the bench's own pieces.

CPU cannot meet GPU targets, so the smoke test checks structure and that every ratio is a
finite positive number, never target values.
"""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from benchmarks import harness, report, timeline
from benchmarks.hooks import KVMemory
from benchmarks.sglangcpu import installed
from cacheruntime.pageruns import coalesce

ROOT = Path(__file__).resolve().parents[2]
SGLANG = installed()  # then the smoke run has the cpu-sglang section too


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "cacheruntime.cli", "bench", "--repo", str(ROOT), "--device", "cpu", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_smoke_prints_the_table(smoke: tuple[dict, str]) -> None:
    _, stdout = smoke
    header = next(line for line in stdout.splitlines() if line.startswith("measurement"))
    assert [c.strip() for c in header.split("|")] == ["measurement", "value", "baseline", "ratio", "target", "met"]


def test_smoke_json_structure(smoke: tuple[dict, str]) -> None:
    doc, _ = smoke
    assert doc["failures"] == []
    assert {"date", "command", "torch", "device", "config"} <= doc["meta"].keys()
    rows = doc["rows"]
    sections = {r["section"] for r in rows}
    assert sections == {"transfer", "overlap", "itl", "cpu"} | ({"cpu-sglang"} if SGLANG else set())
    for r in rows:
        assert {"measurement", "value", "baseline", "ratio", "target", "met", "unit"} <= r.keys()
        for key in ("value", "baseline", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["measurement"], key, r[key])
        assert isinstance(r["met"], bool)
        assert r["target"]
    transfer = [r for r in rows if r["section"] == "transfer"]
    for ps in (16, 64):
        for run in (1, 8, 64):
            for kind in ("restore", "backup"):
                assert any(r["detail"]["page_size"] == ps and r["detail"]["run"] == run and r["measurement"].startswith(kind) for r in transfer)
    assert sorted(r["detail"]["batch"] for r in rows if r["section"] == "cpu") == [1, 16, 64, 256]
    if not SGLANG:  # cpu-sglang runs where SGLang is importable (tests/bench/test_cpu_sglang.py); here it says why not
        assert "SGLang is not importable" in doc["meta"]["skipped"]["cpu-sglang"]


@pytest.mark.parametrize("run", [1, 3, 8])
def test_scattered_runs_are_exact_and_separated(run: int) -> None:
    pages = list(range(200))
    order = harness.scattered_runs(pages, run, 40, random.Random(run))
    assert sorted(order) == pages
    head = order[: -(-40 // run) * run]
    runs = coalesce(sorted(head))
    assert all(r.page_count == run for r in runs)  # never adjacent, so never merged


def _memory(seed: int) -> KVMemory:
    mem = KVMemory(device=torch.device("cpu"), l1_pages=24, l2_pages=20, page_size=4, layers=3, heads=2, head_dim=8, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    mem.l1.copy_(torch.randn(mem.l1.shape, generator=gen))
    mem.l2.copy_(torch.randn(mem.l2.shape, generator=gen))
    return mem


@pytest.mark.parametrize("chunk_pages", [1, 3, 100])
def test_row_indexed_transfers_move_whole_pages(chunk_pages: int) -> None:
    """KVMemory's restore/backup (row-indexed, chunked) against a page-by-page reference."""
    rng = random.Random(chunk_pages)
    src_l2 = rng.sample(range(20), 9)
    dst_l1 = rng.sample(range(24), 9)
    mem = _memory(1)
    mem.chunk_pages = chunk_pages
    want_l1, l2 = mem.l1.clone(), mem.l2.clone()
    for s, d in zip(src_l2, dst_l1):
        want_l1[:, :, d] = l2[s].view(mem.page_shape)
    mem.restore(src_l2, dst_l1)
    assert torch.equal(mem.l1, want_l1) and torch.equal(mem.l2, l2)
    want_l2 = l2.clone()
    for s, d in zip(dst_l1[::-1], src_l2):
        want_l2[d] = want_l1[:, :, s].reshape(-1)
    mem.backup(dst_l1[::-1], src_l2)
    assert torch.equal(mem.l1, want_l1) and torch.equal(mem.l2, want_l2)


def test_row_ratio_and_target() -> None:
    row = report.Row("s", "m", "GB/s", 45.0, 50.0, "base", "ratio", ">=", 0.9)
    assert row.ratio == pytest.approx(0.9) and row.met is True
    row = report.Row("s", "m", "frac", 0.2, 1.0, "base", "value", "<=", 0.05)
    assert row.met is False and row.target == "value <= 0.05"


def test_timeline_spans_and_builtin_png(tmp_path: Path) -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "gemm", "tid": 7, "ts": 100.0, "dur": 50.0},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "tid": 13, "ts": 110.0, "dur": 30.0},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "tid": 15, "ts": 160.0, "dur": 20.0},
            {"ph": "X", "cat": "user_annotation", "name": "bench: prepare 1", "tid": 1, "ts": 90.0, "dur": 5.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 95.0, "dur": 1.0},
        ]
    }
    lanes = timeline.spans(trace)
    assert next(iter(lanes)) == "host (control)"
    assert any(name.startswith("H2D") for name in lanes) and any(name.startswith("D2H") for name in lanes)
    assert lanes["host (control)"] == [(0.0, 5.0, "prepare")]
    path = tmp_path / "t.png"
    timeline.write_png(str(path), timeline.raster([("t", lanes)], width=64))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 64 and height == 6 + 22 * len(lanes)
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    assert len(zlib.decompress(idat)) == height * (1 + 3 * width)
