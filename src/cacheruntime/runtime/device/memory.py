"""The KV memory: the device pool (L1), the host pool (L2) and the copies between them.

L1 holds, per layer, K and V as `[pages, page_size, heads, head_dim]` (one tensor
`[layers, 2, pages, page_size, heads, head_dim]`), the layout attention indexes by token
location `page * page_size + offset`. L2 is page-first, `[pages, page_elems]`: one page of
every layer's K and V is one contiguous block, so moving a page between tiers is one large
contiguous copy instead of `2 * layers` small strided ones (6.5 GB/s against ~55 GB/s on
an H200, see the design brief). L2 is pinned when the device is CUDA, so those copies are
asynchronous DMA on the transfer streams.

The tier copies (`restore`, `backup`) take one of three paths on CUDA, by the runs of
consecutive host pages in the list (measured on an H200 at page size 16,
`benchmarks/diagnostics/copypaths.py`, docs/benchmarks.md "Copy paths at page size 16"):

- **Short runs: one 2D copy per page** (`cudaMemcpy2DAsync`, `cudart.py`): the page's
  `2 * layers` rows, contiguous on the host and one L1 row block apart on the device, in
  one DMA; no staging, no kernel, no page index on the device. Where the runtime's 2D copy
  is not reachable, a **UVA gather kernel** (Triton) that reads (writes) pinned host rows in
  place takes these lists instead: hundreds of separate 2 MiB copies through staging cost
  more than the PCIe time, but the kernel runs on SMs, so a restore's and a backup's
  kernels queue behind each other where copies would overlap.
- **Longer runs: staged DMA.** Pages move in chunks (`chunk_bytes`) through two persistent
  staging buffers per direction: the DMA of chunk i+1 (one copy per run of consecutive
  host pages) runs while a side stream scatters chunk i into L1 (restore), or the side
  stream gathers chunk i+1 while chunk i is copied to the host (backup), so only one
  chunk's device copy adds to the DMA time. L1 is viewed as rows `[layers * 2 * pages, row]`
  (reinterpreted as the widest integer the row allows, int64 for bf16), so the scatter
  (gather) is one `index_copy_` (`index_select`) of whole contiguous rows, by a row index
  computed on the device from the page list.
- **The page index of a backup is never an H2D copy.** A restore's list arrives in one
  pinned, non-blocking copy on its own (H2D) stream, ahead of its own copies. A backup's
  would be an H2D copy on the D2H stream, and it queues behind whatever restores occupy the
  H2D copy engine: the backup then runs after them instead of beside them (0.51-0.55 of
  both pinned copies at once at page size 16; read in place, the backup runs beside the
  restore: 0.80-0.87). So a kernel reads the backup's list from pinned host memory and
  writes the row index on the device.

Ordering: both run with the runtime's transfer stream current (the "main" stream here)
and end with that stream waiting for everything they issued: the event the runtime
records after the call marks the pages ready (O1), and a backup's first read of L1 (2D
copy, kernel or gather) follows the point at which the runtime made the stream wait for
compute (O2).

On CPU the same row math runs without streams.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch

from cacheruntime.runtime.device import cudart
from cacheruntime.runtime.device.streams import current_cuda_stream, on_stream, to_device


def _wide(t: torch.Tensor) -> torch.Tensor:
    """`t` reinterpreted with the widest integer element its last dimension allows."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=dtype).element_size()
        if size >= t.element_size() and (t.shape[-1] * t.element_size()) % size == 0:
            return t.view(dtype)
    return t


class KVMemory:
    """L1 and L2 KV pools of one runtime, and the tier copies between them."""

    def __init__(
        self,
        *,
        device: torch.device,
        l1_pages: int,
        l2_pages: int,
        page_size: int,
        layers: int,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        chunk_bytes: int = 128 << 20,
        dma_bytes: int = 128 << 20,
        uva_max_run: float = 1.5,
        uva_max_page_bytes: int = 2 << 20,
    ):
        self.device = device
        self.page_shape = (layers, 2, page_size, heads, head_dim)
        self.page_elems = layers * 2 * page_size * heads * head_dim
        self.l1 = torch.zeros(layers, 2, l1_pages, page_size, heads, head_dim, dtype=dtype, device=device)
        pin = device.type == "cuda" and l2_pages > 0
        self.l2 = torch.zeros(l2_pages, self.page_elems, dtype=dtype, pin_memory=pin)
        self.lanes = layers * 2  # rows per page
        self.l1_rows = _wide(self.l1).view(self.lanes * l1_pages, -1)
        self.l2_rows = self.l2.view(self.l1_rows.dtype).view(l2_pages * self.lanes, self.l1_rows.shape[1])
        self.cuda = device.type == "cuda"
        self.chunk_pages = max(1, chunk_bytes // self.page_bytes)
        # One DMA moves at most `dma_bytes` (default: a whole chunk). Smaller pieces were
        # measured on an H200 (benchmarks/diagnostics/diag.py): they did not shorten a small read's wait behind
        # a large D2H and cost host time per copy, so the default keeps one copy per run.
        self.dma_rows = max(self.lanes, (dma_bytes // self.page_bytes) * self.lanes)
        # Page lists of small pages (<= `uva_max_page_bytes`) whose mean run of consecutive
        # host pages is at most `uva_max_run` take the short-run path: one 2D copy per page
        # (`cudart`), or the UVA gather kernel where that is not reachable. Longer runs go
        # through staging, one DMA per run (0.96-0.97 of a pinned copy at run 8, where 2D
        # copies per page got 0.92-0.93).
        self.uva_max_run = uva_max_run if self.page_bytes <= uva_max_page_bytes else 0.0
        #: The runtime's 2D copy (None: unreachable, on CPU, or L1 wider than the largest pitch).
        self.cudart: cudart.Cudart | None = None
        self.last_path = ""
        # `restore` runs on two threads: the caller's (a Restore's H2D) and the storage worker's
        # (a fetch's, issued once its read is in). It reuses the staging buffers in turn, so one
        # restore issues at a time; only the issue is serialized, not the copies on the GPU.
        self._restore_lock = threading.Lock()
        if self.cuda:
            self._device_index = device.index if device.index is not None else torch.cuda.current_device()
            self._lane_offsets = torch.arange(self.lanes, dtype=torch.int64, device=device) * l1_pages
            self._lane_steps = torch.arange(self.lanes, dtype=torch.int64, device=device)
            self._row_bytes = self.l1_rows.shape[1] * self.l1_rows.element_size()
            found = cudart.load(self._device_index)
            self.cudart = found if found is not None and l1_pages * self._row_bytes <= found.max_pitch else None
            # Pinned page lists that an index kernel reads in place, each with the event after
            # that kernel: kept until it has run (the caching host allocator only tracks copies).
            self._index_reads: deque[tuple[torch.Tensor, torch.cuda.Event]] = deque()
            if l2_pages:
                rows = min(self.chunk_pages, l2_pages) * self.lanes
                width, wide = self.l1_rows.shape[1], self.l1_rows.dtype
                self._stage_in = [torch.empty(rows, width, dtype=wide, device=device) for _ in range(2)]
                self._stage_out = [torch.empty(rows, width, dtype=wide, device=device) for _ in range(2)]
                # High priority: a chunk's scatter (gather) is a short kernel that must not
                # queue behind compute's, or the restore it finishes is exposed after all.
                self._scatter = torch.cuda.Stream(device, priority=-1)
                # The backup's gather is background work: lowest priority, never ahead of compute.
                self._gather = torch.cuda.Stream(device, priority=0)
                self._in_free: list[Any] = [None, None]  # the scatter that last read stage_in[i]
                self._out_free: list[Any] = [None, None]  # the D2H that last read stage_out[i]

    @property
    def page_bytes(self) -> int:
        """Bytes of one page in one tier: every layer's K and V for `page_size` tokens."""
        return self.page_elems * self.l1.element_size()

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K and V pools viewed per token: `[pages * page_size, heads, head_dim]`."""
        _, _, pages, page_size, heads, head_dim = self.l1.shape
        k = self.l1[layer, 0].view(pages * page_size, heads, head_dim)
        v = self.l1[layer, 1].view(pages * page_size, heads, head_dim)
        return k, v

    def read_l1(self, phys: list[int]) -> torch.Tensor:
        """Device pages `phys` in page-first layout `[n, layers, 2, page_size, heads, head_dim]` (a copy)."""
        index = to_device(phys, torch.long, self.device)
        return self.l1.index_select(2, index).permute(2, 0, 1, 3, 4, 5)

    def read_l2(self, phys: list[int]) -> torch.Tensor:
        """Host pages `phys` as `[n, layers, 2, page_size, heads, head_dim]` (a copy)."""
        index = torch.tensor(phys, dtype=torch.long)
        return self.l2.index_select(0, index).view(len(phys), *self.page_shape)

    def _row_index(self, l1_pages: list[int], read_in_place: bool = False) -> torch.Tensor:
        """L1 row numbers of `l1_pages`, page-major (page j's rows are j*lanes .. j*lanes+lanes-1).

        `read_in_place`: computed by a kernel reading the list from pinned host memory, not
        uploaded by an H2D copy (a backup's, see the module docstring).
        """
        if not self.cuda:
            pages = torch.tensor(l1_pages, dtype=torch.long)
            return (torch.arange(self.lanes, dtype=torch.long)[None, :] * self.l1.shape[2] + pages[:, None]).reshape(-1)
        if read_in_place and (index := self._index_in_place(l1_pages, 1, self.l1.shape[2])) is not None:
            return index
        pages = to_device(l1_pages, torch.int64, self.device)
        return (pages[:, None] + self._lane_offsets[None, :]).reshape(-1)

    def _host_rows(self, first_page: int, page_count: int) -> torch.Tensor:
        return self.l2_rows[first_page * self.lanes : (first_page + page_count) * self.lanes]

    def _host_index(self, l2_pages: list[int], read_in_place: bool = False) -> torch.Tensor:
        """L2 row numbers of `l2_pages`, page-major (L2 is page-first: page p's rows are p*lanes ..)."""
        if read_in_place and (index := self._index_in_place(l2_pages, self.lanes, 1)) is not None:
            return index
        pages = to_device(l2_pages, torch.int64, self.device)
        return (pages[:, None] * self.lanes + self._lane_steps[None, :]).reshape(-1)

    def _index_in_place(self, pages: list[int], page_step: int, lane_step: int) -> torch.Tensor | None:
        """Rows `page * page_step + lane * lane_step` of each of `pages` (page-major), written on the
        current stream by a kernel that reads `pages` from pinned host memory; None without the kernel."""
        kernel = _index_kernel()
        if kernel is None:
            return None
        reads = self._index_reads
        while reads and reads[0][1].query():
            reads.popleft()
        host = torch.tensor(pages, dtype=torch.int64).pin_memory()
        index = torch.empty(len(pages) * self.lanes, dtype=torch.int64, device=self.device)
        kernel(host, index, self.lanes, page_step, lane_step)
        done = torch.cuda.Event()
        done.record(current_cuda_stream(self._device_index))
        reads.append((host, done))
        return index

    def _short_runs(self, host_pages: list[int]) -> bool:
        """Whether the mean run of consecutive host pages is at most `uva_max_run` (the short-run path)."""
        return self.uva_max_run > 0 and len(host_pages) <= self.uva_max_run * len(_runs(host_pages))

    def _use_uva(self, host_pages: list[int]) -> bool:
        """Short runs, no 2D copy, and a working UVA kernel (worth a launch from two pages up)."""
        return self.cudart is None and len(host_pages) >= 2 and _uva_kernel() is not None and self._short_runs(host_pages)

    def _use_2d(self, host_pages: list[int]) -> bool:
        return self.cudart is not None and self._short_runs(host_pages)

    def plan_2d(self, host_pages: list[int], device_pages: list[int], to_device: bool) -> list[tuple[int, int, int, int]]:
        """One 2D copy per page: (destination, destination pitch, source, source pitch) in bytes from
        each side's base (L1's rows, L2's), each copy `lanes` rows of `row_bytes`.

        On the host a page's rows are contiguous (pitch: one row); in L1 row `lane` of page `d`
        is row `lane * l1_pages + d`, so the pitch is `l1_pages` rows.
        """
        row = self.l1_rows.shape[1] * self.l1_rows.element_size()
        host_page, device_pitch = self.lanes * row, self.l1.shape[2] * row
        if to_device:
            return [(d * row, device_pitch, h * host_page, row) for h, d in zip(host_pages, device_pages, strict=True)]
        return [(h * host_page, row, d * row, device_pitch) for h, d in zip(host_pages, device_pages, strict=True)]

    def _copy_2d(self, host_pages: list[int], device_pages: list[int], to_device: bool) -> None:
        """The pages in one `cudaMemcpy2DAsync` each, on the current stream."""
        assert self.cudart is not None
        copy, width, height = self.cudart.copy_2d, self._row_bytes, self.lanes
        stream = current_cuda_stream(self._device_index).cuda_stream
        l1, l2 = self.l1_rows.data_ptr(), self.l2_rows.data_ptr()
        dst_base, src_base = (l1, l2) if to_device else (l2, l1)
        for dst, dst_pitch, src, src_pitch in self.plan_2d(host_pages, device_pages, to_device):
            copy(dst_base + dst, dst_pitch, src_base + src, src_pitch, width, height, to_device, stream)

    def _uva_copy(self, src: torch.Tensor, src_index: torch.Tensor, dst: torch.Tensor, dst_index: torch.Tensor) -> bool:
        """`dst[dst_index] = src[src_index]` (rows) in one kernel on the current stream, host
        rows read or written in place through UVA. False (nothing issued) if the kernel is
        unavailable; the caller then takes the DMA path."""
        kernel = _uva_kernel()
        try:
            kernel(src, src_index, dst, dst_index)
        except Exception:  # a Triton that refuses host pointers: fall back for good
            _UVA[0] = None
            _UVA[1] = True
            return False
        return True

    def restore(self, src_l2: list[int], dst_l1: list[int]) -> None:
        """H2D of host pages `src_l2` into device pages `dst_l1`, on the calling thread's current stream."""
        with self._restore_lock:
            self._restore(src_l2, dst_l1)

    def _restore(self, src_l2: list[int], dst_l1: list[int]) -> None:
        if not self.cuda:
            rows = torch.cat([self._host_rows(first_page, page_count) for first_page, page_count in _runs(src_l2)])
            self.l1_rows.index_copy_(0, self._row_index(dst_l1), rows)
            return
        if self._use_2d(src_l2):
            self._copy_2d(src_l2, dst_l1, to_device=True)
            self.last_path = "2d"
            return
        index = self._row_index(dst_l1)
        if self._use_uva(src_l2) and self._uva_copy(self.l2_rows, self._host_index(src_l2), self.l1_rows, index):
            self.last_path = "uva"
            return
        self.last_path = "dma"
        main, scatter, lanes, piece = current_cuda_stream(self._device_index), self._scatter, self.lanes, self.dma_rows
        done = None
        for n, first in enumerate(range(0, len(src_l2), self.chunk_pages)):
            slot = n % 2
            if self._in_free[slot] is not None:
                main.wait_event(self._in_free[slot])
            buf = self._stage_in[slot]
            offset = 0
            for first_page, page_count in _runs(src_l2[first : first + self.chunk_pages]):
                base = first_page * lanes
                for lo in range(0, page_count * lanes, piece):
                    rows = min(piece, page_count * lanes - lo)
                    buf[offset : offset + rows].copy_(self.l2_rows[base + lo : base + lo + rows], non_blocking=True)
                    offset += rows
            landed = main.record_event()
            scatter.wait_event(landed)
            with on_stream(scatter):
                lo = first * lanes
                self.l1_rows.index_copy_(0, index[lo : lo + offset], buf[:offset])
            done = self._in_free[slot] = scatter.record_event()
        index.record_stream(scatter)
        if done is not None:
            main.wait_event(done)

    def backup(self, src_l1: list[int], dst_l2: list[int]) -> None:
        """D2H of device pages `src_l1` into host pages `dst_l2`, on the current stream."""
        if not self.cuda:
            rows = self.l1_rows.index_select(0, self._row_index(src_l1))
            offset = 0
            for first_page, page_count in _runs(dst_l2):
                count = page_count * self.lanes
                self._host_rows(first_page, page_count).copy_(rows[offset : offset + count])
                offset += count
            return
        if self._use_2d(dst_l2):
            self._copy_2d(dst_l2, src_l1, to_device=False)
            self.last_path = "2d"
            return
        index = self._row_index(src_l1, read_in_place=True)
        if self._use_uva(dst_l2) and self._uva_copy(self.l1_rows, index, self.l2_rows, self._host_index(dst_l2, read_in_place=True)):
            self.last_path = "uva"
            return
        self.last_path = "dma"
        main, gather, lanes, piece = current_cuda_stream(self._device_index), self._gather, self.lanes, self.dma_rows
        gather.wait_event(main.record_event())  # after the runtime's wait for compute (O2)
        for n, first in enumerate(range(0, len(src_l1), self.chunk_pages)):
            slot = n % 2
            chunk = dst_l2[first : first + self.chunk_pages]
            buf = self._stage_out[slot]
            rows = len(chunk) * lanes
            if self._out_free[slot] is not None:
                gather.wait_event(self._out_free[slot])
            with on_stream(gather):
                lo = first * lanes
                torch.index_select(self.l1_rows, 0, index[lo : lo + rows], out=buf[:rows])
            main.wait_event(gather.record_event())
            offset = 0
            for first_page, page_count in _runs(chunk):
                base = first_page * lanes
                for lo in range(0, page_count * lanes, piece):
                    count = min(piece, page_count * lanes - lo)
                    self.l2_rows[base + lo : base + lo + count].copy_(buf[offset : offset + count], non_blocking=True)
                    offset += count
            self._out_free[slot] = main.record_event()
        index.record_stream(gather)


def _runs(pages: list[int]) -> list[tuple[int, int]]:
    """(first page, count) of each run of consecutive physical pages, in order.

    The copy loops' own run finder: `pageruns.coalesce` is the protocol's page-run algebra,
    written in fixed-shape form for Z3, and costs a few objects per page; here only the
    runs of one copy's physical pages matter, on the host's issue path.
    """
    runs: list[tuple[int, int]] = []
    if not pages:
        return runs
    first = previous = pages[0]
    for page in pages[1:]:
        if page != previous + 1:
            runs.append((first, previous - first + 1))
            first = page
        previous = page
    runs.append((first, previous - first + 1))
    return runs


# -------------------------------------------------------------------------------------
# The UVA row-gather kernel (Triton, CUDA only; absent elsewhere)
# -------------------------------------------------------------------------------------

_UVA: list[Any] = [None, False]  # [the launcher, whether the lookup was done]


def _uva_kernel() -> Any:
    """A launcher `(src, src_index, dst, dst_index)` copying whole rows, or None without Triton."""
    if _UVA[1]:
        return _UVA[0]
    _UVA[1] = True
    try:
        import triton
        import triton.language as tl
    except Exception:
        return None

    @triton.jit
    def rows_kernel(src, src_index, dst, dst_index, width, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        part = tl.program_id(1)
        s = tl.load(src_index + row)
        d = tl.load(dst_index + row)
        cols = part * BLOCK + tl.arange(0, BLOCK)
        mask = cols < width
        values = tl.load(src + s * width + cols, mask=mask)
        tl.store(dst + d * width + cols, values, mask=mask)

    def launch(src: torch.Tensor, src_index: torch.Tensor, dst: torch.Tensor, dst_index: torch.Tensor) -> None:
        width = src.shape[1]
        block = min(4096, triton.next_power_of_2(width))
        grid = (src_index.numel(), triton.cdiv(width, block))
        rows_kernel[grid](src, src_index, dst, dst_index, width, BLOCK=block, num_warps=8)

    _UVA[0] = launch
    return launch


_INDEX: list[Any] = [None, False]  # [the launcher, whether the lookup was done]


def _index_kernel() -> Any:
    """A launcher `(pages, out, lanes, page_step, lane_step)` writing `out[j * lanes + lane] =
    pages[j] * page_step + lane * lane_step` with `pages` read in place (pinned host memory
    through UVA, no copy engine), or None without Triton."""
    if _INDEX[1]:
        return _INDEX[0]
    _INDEX[1] = True
    try:
        import triton
        import triton.language as tl
    except Exception:
        return None

    @triton.jit(do_not_specialize=["n"])
    def index_kernel(pages, out, n, lanes, page_step, lane_step, PAGES: tl.constexpr, LANES: tl.constexpr):
        j = tl.program_id(0) * PAGES + tl.arange(0, PAGES)
        lane = tl.arange(0, LANES).to(tl.int64)
        page = tl.load(pages + j, mask=j < n, other=0)
        rows = page[:, None] * page_step + lane[None, :] * lane_step
        mask = (j < n)[:, None] & (lane < lanes)[None, :]
        tl.store(out + j[:, None].to(tl.int64) * lanes + lane[None, :], rows, mask=mask)

    def launch(pages: torch.Tensor, out: torch.Tensor, lanes: int, page_step: int, lane_step: int) -> None:
        n = pages.numel()
        if n:
            block = 16
            index_kernel[(triton.cdiv(n, block),)](pages, out, n, lanes, page_step, lane_step, PAGES=block, LANES=triton.next_power_of_2(lanes))

    _INDEX[0] = launch
    return launch
