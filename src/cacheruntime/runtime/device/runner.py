"""Model runners: the compute a batch runs, reading and writing KV through ReqToToken.

A runner gets the batch's items (slot, the token range it computes, the token ids and the
version tags of those tokens), writes each new token's K and V at the device location the
ReqToToken table gives (`page * page_size + offset`), reads every K and V of the row's
tokens `0 .. end-1` back through the same table, and produces one next token per item.
It runs on the compute stream; the runtime has made that stream wait for the restores the
batch reads (O1) before it calls `forward`.

- `TinyRunner`: a small decoder with seeded random weights (float32), multi-head attention
  over the paged KV, greedy sampling; `reference` recomputes a sequence from scratch
  without any cache, so served outputs can be compared with it (D1 on real bytes).
- `TaggingRunner`: writes each token's version tag into its K and V bytes (exactly, as
  base-256 digits, in every layer and head) and returns `tag_digest` of the tags it reads
  back: a stale or half-written page shows up as a different next token (TAGGED_COMPUTE).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import attrs
import torch
import torch.nn.functional as F

from cacheruntime.protocol import tag_digest
from cacheruntime.runtime.device.streams import to_device

#: digits of a version tag in the KV bytes: base 256 is exact in float32, float16 and bfloat16
TAG_DIGITS = 4
TAG_BASE = 256


@attrs.frozen
class DecoderConfig:
    """Sizes of the small decoder (and of its KV pages).

    `heads` is the number of K/V heads, which with `layers`, `head_dim` and `dtype` fixes
    the KV page layout. `query_heads` is set only by a grouped-query model (the Llama
    runner): several query heads then read one K/V head; None means one per K/V head.
    """

    vocab: int = 97
    hidden: int = 32
    layers: int = 2
    heads: int = 2
    head_dim: int = 16
    mlp: int = 64
    dtype: str = "float32"
    query_heads: int | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


class ComputeItem(NamedTuple):
    """One item as compute sees it: row `slot` computes positions `start .. end-1`.

    A NamedTuple rather than an attrs class, and its tags as their first value (they are
    consecutive): the runtime builds one per item per step, and each object it allocates
    there is work for the garbage collector.
    """

    slot: int
    start: int
    end: int
    token_ids: tuple[int, ...]  # the tokens at positions start .. end-1
    first_tag: int  # the version tag of position start; position start + i has first_tag + i

    @property
    def tags(self) -> range:
        """The version tags of positions start .. end-1."""
        return range(self.first_tag, self.first_tag + self.end - self.start)


class ComputeBatch:
    """A batch as compute sees it: the columns of its `ComputeItem`s, one list per field.

    The runtime fills the columns from lists it already holds for the batch, so a step
    builds no object per item; a runner that wants items iterates (or indexes) the batch
    and gets `ComputeItem`s built on the fly. `token_ids` is built on first use from the
    plan's items and the rows' previous outputs (read before the runtime updates them),
    since a model that does not read tokens (the bench's) should not pay for them.
    """

    __slots__ = ("slots", "starts", "ends", "first_tags", "_items", "_rows", "_token_ids")

    def __init__(self, slots: list[int], starts: list[int], ends: list[int], first_tags: Sequence[int], items: Sequence[Any], rows: Sequence[Any]):
        self.slots, self.starts, self.ends, self.first_tags = slots, starts, ends, first_tags
        self._items, self._rows = items, rows  # the plan's BatchItems and their slots' records
        self._token_ids: list[tuple[int, ...]] | None = None

    @property
    def token_ids(self) -> list[tuple[int, ...]]:
        """Per item, the tokens at positions start .. end-1: the previous output if appended, then its inputs."""
        if self._token_ids is None:
            self._token_ids = [
                (row.last_output, *item.input_ids) if item.append_previous_output else tuple(item.input_ids) for item, row in zip(self._items, self._rows)
            ]
        return self._token_ids

    def subset(self, indices: Sequence[int]) -> ComputeBatch:
        """The items at `indices`, in that order (a runner that runs a batch's parts apart)."""
        pick = lambda column: [column[i] for i in indices]  # noqa: E731
        part = ComputeBatch(pick(self.slots), pick(self.starts), pick(self.ends), pick(self.first_tags), pick(self._items), pick(self._rows))
        if self._token_ids is not None:
            part._token_ids = pick(self._token_ids)
        return part

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[ComputeItem]:
        return map(ComputeItem, self.slots, self.starts, self.ends, self.token_ids, self.first_tags)


class TinyRunner:
    """A seeded random decoder over the paged KV pool, and its cache-free reference."""

    tagged = False

    def __init__(self, config: DecoderConfig, max_positions: int, device: torch.device, seed: int):
        self.config = config
        self.device = device
        gen = torch.Generator().manual_seed(seed)
        width = config.heads * config.head_dim

        def weight(rows: int, cols: int, scale: float | None = None) -> torch.Tensor:
            scale = 1.0 / math.sqrt(rows) if scale is None else scale
            return (torch.randn(rows, cols, generator=gen) * scale).to(device)

        self.embed = weight(config.vocab, config.hidden, 1.0)
        self.positions = weight(max_positions, config.hidden, 0.5)
        self.layers = [
            {
                "q": weight(config.hidden, width),
                "k": weight(config.hidden, width),
                "v": weight(config.hidden, width),
                "o": weight(width, config.hidden),
                "up": weight(config.hidden, config.mlp),
                "down": weight(config.mlp, config.hidden),
            }
            for _ in range(config.layers)
        ]
        self.unembed = weight(config.hidden, config.vocab)

    def forward(self, memory, table: torch.Tensor, items: ComputeBatch) -> torch.Tensor:
        """Each item's greedy next token (a device tensor), writing and reading KV through `table`."""
        out = []
        for item in items:
            new = table[item.slot, item.start : item.end].long()
            row = table[item.slot, : item.end].long()

            def paged_kv(layer: int, k: torch.Tensor, v: torch.Tensor, new=new, row=row):
                k_pool, v_pool = memory.layer_kv(layer)
                k_pool.index_copy_(0, new, k.to(k_pool.dtype))
                v_pool.index_copy_(0, new, v.to(v_pool.dtype))
                return k_pool.index_select(0, row).float(), v_pool.index_select(0, row).float()

            out.append(self._decode(item.token_ids, item.start, paged_kv))
        return torch.stack(out)

    def finish(self, outputs: list, items: ComputeBatch) -> list[int]:
        """The host values of `forward`'s tensor: one token per item."""
        return [int(token) for token in outputs]

    def reference(self, token_ids: list[int]) -> int:
        """The next token of `token_ids` recomputed from scratch, without any KV cache."""
        return int(self._decode(tuple(token_ids), 0, lambda layer, k, v: (k, v)))

    def _decode(self, token_ids: tuple[int, ...], start: int, kv) -> torch.Tensor:
        """Run the new tokens through every layer; `kv(layer, k, v)` gives the keys and values to attend."""
        cfg = self.config
        n = len(token_ids)
        ids = to_device(token_ids, torch.long, self.device)
        positions = torch.arange(start, start + n, device=self.device)
        x = self.embed[ids] + self.positions[positions]
        for index, w in enumerate(self.layers):
            h = F.layer_norm(x, (cfg.hidden,))
            q = (h @ w["q"]).view(n, cfg.heads, cfg.head_dim)
            k = (h @ w["k"]).view(n, cfg.heads, cfg.head_dim)
            v = (h @ w["v"]).view(n, cfg.heads, cfg.head_dim)
            keys, values = kv(index, k, v)
            scores = torch.einsum("nhd,lhd->hnl", q, keys) / math.sqrt(cfg.head_dim)
            future = torch.arange(keys.shape[0], device=self.device)[None, :] > positions[:, None]
            attn = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
            x = x + torch.einsum("hnl,lhd->nhd", attn, values).reshape(n, -1) @ w["o"]
            x = x + F.relu(F.layer_norm(x, (cfg.hidden,)) @ w["up"]) @ w["down"]
        return (F.layer_norm(x[-1], (cfg.hidden,)) @ self.unembed).argmax()


class TaggingRunner:
    """Compute that writes version tags into KV bytes and digests the tags it reads back."""

    tagged = True

    def __init__(self, config: DecoderConfig, device: torch.device):
        if config.head_dim < TAG_DIGITS:
            raise ValueError(f"the tagging runner needs head_dim >= {TAG_DIGITS}")
        self.config = config
        self.device = device

    def forward(self, memory, table: torch.Tensor, items: ComputeBatch) -> torch.Tensor:
        """Write each item's tags at its new locations; return the tags read for positions 0 .. end-1."""
        read = []
        for item in items:
            new = table[item.slot, item.start : item.end].long()
            row = table[item.slot, : item.end].long()
            encoded = self.encode(to_device(list(item.tags), torch.long, self.device))
            for layer in range(self.config.layers):
                for pool in memory.layer_kv(layer):
                    pool.index_copy_(0, new, encoded.to(pool.dtype))
            copies = torch.stack([pool.index_select(0, row) for layer in range(self.config.layers) for pool in memory.layer_kv(layer)])
            read.append(self.decode(copies))
        return torch.cat(read)

    def finish(self, outputs: list, items: ComputeBatch) -> list[int]:
        """`tag_digest` of the tags each item read, in item order."""
        tokens, offset = [], 0
        for item in items:
            tokens.append(tag_digest(tuple(outputs[offset : offset + item.end])))
            offset += item.end
        return tokens

    def page_tags(self, pages: torch.Tensor) -> torch.Tensor:
        """Tags held by pages `[n, layers, 2, page_size, heads, head_dim]`, as `[n, page_size]`."""
        n, layers, _, page_size, heads, head_dim = pages.shape
        copies = pages.permute(1, 2, 0, 3, 4, 5).reshape(layers * 2, n * page_size, heads, head_dim)
        return self.decode(copies).view(n, page_size)

    def encode(self, tags: torch.Tensor) -> torch.Tensor:
        """Tags `[m]` as KV values `[m, heads, head_dim]`: base-256 digits, the same in every head."""
        digits = torch.stack([(tags // TAG_BASE**i) % TAG_BASE for i in range(TAG_DIGITS)], dim=-1)
        values = torch.zeros(len(tags), self.config.heads, self.config.head_dim, dtype=torch.float32, device=tags.device)
        values[:, :, :TAG_DIGITS] = digits[:, None, :].float()
        return values

    def decode(self, copies: torch.Tensor) -> torch.Tensor:
        """Tags `[m]` from every copy `[copies, m, heads, head_dim]` of the values; -1 where copies disagree.

        A page moved with only some layers, or only K, or torn mid-copy, reads as -1,
        never as a plausible tag.
        """
        digits = copies[..., :TAG_DIGITS].double().round().long()
        weights = torch.tensor([TAG_BASE**i for i in range(TAG_DIGITS)], dtype=torch.long, device=copies.device)
        tags = (digits * weights).sum(dim=-1)  # [copies, m, heads]
        first = tags[0, :, 0]
        agree = (tags == first[None, :, None]).all(dim=2).all(dim=0)
        return torch.where(agree, first, torch.full_like(first, -1))


@runtime_checkable
class Runner(Protocol):
    """What the device layer asks of a model: compute a batch over the paged KV, on the compute stream.

    `forward` runs on the compute stream (after the restores it reads, O1) and returns one
    value per item, read back on the host as a list; `finish` turns those into next
    tokens. `tagged` claims TAGGED_COMPUTE: then `page_tags` decodes the version tags a
    page's bytes hold (for `probe()`), and `reference` is not available.
    """

    tagged: bool

    def forward(self, memory: Any, table: torch.Tensor, items: ComputeBatch) -> torch.Tensor: ...

    def finish(self, outputs: list[Any], items: ComputeBatch) -> list[int]: ...


def make_runner(kind: str, config: DecoderConfig, max_positions: int, device: torch.device, seed: int) -> Runner:
    """The runner named `kind`: "tiny", "tagging", "llama" (sized by `config`) or a Llama preset.

    A preset ("llama-small", "llama3-8b") fixes its own sizes, and the runtime sizes its KV
    pages from `config`: the two must be the same config (`LLAMA_CONFIGS[kind]`).
    """
    if kind == "tiny":
        return TinyRunner(config, max_positions, device, seed)
    if kind == "tagging":
        return TaggingRunner(config, device)
    # imported here: llama builds on this module, and only its runners need FlexAttention
    from cacheruntime.runtime.device.llama import LLAMA_CONFIGS, LlamaRunner

    if kind == "llama":
        return LlamaRunner(config, max_positions, device, seed)
    if kind in LLAMA_CONFIGS:
        if config != LLAMA_CONFIGS[kind]:
            raise ValueError(
                f"runner {kind!r} needs config=LLAMA_CONFIGS[{kind!r}] ({LLAMA_CONFIGS[kind]}), got {config}; or use runner='llama' with any config"
            )
        return LlamaRunner(config, max_positions, device, seed)
    raise ValueError(f"unknown runner {kind!r}; expected 'tiny', 'tagging', 'llama' or one of {', '.join(map(repr, LLAMA_CONFIGS))}")
