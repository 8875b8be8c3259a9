"""The proposed transfer path for `KVMemory.restore`/`backup`: pipelined, row-indexed, non-blocking.

Drop-in replacements with the same signatures as `cacheruntime.runtime.pools.KVMemory`'s
`restore(src_l2, dst_l1)` and `backup(src_l1, dst_l2)`, called (like those) with the
runtime's H2D or D2H stream current. Three changes against the runtime's routine:

1. **No host block.** The page index goes to the device from pinned memory with
   `non_blocking=True`. `torch.tensor(list, device="cuda")` (what pools.py does) is a
   pageable copy followed by `cudaStreamSynchronize` of the *transfer* stream: the host
   waits for every copy queued before it, so `prepare_batch` (restore) and
   `execute_batch` (backup) block for the whole transfer and control cannot run ahead.
2. **Row-indexed gather/scatter.** L1 is `[layers, 2, pages, page_size, heads, head_dim]`;
   one page is `2 * layers` contiguous rows of `page_size * heads * head_dim` elements.
   Viewing L1 as rows `[layers * 2 * pages, row]` (reinterpreted as int64) makes the
   device scatter one `index_copy_` along dim 0 over whole contiguous rows, instead of an
   element-wise `index_copy_` on a permuted bf16 view.
3. **Pipelined chunks.** The pages move in chunks (32 MiB by default) through two staging
   buffers: the device scatter (gather) of chunk i runs on a second stream while the DMA
   of chunk i+1 runs, so only the last chunk's scatter adds to the DMA time. The
   transfer stream finally waits for the last scatter, so the event the runtime records
   after the call still marks the pages ready (O1), and a backup's gather runs after the
   point at which the runtime made the D2H stream wait for compute (O2).

On CPU the same row math runs without streams (the tests compare bytes with the runtime's
own routine there).
"""

from __future__ import annotations

from typing import Any

import torch

from cacheruntime.pageruns import coalesce


def _wide(t: torch.Tensor) -> torch.Tensor:
    """`t` reinterpreted with the widest integer element its last dimension allows."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=dtype).element_size()
        if size >= t.element_size() and (t.shape[-1] * t.element_size()) % size == 0:
            return t.view(dtype)
    return t


class PipelinedTransfers:
    """Restore and backup routines over one `KVMemory` (see the module docstring)."""

    def __init__(self, memory: Any, chunk_bytes: int = 32 << 20):
        self.memory = memory
        self.device = memory.device
        layers, two, pages, page_size, heads, head_dim = memory.l1.shape
        self.lk = layers * two  # rows per page
        self.l1_pages_total = pages
        self.l1_rows = _wide(memory.l1).view(self.lk * pages, -1)
        self.l2_rows = _wide(memory.l2).view(memory.l2.shape[0] * self.lk, -1)
        self.row_width = self.l1_rows.shape[1]
        page_bytes = memory.page_bytes
        self.chunk_pages = max(1, chunk_bytes // page_bytes)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            rows = self.chunk_pages * self.lk
            self.stage_in = [torch.empty(rows, self.row_width, dtype=self.l1_rows.dtype, device=self.device) for _ in range(2)]
            self.stage_out = [torch.empty(rows, self.row_width, dtype=self.l1_rows.dtype, device=self.device) for _ in range(2)]
            self.scatter_stream = torch.cuda.Stream(self.device)
            self.gather_stream = torch.cuda.Stream(self.device)
            self.in_free: list[Any] = [None, None]  # event: the scatter that last read stage_in[i] is done
            self.out_free: list[Any] = [None, None]  # event: the D2H that last read stage_out[i] is done

    def install(self) -> PipelinedTransfers:
        """Make the memory's `restore`/`backup` (looked up per call by the runtime) use this path."""
        self.memory.restore = self.restore
        self.memory.backup = self.backup
        return self

    def _row_index(self, pages: list[int]) -> torch.Tensor:
        """L1 row numbers of `pages`, page-major: page j's rows are j*lk .. j*lk+lk-1."""
        page_t = torch.tensor(pages, dtype=torch.long)
        index = (torch.arange(self.lk, dtype=torch.long)[None, :] * self.l1_pages_total + page_t[:, None]).reshape(-1)
        if not self.cuda:
            return index
        return index.pin_memory().to(self.device, non_blocking=True)

    def _host_rows(self, run_first: int, run_count: int) -> torch.Tensor:
        return self.l2_rows[run_first * self.lk : (run_first + run_count) * self.lk]

    # ----------------------------------------------------------------------------------

    def restore(self, src_l2: list[int], dst_l1: list[int]) -> None:
        """H2D of host pages `src_l2` into device pages `dst_l1`."""
        index = self._row_index(dst_l1)
        if not self.cuda:
            rows = torch.cat([self._host_rows(run.first_page, run.page_count) for run in coalesce(src_l2)])
            self.l1_rows.index_copy_(0, index, rows)
            return
        main = torch.cuda.current_stream(self.device)
        index.record_stream(self.scatter_stream)
        done = None
        for n, first in enumerate(range(0, len(src_l2), self.chunk_pages)):
            chunk = src_l2[first : first + self.chunk_pages]
            slot = n % 2
            if self.in_free[slot] is not None:
                main.wait_event(self.in_free[slot])
            buf = self.stage_in[slot]
            offset = 0
            for run in coalesce(chunk):
                rows = run.page_count * self.lk
                buf[offset : offset + rows].copy_(self._host_rows(run.first_page, run.page_count), non_blocking=True)
                offset += rows
            landed = torch.cuda.Event()
            landed.record(main)
            self.scatter_stream.wait_event(landed)
            with torch.cuda.stream(self.scatter_stream):
                lo = first * self.lk
                self.l1_rows.index_copy_(0, index[lo : lo + offset], buf[:offset])
                done = torch.cuda.Event()
                done.record(self.scatter_stream)
            self.in_free[slot] = done
        if done is not None:
            main.wait_event(done)

    def backup(self, src_l1: list[int], dst_l2: list[int]) -> None:
        """D2H of device pages `src_l1` into host pages `dst_l2`."""
        index = self._row_index(src_l1)
        if not self.cuda:
            rows = self.l1_rows.index_select(0, index)
            offset = 0
            for run in coalesce(dst_l2):
                count = run.page_count * self.lk
                self._host_rows(run.first_page, run.page_count).copy_(rows[offset : offset + count])
                offset += count
            return
        main = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event()
        start.record(main)  # after the runtime's wait for compute (O2)
        self.gather_stream.wait_event(start)
        index.record_stream(self.gather_stream)
        for n, first in enumerate(range(0, len(src_l1), self.chunk_pages)):
            chunk = dst_l2[first : first + self.chunk_pages]
            slot = n % 2
            buf = self.stage_out[slot]
            rows = len(chunk) * self.lk
            with torch.cuda.stream(self.gather_stream):
                if self.out_free[slot] is not None:
                    self.gather_stream.wait_event(self.out_free[slot])
                lo = first * self.lk
                torch.index_select(self.l1_rows, 0, index[lo : lo + rows], out=buf[:rows])
                gathered = torch.cuda.Event()
                gathered.record(self.gather_stream)
            main.wait_event(gathered)
            offset = 0
            for run in coalesce(chunk):
                count = run.page_count * self.lk
                self._host_rows(run.first_page, run.page_count).copy_(buf[offset : offset + count], non_blocking=True)
                offset += count
            freed = torch.cuda.Event()
            freed.record(main)
            self.out_free[slot] = freed
