"""benchmarks/diagnostics/copypaths.py on CPU: its copy plans move the same bytes as the runtime's copies.

The diagnostic times those plans on CUDA (cudaMemcpyBatchAsync, cudaMemcpy2DAsync, page-major
copies); here each plan is applied with plain tensor copies and compared with `KVMemory`'s own
CPU restore and backup on the same scattered pages, so a wrong offset or pitch fails here.
"""

from __future__ import annotations

import random

import pytest
import torch

from benchmarks.diagnostics import copypaths
from benchmarks.harness import scattered_runs
from benchmarks.hooks import KVMemory


def _memory() -> KVMemory:
    mem = KVMemory(device=torch.device("cpu"), l1_pages=24, l2_pages=24, page_size=4, layers=3, heads=2, head_dim=8, dtype=torch.bfloat16)
    mem.l2.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, mem.l2.shape, dtype=torch.int16, generator=torch.Generator().manual_seed(1)))
    mem.l1.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, mem.l1.shape, dtype=torch.int16, generator=torch.Generator().manual_seed(2)))
    return mem


@pytest.mark.parametrize("restore", [True, False], ids=["restore", "backup"])
@pytest.mark.parametrize("run", [1, 2, 3])
def test_plans_move_the_runtime_s_bytes(run: int, restore: bool) -> None:
    rng = random.Random(run)
    host = scattered_runs(list(range(24)), run, 6, rng)[:6]
    dev = scattered_runs(list(range(24)), run, 6, rng)[:6]
    reference = _memory()
    if restore:
        reference.restore(host, dev)
    else:
        reference.backup(dev, host)
    for plan in ("rows", "2d"):
        mem = _memory()
        src, dst = (mem.l2, mem.l1) if restore else (mem.l1, mem.l2)
        if plan == "rows":
            copypaths.apply_pieces(src, dst, copypaths.row_pieces(mem, host, dev, restore=restore))
        else:
            copypaths.apply_2d(src, dst, copypaths.page_2d(mem, host, dev, restore=restore))
        expected = reference.l1 if restore else reference.l2
        assert torch.equal(dst.view(torch.int16), expected.view(torch.int16)), plan


def test_joint_runs_merge_only_pages_consecutive_on_both_sides() -> None:
    pieces = copypaths.joint_runs([4, 5, 6, 9, 10], [0, 1, 7, 8, 9], 100)
    assert pieces == [copypaths.Piece(400, 0, 200), copypaths.Piece(600, 700, 100), copypaths.Piece(900, 800, 200)]
    src = torch.arange(1200, dtype=torch.uint8)
    dst = torch.zeros(1200, dtype=torch.uint8)
    copypaths.apply_pieces(src, dst, pieces)
    for s, d in zip([4, 5, 6, 9, 10], [0, 1, 7, 8, 9], strict=True):
        assert torch.equal(dst[d * 100 : d * 100 + 100], src[s * 100 : s * 100 + 100])


def test_main_without_cuda_says_so(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert copypaths.main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out
