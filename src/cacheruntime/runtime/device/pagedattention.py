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
pages of `KERNEL_PAGE` tokens and half-precision KV it is compiled, and the block mask makes it skip every page
outside a request's row.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from cacheruntime.runtime.device.streams import to_device

#: query rows per block of the mask (FlexAttention's default block size)
Q_BLOCK = 128
#: pages of a multiple of this many tokens run the compiled kernel on CUDA (one page is one KV
#: block of the mask, and the kernel's tiles must divide it); smaller pages run eagerly
KERNEL_PAGE = 128
#: FlexAttention's decoding kernel for a decode step (one query per item) with a pipelined K/V
#: stream: its default (64-token blocks, no pipelining, 2 warps) read the KV of a B = 16 step at
#: 1.2-1.3 TB/s on the H200 and of B = 64 at 2.9; these at 2.6 and 3.6, the best of the options
#: measured (benchmarks/diagnostics/flexdecode.py; docs/gpu-record.md)
DECODING_KERNEL = {"BLOCK_N": 128, "num_stages": 3, "num_warps": 4}
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

    `decode` builds the same view for a batch of one new token per item from device
    tensors alone (no host value, no host-to-device copy), so a CUDA graph can capture it.
    """

    def __init__(self, table: torch.Tensor, slots: list[int], starts: list[int], ends: list[int], page_size: int, pool_pages: int):
        device = table.device
        lengths = [end - start for start, end in zip(starts, ends)]
        if not lengths or min(lengths) < 1:
            raise ValueError(f"every item computes at least one token; got lengths {lengths}")
        q_len = max(lengths)
        token_slot = [slot for slot, n in zip(slots, lengths) for _ in range(n)]
        token_position = [start + i for start, n in zip(starts, lengths) for i in range(n)]
        pad = [b * q_len + i for b, n in enumerate(lengths) for i in range(n)]
        last, total = [], 0
        for n in lengths:
            total += n
            last.append(total - 1)
        host = to_device([token_slot, token_position, pad], torch.int64, device)
        items = to_device([slots, starts, ends, last], torch.int64, device)
        most_pages = -(-max(ends) // page_size)
        self._build(table, items[0], items[1], items[2], q_len, page_size, pool_pages, most_pages)
        self.positions, self.pad_index, self.last = host[1], host[2], items[3]
        self.new_locations = table[host[0], host[1]].long()

    @classmethod
    def decode(cls, table: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, page_size: int, pool_pages: int) -> PagedBatch:
        """Item b computes the one token at `positions[b]` of row `slots[b]` (device int64 tensors)."""
        self = cls.__new__(cls)
        most_pages = min(table.shape[1] // page_size, pool_pages)  # a row holds distinct pages
        self._build(table, slots, positions, positions + 1, 1, page_size, pool_pages, most_pages)
        self.positions = positions
        self.pad_index = self.last = torch.arange(slots.shape[0], device=table.device)
        self.new_locations = table[slots, positions].long()
        return self

    def _build(
        self, table: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, q_len: int, page_size: int, pool_pages: int, most_pages: int
    ) -> None:
        """The block mask from device tensors: items `[B]` compute positions `starts .. ends-1` of rows `slots`.

        Query block qb of item b (its query rows qb * Q_BLOCK onwards, padded rows repeating
        the item's last position) sees row pages `0 .. hi // page_size`, where hi is the
        block's last query position; the pages wholly at or before its first position lo
        are *full* blocks (every location visible to every query: no `mask_mod` runs), the
        rest are partial blocks, where `mask_mod` applies causality and drops the unwritten
        tail of the last page. So a causal prefill visits half the square, and a decode
        step masks one page per item.
        """
        device = table.device
        batch = slots.shape[0]
        self.batch, self.q_len, self.page_size = batch, q_len, page_size
        lengths = ends - starts
        # padded query rows repeat the item's last position: they attend to something, never NaN
        rows = torch.arange(q_len, device=device)
        self.query_position = starts[:, None] + torch.minimum(rows[None, :], lengths[:, None] - 1)

        # Row pages of each item: phys[b, j] is the device page holding position j * page_size.
        page_steps = torch.arange(most_pages, device=device)
        row_pages = (ends + page_size - 1) // page_size
        valid = page_steps[None, :] < row_pages[:, None]
        phys = torch.where(valid, (table[slots[:, None], page_steps[None, :] * page_size] // page_size).long(), 0)
        # owner[b, p]: the row page index at which item b reads device page p, -1 if it does not
        # (one spare column takes the writes of the invalid entries, so no host sync is needed).
        owner = torch.full((batch, pool_pages + 1), -1, dtype=torch.int64, device=device)
        flat = (torch.arange(batch, device=device)[:, None] * (pool_pages + 1) + torch.where(valid, phys, pool_pages)).reshape(-1)
        owner.view(-1).index_put_((flat,), torch.where(valid, page_steps[None, :], -1).reshape(-1))
        self.owner = owner

        q_blocks = -(-q_len // Q_BLOCK)
        first_row = torch.arange(q_blocks, device=device)[None, :] * Q_BLOCK
        lo = starts[:, None] + torch.minimum(first_row, lengths[:, None] - 1)
        hi = starts[:, None] + torch.minimum(first_row + Q_BLOCK - 1, lengths[:, None] - 1)
        full = (lo + 1) // page_size  # [B, q_blocks]: row pages 0 .. full-1 are wholly visible
        partial = hi // page_size + 1 - full
        widest = min(-(-Q_BLOCK // page_size) + 1, most_pages)  # partial pages of one query block, at most
        partial_pages = phys.gather(1, (full[:, :, None] + torch.arange(widest, device=device)).clamp(max=most_pages - 1).reshape(batch, -1))
        kv_indices = torch.zeros(batch, 1, q_blocks, pool_pages, dtype=torch.int32, device=device)
        kv_indices[:, 0, :, :widest] = partial_pages.view(batch, q_blocks, widest).to(torch.int32)
        full_indices = torch.zeros(batch, 1, q_blocks, pool_pages, dtype=torch.int32, device=device)
        full_indices[:, 0, :, :most_pages] = phys.to(torch.int32)[:, None, :]
        query_pos, owner_of = self.query_position, self.owner

        def causal_in_row(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            row_page = owner_of[b, kv_idx // page_size]
            return (row_page >= 0) & (row_page * page_size + kv_idx % page_size <= query_pos[b, q_idx])

        self.block_mask = BlockMask.from_kv_blocks(
            partial.to(torch.int32)[:, None, :],
            kv_indices,
            full.to(torch.int32)[:, None, :],
            full_indices,
            BLOCK_SIZE=(Q_BLOCK, page_size),
            mask_mod=causal_in_row,
            seq_lengths=(q_len, pool_pages * page_size),
            **_FORWARD_ONLY,
        )


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
    """Attention of the new tokens' queries `[N, q_heads, head_dim]` over the pool `[pool_tokens, kv_heads, head_dim]`.

    Returns `[N, q_heads, head_dim]`. Query heads are grouped over the K/V heads (GQA)
    when there are more of them.
    """
    n, q_heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    decode = batch.q_len == 1  # one query per item: no padding to place or to drop
    padded = q if decode else q.new_zeros(batch.batch * batch.q_len, q_heads, head_dim).index_copy_(0, batch.pad_index, q)
    queries = padded.reshape(batch.batch, batch.q_len, q_heads, head_dim).transpose(1, 2)
    keys = k_pool.transpose(0, 1)[None].expand(batch.batch, -1, -1, -1)
    values = v_pool.transpose(0, 1)[None].expand(batch.batch, -1, -1, -1)
    compiled = runs_compiled(q.device, batch.page_size, q.dtype)
    attend = _compiled_flex() if compiled else flex_attention
    options = DECODING_KERNEL if compiled and decode else None
    out = attend(queries, keys, values, block_mask=batch.block_mask, scale=1.0 / math.sqrt(head_dim), enable_gqa=q_heads != kv_heads, kernel_options=options)
    out = out.transpose(1, 2).reshape(batch.batch * batch.q_len, q_heads, head_dim)
    return out if decode else out.index_select(0, batch.pad_index)


def row_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last `n` positions of one row (queries `[n, q_heads, head_dim]`)
    over the K and V of its positions `0 .. len(row)-1`, at the pool locations `row`.

    The prefill path on CUDA: the row's K and V are gathered into one contiguous run (a copy
    of its context, small beside a prefill's projections) and attended with
    `scaled_dot_product_attention`'s fused kernels, whose lengths are arguments rather than
    compiled shapes. FlexAttention's compiled kernel is specialised to its static shape
    (batch, query length, pool), so prompts of every length would each compile their own;
    the decode steps, whose shapes the batch-size buckets bound, keep it. Query i sits at
    position `len(row) - n + i` (lower-right causal alignment). Query heads share their KV head
    inside the kernel (`enable_gqa`), so the gathered K and V are not repeated per group.
    """
    n, q_heads, _ = q.shape
    keys, values = (pool.index_select(0, row).transpose(0, 1)[None] for pool in (k_pool, v_pool))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys, values, attn_mask=causal_lower_right(n, row.shape[0]), enable_gqa=q_heads != k_pool.shape[1]
    )
    return out[0].transpose(0, 1)


#: the backward pass's half of a block mask (its query-side indices) is never used here:
#: torch releases that accept it are told not to build it
_FORWARD_ONLY = {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters else {}


def runs_compiled(device: torch.device, page_size: int, dtype: torch.dtype) -> bool:
    """Whether attention runs FlexAttention's compiled kernel: on CUDA, pages of KERNEL_PAGE tokens, half precision.

    float32 stays eager: the compiled kernel is measured and tested in half precision only
    (on the H200, torch 2.11, compiling it for a float32 chunk of 69 tokens with head_dim 16,
    llama-small's, found no kernel configuration once the decoding options were passed).
    """
    return device.type == "cuda" and page_size % KERNEL_PAGE == 0 and dtype in (torch.bfloat16, torch.float16)


_COMPILED: list[Any] = []


def _compiled_flex() -> Any:
    """FlexAttention compiled with static shapes (its fused kernels; eager FlexAttention is the reference math)."""
    if not _COMPILED:
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED[0]
