"""A Llama-architecture decoder as a runner: seeded random weights, K and V in the paged pool.

The architecture of Llama 3 (RMSNorm, rotary position embedding, grouped-query attention,
SwiGLU MLP, untied output projection) at any size a `DecoderConfig` gives; the weights
are seeded random numbers, since random weights take the same time as trained ones and
D1 compares the runtime with recomputation of the same weights, not with a real model.

`forward` runs a ragged batch in one pass: all new tokens of all items go through each
layer's projections together, their K and V are written at the locations the
ReqToToken table gives, and attention reads the pool through the table
(`pagedattention`), so a step never copies a request's context. On CUDA a decode step
(one new token per item) replays a CUDA graph of its batch-size bucket (`decodegraphs`),
and a batch with prefill items runs in two passes, as SGLang runs its extend and decode
batches apart: its decode items as a decode step, its prefill items with each row's
context gathered for the fused attention kernel (`row_attention`), so prompts of any
length run without compiling a kernel per length.
`reference` recomputes a sequence from scratch with dense causal attention (no cache, no table): the served
tokens must equal it (D1).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from cacheruntime.runtime.device.decodegraphs import DecodeGraphs
from cacheruntime.runtime.device.pagedattention import PagedBatch, paged_attention, row_attention, runs_compiled
from cacheruntime.runtime.device.runner import ComputeBatch, DecoderConfig
from cacheruntime.runtime.device.streams import to_device

#: Llama 3's rotary base and RMSNorm epsilon
ROPE_THETA = 500_000.0
NORM_EPS = 1e-5

#: Named sizes: a float32 one small enough for CPU tests and the main job, and Llama-3-8B's shape.
LLAMA_CONFIGS: dict[str, DecoderConfig] = {
    "llama-small": DecoderConfig(vocab=97, hidden=64, layers=2, heads=2, head_dim=16, mlp=128, dtype="float32", query_heads=4),
    "llama3-8b": DecoderConfig(vocab=128256, hidden=4096, layers=32, heads=8, head_dim=128, mlp=14336, dtype="bfloat16", query_heads=32),
}

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LlamaRunner:
    """A Llama-shaped decoder over the paged KV pool, and its cache-free reference."""

    tagged = False

    def __init__(
        self, config: DecoderConfig, max_positions: int, device: torch.device, seed: int, *, cuda_graphs: bool = True, gathered_prefill: bool | None = None
    ):
        query_heads = config.query_heads or config.heads
        if query_heads % config.heads or config.head_dim % 2:
            raise ValueError(f"a Llama config needs query_heads ({query_heads}) a multiple of heads ({config.heads}) and an even head_dim ({config.head_dim})")
        self.config, self.device, self.query_heads = config, device, query_heads
        dtype = config.torch_dtype
        gen = torch.Generator(device=device).manual_seed(seed)

        def weight(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype).mul_(scale)

        def gain() -> torch.Tensor:
            return torch.randn(config.hidden, generator=gen, device=device, dtype=dtype).mul_(0.1).add_(1.0)

        hidden, head_dim = config.hidden, config.head_dim
        self.qkv_split = (query_heads * head_dim, config.heads * head_dim, config.heads * head_dim)
        self.embed = weight(config.vocab, hidden, scale=1.0)
        self.layers = [
            {
                "attn_norm": gain(),
                "qkv": weight(hidden, sum(self.qkv_split), scale=1 / math.sqrt(hidden)),
                "o": weight(query_heads * head_dim, hidden, scale=1 / math.sqrt(query_heads * head_dim)),
                "mlp_norm": gain(),
                "gate_up": weight(hidden, 2 * config.mlp, scale=1 / math.sqrt(hidden)),
                "down": weight(config.mlp, hidden, scale=1 / math.sqrt(config.mlp)),
            }
            for _ in range(config.layers)
        ]
        self.final_norm = gain()
        self.unembed = weight(hidden, config.vocab, scale=1 / math.sqrt(hidden))
        inverse = ROPE_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
        angles = torch.arange(max_positions, dtype=torch.float32, device=device)[:, None] * inverse[None, :]
        self.cos, self.sin = angles.cos(), angles.sin()
        # Between two attentions is one compiled region on CUDA: the rest of a layer and the
        # next layer's work up to its attention. Eagerly, each elementwise step is several
        # passes over the activations (float32 conversions, a kernel per product and sum), a
        # sixth of a prefill's time on the H200; compiled one function per step, a short
        # prefill's time was the host's calls into five compiled functions a layer
        # (docs/gpu-record.md, benchmarks/diagnostics/prefillhost.py). One region keeps the
        # fused kernels with one such call a layer. CPU runs them eagerly.
        fuse = (lambda f: torch.compile(f, dynamic=True)) if device.type == "cuda" else (lambda f: f)
        self._before_attention, self._between_attentions = fuse(_before_attention), fuse(_between_attentions)
        self._after_attention, self._norm = fuse(_after_attention), fuse(_rms_norm)
        #: decode steps replayed from CUDA graphs (on CUDA, where attention runs the compiled kernel)
        self.graphs = DecodeGraphs(self._decode_step, device) if cuda_graphs and device.type == "cuda" else None
        #: prefill items attend through `row_attention` (None: where attention runs the compiled kernel)
        self.gathered_prefill = gathered_prefill

    @property
    def step_weight_bytes(self) -> int:
        """Bytes of the weights every step reads whole: all but the embedding table, of which it reads its tokens' rows."""
        tensors = [self.final_norm, self.unembed, *(w for layer in self.layers for w in layer.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def matmul_parameters(self) -> tuple[int, int]:
        """(parameters every token multiplies by: the layers' projections, the output projection's (last token only))."""
        per_token = sum(layer[name].numel() for layer in self.layers for name in ("qkv", "o", "gate_up", "down"))
        return per_token, self.unembed.numel()

    def forward(self, memory: Any, table: torch.Tensor, items: ComputeBatch) -> torch.Tensor:
        """Each item's greedy next token (a device tensor), writing and reading KV through `table`."""
        self._check_layout(memory.l1)
        _, _, pool_pages, page_size, _, _ = memory.l1.shape
        compiled = runs_compiled(self.device, page_size, memory.l1.dtype)
        if self.graphs is not None and compiled and self.graphs.serves(items):
            return self.graphs.run(memory, table, items)
        gathered = compiled if self.gathered_prefill is None else self.gathered_prefill
        prefill = [i for i, (start, end) in enumerate(zip(items.starts, items.ends)) if end - start > 1] if gathered else []
        if prefill:
            if len(prefill) == len(items):
                return self._prefill(memory, table, items)
            decode = [i for i, (start, end) in enumerate(zip(items.starts, items.ends)) if end - start == 1]
            tokens = torch.empty(len(items), dtype=torch.int64, device=self.device)
            tokens[to_device(decode, torch.int64, self.device)] = self.forward(memory, table, items.subset(decode))
            tokens[to_device(prefill, torch.int64, self.device)] = self._prefill(memory, table, items.subset(prefill))
            return tokens
        batch = PagedBatch(table, items.slots, items.starts, items.ends, page_size, pool_pages)
        ids = to_device([token for tokens in items.token_ids for token in tokens], torch.int64, self.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_pool, v_pool = memory.layer_kv(layer)
            k_pool.index_copy_(0, batch.new_locations, k)
            v_pool.index_copy_(0, batch.new_locations, v)
            return paged_attention(q, k_pool, v_pool, batch)

        hidden = self._layers(ids, batch.positions, attend)
        return self._next_tokens(hidden.index_select(0, batch.last))

    def _prefill(self, memory: Any, table: torch.Tensor, items: ComputeBatch) -> torch.Tensor:
        """Each item's next token, attention through `row_attention` item by item (see the module docstring)."""
        lengths = [end - start for start, end in zip(items.starts, items.ends)]
        ids = to_device([token for tokens in items.token_ids for token in tokens], torch.int64, self.device)
        slots = to_device([slot for slot, n in zip(items.slots, lengths) for _ in range(n)], torch.int64, self.device)
        positions = to_device([p for start, end in zip(items.starts, items.ends) for p in range(start, end)], torch.int64, self.device)
        locations = table[slots, positions].long()
        rows = [table[slot, :end].long() for slot, end in zip(items.slots, items.ends)]
        bounds = [0, *itertools.accumulate(lengths)]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_pool, v_pool = memory.layer_kv(layer)
            k_pool.index_copy_(0, locations, k)
            v_pool.index_copy_(0, locations, v)
            return torch.cat([row_attention(q[lo:hi], k_pool, v_pool, row) for lo, hi, row in zip(bounds, bounds[1:], rows)])

        hidden = self._layers(ids, positions, attend)
        return self._next_tokens(hidden.index_select(0, to_device([hi - 1 for hi in bounds[1:]], torch.int64, self.device)))

    @contextlib.contextmanager
    def without_graphs(self) -> Iterator[None]:
        """Every step runs eagerly while inside (the bench times a step both ways in one run)."""
        graphs, self.graphs = self.graphs, None
        try:
            yield
        finally:
            self.graphs = graphs

    def _decode_step(self, memory: Any, table: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """One decode step from device tensors alone (what a graph captures): `inputs` `[4, B]` holds
        each row's token id, slot, position, and the row whose K and V it writes (its own, or
        item 0's for a spare row of a bucket)."""
        ids, slots, positions, source = inputs
        _, _, pool_pages, page_size, _, _ = memory.l1.shape
        batch = PagedBatch.decode(table, slots, positions, page_size, pool_pages)
        locations = batch.new_locations[source]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_pool, v_pool = memory.layer_kv(layer)
            k_pool.index_copy_(0, locations, k[source])
            v_pool.index_copy_(0, locations, v[source])
            return paged_attention(q, k_pool, v_pool, batch)

        return self._next_tokens(self._layers(ids, positions, attend))

    def finish(self, outputs: list, items: ComputeBatch) -> list[int]:
        """The host values of `forward`'s tensor: one token per item."""
        return [int(token) for token in outputs]

    def reference(self, token_ids: list[int]) -> int:
        """The next token of `token_ids` recomputed from scratch: dense causal attention, no KV cache."""
        ids = to_device(list(token_ids), torch.int64, self.device)
        positions = torch.arange(len(token_ids), device=self.device)
        groups = self.query_heads // self.config.heads

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = (t.repeat_interleave(groups, dim=1).transpose(0, 1)[None] for t in (k, v))
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, is_causal=True)
            return out[0].transpose(0, 1)

        hidden = self._layers(ids, positions, attend)
        return int(self._next_tokens(hidden[-1:])[0])

    def _check_layout(self, l1: torch.Tensor) -> None:
        cfg = self.config
        layers, _, _, _, heads, head_dim = l1.shape
        if (layers, heads, head_dim, l1.dtype) != (cfg.layers, cfg.heads, cfg.head_dim, cfg.torch_dtype):
            raise ValueError(
                f"the KV pool holds layers={layers}, kv heads={heads}, head_dim={head_dim}, {l1.dtype}; this model needs "
                f"{cfg.layers}, {cfg.heads}, {cfg.head_dim}, {cfg.torch_dtype}: give the runtime the runner's config"
            )

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Run tokens `ids` at `positions` through every layer; `attend(layer, q, k, v)` is the attention."""
        cfg = self.config
        n = ids.shape[0]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        x = self.embed[ids]
        heads = (self.query_heads, cfg.heads, cfg.head_dim)
        first, last = self.layers[0], self.layers[-1]
        q, k, v = self._before_attention(x, first["attn_norm"], first["qkv"], cos, sin, self.qkv_split, heads)
        for index, (w, after) in enumerate(zip(self.layers, self.layers[1:])):
            attended = attend(index, q, k, v).reshape(n, -1)
            x, q, k, v = self._between_attentions(
                x, attended, w["o"], w["mlp_norm"], w["gate_up"], w["down"], after["attn_norm"], after["qkv"], cos, sin, self.qkv_split, heads
            )
        attended = attend(len(self.layers) - 1, q, k, v).reshape(n, -1)
        return self._after_attention(x, attended, last["o"], last["mlp_norm"], last["gate_up"], last["down"])

    def _next_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """Greedy next token of each row of `hidden` `[m, hidden]`."""
        return (self._norm(hidden, self.final_norm) @ self.unembed).float().argmax(dim=-1)


def _before_attention(
    x: torch.Tensor, gain: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, split: tuple[int, int, int], heads: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's queries, keys and values of tokens `x` `[n, hidden]`, rotated; `heads` is (query heads, KV heads, head_dim)."""
    n = x.shape[0]
    query_heads, kv_heads, head_dim = heads
    q, k, v = (_rms_norm(x, gain) @ qkv).split(split, dim=-1)
    return _rotate(q.view(n, query_heads, head_dim), cos, sin), _rotate(k.view(n, kv_heads, head_dim), cos, sin), v.reshape(n, kv_heads, head_dim)


def _after_attention(x: torch.Tensor, attended: torch.Tensor, o: torch.Tensor, gain: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The rest of a layer: the output projection and the MLP, each added to the residual `x`.

    The residual adds ride in the products' epilogues (addmm): two kernels fewer per layer.
    """
    x = torch.addmm(x, attended, o)
    return torch.addmm(x, _swiglu(_rms_norm(x, gain) @ gate_up), down)


def _between_attentions(
    x: torch.Tensor,
    attended: torch.Tensor,
    o: torch.Tensor,
    mlp_gain: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    attn_gain: torch.Tensor,
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    split: tuple[int, int, int],
    heads: tuple[int, int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rest of one layer after its attention, then the next layer's work before its own: (residual, q, k, v)."""
    x = _after_attention(x, attended, o, mlp_gain, gate_up, down)
    return (x, *_before_attention(x, attn_gain, qkv, cos, sin, split, heads))


def _rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """RMSNorm in float32, returned in `x`'s dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS)).to(x.dtype) * gain


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: silu of the first half times the second."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of `x` `[n, heads, head_dim]` (Llama's split-half form), in float32."""
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)
