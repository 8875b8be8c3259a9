"""The ReqToToken table: per request slot, the device location of every token of its row.

Attention reads K and V at `table[slot, position]`, which is `phys * page_size + offset`
for the physical device page holding the row's page `position // page_size`. Rows are
padded to whole pages, so that a page's token locations are one row of `pages`: mapping
a page is one indexed store of `page_size` locations.
"""

from __future__ import annotations

import torch

from cacheruntime.runtime.device.streams import Stream, to_device


class ReqToToken:
    """The table (`[max_requests, row_pages * page_size]` int32 on the device) and its page view."""

    def __init__(self, max_requests: int, max_request_tokens: int, page_size: int, device: torch.device):
        row_pages = -(-max_request_tokens // page_size)
        self.page_size = page_size
        self.device = device
        self.table = torch.zeros(max_requests, row_pages * page_size, dtype=torch.int32, device=device)
        self.pages = self.table.view(max_requests, row_pages, page_size)
        self.offsets = torch.arange(page_size, dtype=torch.int64, device=device)

    def write(self, stream: Stream, slots: list[int], page_index: list[int], phys: list[int]) -> None:
        """Map row page `page_index[i]` of slot `slots[i]` to physical page `phys[i]`, on `stream`.

        One indexed store writes every mapped page's `page_size` locations; the index
        reaches the device in one pinned, non-blocking copy. Compute reads the table in
        stream order after this, so no event is needed.
        """
        if not slots:
            return
        pages, offsets, page_size, device = self.pages, self.offsets, self.page_size, self.device

        def write() -> None:
            index = to_device([slots, page_index, phys], torch.int64, device)
            pages[index[0], index[1]] = (index[2, :, None] * page_size + offsets).to(torch.int32)

        stream.submit(write)
