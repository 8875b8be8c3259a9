"""KVMemory's copy paths: which path a page list takes, and that every path moves the right bytes.

On CPU: the 2D plan (one copy per page, its offsets and pitches) applied with plain tensor
copies moves the same bytes as the CPU restore and backup, and the short-run rule. On CUDA
(marked `cuda`): each path (2D copies, the UVA kernel, staged DMA) against a page-by-page
reference, one direction and both at once on two streams, the backup's page index written
by a kernel equal to the uploaded one, and a staged backup issuing no H2D copy (its page
index is read in place: an H2D copy on the D2H stream would queue behind restores).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cacheruntime.runtime.device.memory import KVMemory, _runs


def _memory(device: str = "cpu", l1_pages: int = 40, l2_pages: int = 36, **sizes: int) -> KVMemory:
    shape = dict(page_size=4, layers=3, heads=2, head_dim=8) | sizes
    page_bytes = shape["layers"] * 2 * shape["page_size"] * shape["heads"] * shape["head_dim"] * 2
    mem = KVMemory(device=torch.device(device), l1_pages=l1_pages, l2_pages=l2_pages, dtype=torch.bfloat16, chunk_bytes=4 * page_bytes, **shape)
    gen = torch.Generator().manual_seed(7)
    mem.l2.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, mem.l2.shape, dtype=torch.int16, generator=gen))
    mem.l1.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, mem.l1.shape, dtype=torch.int16, generator=gen).to(mem.l1.device))
    return mem


def _scattered(pool: int, run: int, count: int, rng: random.Random) -> list[int]:
    """`count` distinct pages of `pool` in runs of `run` consecutive pages, runs apart and shuffled."""
    starts = list(range(0, pool - run + 1, run + 1))
    rng.shuffle(starts)
    pages = [start + i for start in starts for i in range(run)]
    assert len(pages) >= count
    return pages[:count]


def _apply_2d(mem: KVMemory, plan: list[tuple[int, int, int, int]], to_device: bool) -> None:
    """The plan run with plain byte copies (what each cudaMemcpy2DAsync does)."""
    l1, l2 = mem.l1_rows.view(-1).view(torch.uint8), mem.l2_rows.view(-1).view(torch.uint8)
    dst, src = (l1, l2) if to_device else (l2, l1)
    width = mem.l1_rows.shape[1] * mem.l1_rows.element_size()
    for dst_at, dst_pitch, src_at, src_pitch in plan:
        for row in range(mem.lanes):
            a, b = src_at + row * src_pitch, dst_at + row * dst_pitch
            dst[b : b + width].copy_(src[a : a + width])


@pytest.mark.parametrize("to_device", [True, False], ids=["restore", "backup"])
@pytest.mark.parametrize("run", [1, 2, 3])
def test_the_2d_plan_moves_the_bytes_of_the_cpu_copies(run: int, to_device: bool) -> None:
    rng = random.Random(run)
    host, dev = _scattered(36, run, 9, rng), _scattered(40, run, 9, rng)
    reference, mem = _memory(), _memory()
    if to_device:
        reference.restore(host, dev)
    else:
        reference.backup(dev, host)
    _apply_2d(mem, mem.plan_2d(host, dev, to_device), to_device)
    assert torch.equal(mem.l1.view(torch.int16), reference.l1.view(torch.int16))
    assert torch.equal(mem.l2.view(torch.int16), reference.l2.view(torch.int16))


def test_the_2d_plan_is_one_copy_per_page_with_the_l1_row_block_as_pitch() -> None:
    mem = _memory(page_size=16, layers=2, heads=1, head_dim=4)
    row = 16 * 4 * 2  # page_size * heads * head_dim bf16 elements per row
    assert mem.l1_rows.shape[1] * mem.l1_rows.element_size() == row and mem.lanes == 4
    assert mem.plan_2d([5, 6], [9, 2], to_device=True) == [(9 * row, 40 * row, 5 * 4 * row, row), (2 * row, 40 * row, 6 * 4 * row, row)]
    assert mem.plan_2d([5], [9], to_device=False) == [(5 * 4 * row, row, 9 * row, 40 * row)]


def test_short_runs_take_the_per_page_path_and_long_runs_staging() -> None:
    mem = _memory()
    assert mem.uva_max_run == 1.5
    assert mem._short_runs([7]) and mem._short_runs([3, 9, 1, 2])  # mean run 1 and 4/3
    assert not mem._short_runs([1, 2, 3, 8, 9, 10])  # mean run 3
    mem.uva_max_run = 0.0  # forced staging
    assert not mem._short_runs([7])
    big = _memory(l1_pages=4, l2_pages=4, page_size=4, layers=3, heads=2, head_dim=8)
    assert big.page_bytes <= 2 << 20 and big.uva_max_run == 1.5
    assert (
        KVMemory(device=torch.device("cpu"), l1_pages=1, l2_pages=1, page_size=64, layers=32, heads=8, head_dim=128, dtype=torch.bfloat16).uva_max_run == 0.0
    )  # 8 MiB pages: staging at every run length


def test_runs_of_consecutive_pages() -> None:
    assert _runs([4, 5, 6, 9, 3, 4]) == [(4, 3), (9, 1), (3, 2)]
    assert _runs([]) == []


# -- CUDA ---------------------------------------------------------------------------------

PATHS = ("2d", "uva", "dma")


def _force(mem: KVMemory, path: str) -> bool:
    """Make `mem` take `path` for the test's lists; False where this machine cannot."""
    if path == "2d":
        return mem.cudart is not None
    if path == "uva":
        mem.cudart = None
        mem.uva_max_run = math.inf
        return True
    mem.uva_max_run = 0.0
    return True


def _expected_restore(mem: KVMemory, host: list[int], dev: list[int]) -> torch.Tensor:
    want = mem.l1.clone()
    for h, d in zip(host, dev, strict=True):
        want[:, :, d] = mem.l2[h].view(mem.page_shape).to(want.device)
    return want


def _expected_backup(mem: KVMemory, dev: list[int], host: list[int]) -> torch.Tensor:
    want = mem.l2.clone()
    for d, h in zip(dev, host, strict=True):
        want[h] = mem.l1[:, :, d].reshape(-1).cpu()
    return want


@pytest.mark.cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("run", [1, 3])
def test_cuda_paths_move_the_pages(path: str, run: int) -> None:
    mem = _memory("cuda")
    if not _force(mem, path):
        pytest.skip("the CUDA runtime's 2D copy is not reachable here")
    rng = random.Random(run)
    host, dev = _scattered(36, run, 9, rng), _scattered(40, run, 9, rng)
    want = _expected_restore(mem, host, dev)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        mem.restore(host, dev)
    stream.synchronize()
    assert mem.last_path == ("dma" if path == "2d" and run > 1 else path)  # 2D only for short runs (mean run <= 1.5)
    assert torch.equal(mem.l1.view(torch.int16), want.view(torch.int16))
    other = [p for p in range(36) if p not in host][:9]
    want_l2 = _expected_backup(mem, dev[::-1], other)
    with torch.cuda.stream(stream):
        mem.backup(dev[::-1], other)
    stream.synchronize()
    assert torch.equal(mem.l2.view(torch.int16), want_l2.view(torch.int16))


@pytest.mark.cuda
@pytest.mark.parametrize("path", PATHS)
def test_cuda_restore_and_backup_at_once_on_two_streams(path: str) -> None:
    mem = _memory("cuda", l1_pages=80, l2_pages=80)
    if not _force(mem, path):
        pytest.skip("the CUDA runtime's 2D copy is not reachable here")
    rng = random.Random(5)
    host = _scattered(80, 1, 30, rng)
    dev = _scattered(80, 1, 30, rng)
    restore_host, backup_host, restore_dev, backup_dev = host[:15], host[15:], dev[:15], dev[15:]
    want_l1 = _expected_restore(mem, restore_host, restore_dev)
    want_l2 = _expected_backup(mem, backup_dev, backup_host)
    h2d, d2h = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(h2d):
        mem.restore(restore_host, restore_dev)
    with torch.cuda.stream(d2h):
        mem.backup(backup_dev, backup_host)
    torch.cuda.synchronize()
    assert torch.equal(mem.l1.view(torch.int16), want_l1.view(torch.int16))
    assert torch.equal(mem.l2.view(torch.int16), want_l2.view(torch.int16))


@pytest.mark.cuda
def test_cuda_index_read_in_place_equals_the_uploaded_one() -> None:
    mem = _memory("cuda")
    pages = [17, 3, 4, 39, 0, 22, 8]
    for read in (mem._row_index, mem._host_index):
        assert torch.equal(read(pages, read_in_place=True).cpu(), read(pages).cpu())
    torch.cuda.synchronize()
    mem._row_index([1], read_in_place=True)  # the done lists are let go at the next read
    assert len(mem._index_reads) <= 2


@pytest.mark.cuda
def test_cuda_staged_backup_issues_no_h2d_copy() -> None:
    """A backup's page index is not an H2D copy on the D2H stream (it would queue behind restores)."""
    from torch.profiler import ProfilerActivity, profile

    from cacheruntime.runtime.device.memory import _index_kernel

    if _index_kernel() is None:
        pytest.skip("no Triton: the index is uploaded")
    mem = _memory("cuda")
    dev, host = _scattered(40, 3, 9, random.Random(1)), _scattered(36, 3, 9, random.Random(2))
    stream = torch.cuda.Stream()
    mem.backup(dev, host)  # warm: the index kernel compiled
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.cuda.stream(stream):
        mem.backup(dev, host)
        stream.synchronize()
    assert mem.last_path == "dma"
    copies = [e.name for e in prof.events() if "Memcpy" in e.name]
    assert copies and not [name for name in copies if "HtoD" in name], copies
