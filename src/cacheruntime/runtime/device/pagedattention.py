"""Paged attention over the KV pool through the ReqToToken table, with FlexAttention.

Attention reads K and V where they lie in the pool, never a per-step copy of each
request's context: the keys are the whole pool of one layer (`[pool_tokens, kv_heads,
head_dim]`, broadcast over the batch without a copy), and a FlexAttention block mask
built from the table tells each request which pages are its own, in which order. The
KV block of the mask is one page, so a request's kernel visits only its own pages
(`kv_indices` is its row of the table, page by page); `mask_mod` then keeps, inside
those pages, the locations whose position in the request's row is at most the query's
(causal), which also drops the unwritten tail of a request's last page.

A page shared by several requests (an attached prefix) is listed in each of their rows;
nothing in the mask assumes that a page has one owner, or that it sits at the same
position in every row.

The batch is ragged: request b computes `end_b - start_b` new tokens; queries are padded
to the longest (`[B, q_len]`) and the padding is dropped afterwards. On CPU FlexAttention
runs eagerly (it materializes the scores, fine at the small shapes CPU runs); on CUDA with
pages of `KERNEL_PAGE` tokens it is compiled, and the block mask makes it skip every page
outside a request's row.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from cacheruntime.runtime.device.streams import to_device

#: query rows per block of the mask (FlexAttention's default block size)
Q_BLOCK = 128
#: pages of a multiple of this many tokens run the compiled kernel on CUDA (one page is one KV
#: block of the mask, and the kernel's tiles must divide it); smaller pages run eagerly
KERNEL_PAGE = 128
#: compiled kernels kept: one per static shape (batch, query length, pool), since a dynamic
#: batch dimension makes FlexAttention leave its decoding kernel for one that pads each
#: decode query to a 128-row tile
RECOMPILE_LIMIT = 64


class PagedBatch:
    """A ragged batch's view of the ReqToToken table, built once per step and read by every layer.

    - `new_locations` `[N]`: the pool location of each new token (where its K and V go),
      the batch's items one after another;
    - `positions` `[N]`: each new token's position in its row (for the rotary embedding);
    - `last` `[B]`: the index in `0 .. N-1` of each item's last new token (whose output
      is the item's next token);
    - `block_mask`: which pool pages each item reads, and causality inside them.
    """

    def __init__(self, table: torch.Tensor, slots: list[int], starts: list[int], ends: list[int], page_size: int, pool_pages: int):
        device = table.device
        lengths = [end - start for start, end in zip(starts, ends)]
        if not lengths or min(lengths) < 1:
            raise ValueError(f"every item computes at least one token; got lengths {lengths}")
        batch, q_len = len(lengths), max(lengths)
        row_pages = [-(-end // page_size) for end in ends]
        most_pages = max(row_pages)
        self.batch, self.q_len, self.page_size = batch, q_len, page_size
        token_slot = [slot for slot, n in zip(slots, lengths) for _ in range(n)]
        token_position = [start + i for start, n in zip(starts, lengths) for i in range(n)]
        pad = [b * q_len + i for b, n in enumerate(lengths) for i in range(n)]
        # padded query rows repeat the item's last position: they attend to something, never NaN
        query_position = [[start + min(i, n - 1) for i in range(q_len)] for start, n in zip(starts, lengths)]
        last, total = [], 0
        for n in lengths:
            total += n
            last.append(total - 1)
        host = to_device([token_slot, token_position, pad], torch.int64, device)
        self.positions, self.pad_index = host[1], host[2]
        self.new_locations = table[host[0], host[1]].long()
        self.last = to_device(last, torch.int64, device)
        self.query_position = to_device(query_position, torch.int64, device)

        # Row pages of each item: phys[b, j] is the device page holding position j * page_size.
        slot_index = to_device(slots, torch.int64, device)
        page_steps = torch.arange(most_pages, device=device)
        phys = (table[slot_index[:, None], page_steps[None, :] * page_size] // page_size).long()
        valid = page_steps[None, :] < to_device(row_pages, torch.int64, device)[:, None]
        # owner[b, p]: the row page index at which item b reads device page p, -1 if it does not
        # (one spare column takes the writes of the invalid entries, so no host sync is needed).
        owner = torch.full((batch, pool_pages + 1), -1, dtype=torch.int64, device=device)
        spare = torch.full_like(phys, pool_pages)
        flat = (torch.arange(batch, device=device)[:, None] * (pool_pages + 1) + torch.where(valid, phys, spare)).reshape(-1)
        owner.view(-1).index_put_((flat,), torch.where(valid, page_steps[None, :].expand_as(phys), torch.full_like(phys, -1)).reshape(-1))
        self.owner = owner

        q_blocks = -(-q_len // Q_BLOCK)
        kv_indices = torch.zeros(batch, 1, q_blocks, pool_pages, dtype=torch.int32, device=device)
        kv_indices[:, 0, :, :most_pages] = torch.where(valid, phys, torch.zeros_like(phys)).to(torch.int32)[:, None, :]
        kv_num_blocks = to_device(row_pages, torch.int32, device)[:, None, None].expand(batch, 1, q_blocks).contiguous()
        query_pos, owner_of = self.query_position, self.owner

        def causal_in_row(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            row_page = owner_of[b, kv_idx // page_size]
            return (row_page >= 0) & (row_page * page_size + kv_idx % page_size <= query_pos[b, q_idx])

        self.block_mask = BlockMask.from_kv_blocks(
            kv_num_blocks, kv_indices, BLOCK_SIZE=(Q_BLOCK, page_size), mask_mod=causal_in_row, seq_lengths=(q_len, pool_pages * page_size)
        )


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
    """Attention of the new tokens' queries `[N, q_heads, head_dim]` over the pool `[pool_tokens, kv_heads, head_dim]`.

    Returns `[N, q_heads, head_dim]`. Query heads are grouped over the K/V heads (GQA)
    when there are more of them.
    """
    n, q_heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    padded = q.new_zeros(batch.batch * batch.q_len, q_heads, head_dim).index_copy_(0, batch.pad_index, q)
    queries = padded.view(batch.batch, batch.q_len, q_heads, head_dim).transpose(1, 2)
    keys = k_pool.transpose(0, 1)[None].expand(batch.batch, -1, -1, -1)
    values = v_pool.transpose(0, 1)[None].expand(batch.batch, -1, -1, -1)
    attend = _compiled_flex() if q.is_cuda and batch.page_size % KERNEL_PAGE == 0 else flex_attention
    out = attend(queries, keys, values, block_mask=batch.block_mask, scale=1.0 / math.sqrt(head_dim), enable_gqa=q_heads != kv_heads)
    return out.transpose(1, 2).reshape(batch.batch * batch.q_len, q_heads, head_dim).index_select(0, batch.pad_index)


_COMPILED: list[Any] = []


def _compiled_flex() -> Any:
    """FlexAttention compiled with static shapes (its fused kernels; eager FlexAttention is the reference math)."""
    if not _COMPILED:
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED[0]
