"""The KV memory: the device pool (L1), the host pool (L2) and the copies between them.

L1 holds, per layer, K and V as `[pages, page_size, heads, head_dim]` (one tensor
`[layers, 2, pages, page_size, heads, head_dim]`), the layout attention indexes by token
location `page * page_size + offset`. L2 is page-first, `[pages, page_elems]`: one page of
every layer's K and V is one contiguous block, so moving a page between tiers is one large
contiguous copy instead of `2 * layers` small strided ones (6.5 GB/s against ~55 GB/s on
an H200, see the design brief). L2 is pinned when the device is CUDA, so those copies are
asynchronous DMA on the transfer streams.

A transfer gathers (or scatters) on the device side through a staging buffer in the
page-first layout and moves maximal runs of consecutive host pages with one copy each.
The functions here only issue the copies; the stream they run on and the events they wait
for are the runtime's business (`cacheruntime.runtime.local`).
"""

from __future__ import annotations

import torch

from cacheruntime.pageruns import coalesce
from cacheruntime.runtime.streams import to_device


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
    ):
        self.device = device
        self.page_shape = (layers, 2, page_size, heads, head_dim)
        self.page_elems = layers * 2 * page_size * heads * head_dim
        self.l1 = torch.zeros(layers, 2, l1_pages, page_size, heads, head_dim, dtype=dtype, device=device)
        pin = device.type == "cuda" and l2_pages > 0
        self.l2 = torch.zeros(l2_pages, self.page_elems, dtype=dtype, pin_memory=pin)

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

    def backup(self, src_l1: list[int], dst_l2: list[int]) -> None:
        """D2H: gather device pages into staging, then one copy per run of consecutive host pages."""
        staging = self.read_l1(src_l1).reshape(len(src_l1), self.page_elems)
        if self.device.type == "cpu":
            self.l2.index_copy_(0, torch.tensor(dst_l2, dtype=torch.long), staging)
            return
        offset = 0
        for run in coalesce(dst_l2):
            self.l2[run.first_page : run.end].copy_(staging[offset : offset + run.page_count], non_blocking=True)
            offset += run.page_count

    def restore(self, src_l2: list[int], dst_l1: list[int]) -> None:
        """H2D: one copy per run of consecutive host pages into staging, then scatter into L1."""
        n = len(src_l2)
        if self.device.type == "cpu":
            staging = self.l2.index_select(0, torch.tensor(src_l2, dtype=torch.long))
        else:
            staging = torch.empty(n, self.page_elems, dtype=self.l1.dtype, device=self.device)
            offset = 0
            for run in coalesce(src_l2):
                staging[offset : offset + run.page_count].copy_(self.l2[run.first_page : run.end], non_blocking=True)
                offset += run.page_count
        pages = staging.view(n, *self.page_shape).permute(1, 2, 0, 3, 4, 5)
        self.l1.index_copy_(2, to_device(dst_l1, torch.long, self.device), pages)

