"""The Llama runner: paged attention against dense attention, and D1 on this architecture.

Paged attention (FlexAttention over the whole pool, a block mask from the ReqToToken
table) is compared with dense attention over each request's K and V gathered in row
order, on random pools with ragged items and pages shared between rows. D1: the runtime
serves multi-turn requests that attach published prefixes (from L1 and restored from
L2) with `runner="llama-small"`, and every served token must equal the runner's
recomputation from scratch (dense causal attention, no cache, no table).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from cacheruntime.invariants import check_state
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Restore
from cacheruntime.runtime.device.llama import LLAMA_CONFIGS, LlamaRunner
from cacheruntime.runtime.device.pagedattention import KERNEL_PAGE, PagedBatch, paged_attention
from cacheruntime.runtime.device.runner import DecoderConfig
from cacheruntime.runtime.factories import local

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

SMALL = LLAMA_CONFIGS["llama-small"]
PAGE = 4


def dense_attention(q, k_pool, v_pool, table, slot, start, end):
    """Causal attention of positions start .. end-1 over the row's K and V gathered in order."""
    row = table[slot, :end].long()
    groups = q.shape[1] // k_pool.shape[1]
    keys, values = (pool[row].repeat_interleave(groups, dim=1).transpose(0, 1)[None].float() for pool in (k_pool, v_pool))
    allowed = torch.arange(end, device=q.device)[None, :] <= torch.arange(start, end, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1)[None].float(), keys, values, attn_mask=allowed)[0].transpose(0, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("steps", ["ragged", "decode"])
def test_paged_attention_equals_dense_attention(device, seed, steps):
    # CUDA: bf16 through the compiled kernel (its pages are KERNEL_PAGE tokens); CPU: float32, eager
    dtype, tolerance, page_size = (torch.float32, 1e-5, PAGE) if device == "cpu" else (torch.bfloat16, 2e-2, KERNEL_PAGE)
    gen = torch.Generator().manual_seed(seed)
    print(f"seed {seed}")
    pool_pages, kv_heads, q_heads, head_dim = 24, 2, 8, 16
    k_pool = torch.randn(pool_pages * page_size, kv_heads, head_dim, generator=gen).to(device, dtype)
    v_pool = torch.randn(pool_pages * page_size, kv_heads, head_dim, generator=gen).to(device, dtype)
    table = torch.zeros(4, 8 * page_size, dtype=torch.int32)
    pages = torch.randperm(pool_pages, generator=gen).tolist()
    shared = pages[:2]  # a prefix of two pages in rows 0 and 2
    rows = {0: shared + pages[2:5], 1: pages[5:6], 2: shared + pages[6:8], 3: pages[8:11]}
    for slot, phys in rows.items():
        for j, page in enumerate(phys):
            table[slot, j * page_size : (j + 1) * page_size] = torch.arange(page * page_size, (page + 1) * page_size)
    table = table.to(device)
    # ragged: a chunk of prefill after the shared prefix, a whole short prefill, a decode, a decode in a partial page
    slots, starts, ends = [0, 1, 2, 3], [2 * page_size, 0, 3 * page_size - 1, 2 * page_size + 1], [4 * page_size + 3, 3, 3 * page_size, 2 * page_size + 2]
    if steps == "decode":  # one query per item (on CUDA the decoding kernel): at a page's last offset, its first, position 0
        starts = [5 * page_size - 1, 0, 2 * page_size, 3 * page_size - 2]
        ends = [start + 1 for start in starts]
    n = sum(e - s for s, e in zip(starts, ends))
    q = torch.randn(n, q_heads, head_dim, generator=gen).to(device, dtype)
    batch = PagedBatch(table, slots, starts, ends, page_size, pool_pages)
    paged = paged_attention(q, k_pool, v_pool, batch).float()
    offset = 0
    for slot, start, end in zip(slots, starts, ends):
        expected = dense_attention(q[offset : offset + end - start], k_pool, v_pool, table, slot, start, end)
        error = (paged[offset : offset + end - start] - expected).abs().max().item()
        assert error <= tolerance, f"slot {slot}: paged attention differs from dense by {error} (seed {seed})"
        offset += end - start


class Served:
    """A request served by the runtime, with the tokens it has seen and (served, recomputed) pairs."""

    def __init__(self, rt, tokens, attach=(), computed=0):
        self.rt, self.handle, self.tokens, self.attach = rt, rt.open_request(), list(tokens), tuple(attach)
        self.pending = self.tokens[computed:]
        self.outputs: list[tuple[int, int]] = []

    def item(self) -> BatchItem:
        new, self.pending = tuple(self.pending), []
        attach, self.attach = self.attach, ()
        return BatchItem(self.handle, new, attach, append_previous_output=not new)

    def turn(self, tokens) -> None:
        """The next user turn: its tokens follow the last output."""
        self.pending = [self.tokens[-1], *tokens]
        self.tokens.extend(tokens)


def step(rt, requests, intents=()):
    done = rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(r.item() for r in requests), tuple(intents))))
    for request, result in zip(requests, done.items):
        request.outputs.append((result.next_token, rt.reference_next_token(request.tokens)))
        request.tokens.append(result.next_token)


def llama_runtime(device, *, gathered_prefill=None, **options):
    sizes = dict(page_size=PAGE, max_requests=4, max_request_tokens=96)
    runner = LlamaRunner(SMALL, sizes["max_request_tokens"] + PAGE, torch.device(device), 3, gathered_prefill=gathered_prefill)
    return local(device, runner=runner, config=SMALL, seed=3, **sizes, **options)


# "gathered": prefill items in a pass of their own, each row's context gathered for
# scaled_dot_product_attention (the CUDA path of half-precision pages), beside the decode items
@pytest.mark.parametrize("prefill", ["paged", "gathered"])
def test_multi_turn_prefix_hits_equal_recomputation(device, prefill):
    rt = llama_runtime(device, gathered_prefill=prefill == "gathered", l1_pages=20, l2_pages=32)
    rng = random.Random(11)
    print("seed 11 (tokens), runtime seed 3")
    tokens = lambda n: [rng.randrange(SMALL.vocab) for _ in range(n)]  # noqa: E731
    system = tokens(3 * PAGE)

    first = Served(rt, system + tokens(2))
    step(rt, [first])
    for _ in range(3):
        step(rt, [first])
    first.turn(tokens(5))  # a second turn: prefill of a few tokens after the context
    step(rt, [first])
    step(rt, [first])
    prefix = rt.publish(first.handle, 0, 3)
    rt.submit((Backup(prefix),))

    # prefix hit in L1 (shared pages), ragged batch: one prefill beside one decode
    second = Served(rt, system + tokens(6), attach=(prefix,), computed=3 * PAGE)
    step(rt, [second, first])
    for _ in range(2):
        step(rt, [second, first])
    second.turn(tokens(3))
    step(rt, [first, second])

    rt.close_request(first.handle)
    rt.close_request(second.handle)
    rt.submit((Demote(prefix),))
    filler = Served(rt, tokens(4 * PAGE))  # reuses the pages the closed requests wrote
    step(rt, [filler])

    # prefix hit in L2: restored into other device pages
    third = Served(rt, system + tokens(2), attach=(prefix,), computed=3 * PAGE)
    step(rt, [third], intents=(Restore(prefix),))
    for _ in range(3):
        step(rt, [third, filler])
    third.turn(tokens(4))
    step(rt, [filler, third])
    rt.wait_completions()
    check_state(rt.probe())

    outputs = [pair for r in (first, second, filler, third) for pair in r.outputs]
    mismatches = [(served, reference) for served, reference in outputs if served != reference]
    assert not mismatches, f"served tokens differ from recomputation: {mismatches}"
    assert len({served for served, _ in outputs}) > 3, "the decoder must not be degenerate"
    rt.close()


def test_recomputation_sees_a_wrong_prefix(device):
    """The comparison above can fail: a prefix computed for other tokens gives other outputs."""
    rt = llama_runtime(device, l1_pages=16, l2_pages=0)
    rng = random.Random(5)
    a = Served(rt, [rng.randrange(SMALL.vocab) for _ in range(2 * PAGE)])
    step(rt, [a])
    prefix = rt.publish(a.handle, 0, 2)
    liar = Served(rt, [rng.randrange(SMALL.vocab) for _ in range(2 * PAGE)] + [5, 6], attach=(prefix,), computed=2 * PAGE)
    for _ in range(6):
        step(rt, [liar])
    assert any(served != reference for served, reference in liar.outputs)
    rt.close()


def test_a_preset_needs_its_own_config():
    with pytest.raises(ValueError, match="LLAMA_CONFIGS"):
        local("cpu", runner="llama-small", config=DecoderConfig())


def test_grouped_query_config_is_checked():
    with pytest.raises(ValueError, match="multiple of heads"):
        local("cpu", runner="llama", config=DecoderConfig(heads=3, query_heads=4))


def test_block_mask_visits_exactly_the_pages_a_query_block_can_see():
    """Every page with a location some query of a block may read is listed for that block, every
    listed page is the item's own, and a page listed as full (read without `mask_mod`) is visible
    to every query of the block at every offset: checked against the row layout directly, for a
    prefill over several query blocks, a chunk after a prefix, and decode steps (one at a page's
    last offset, where no page is partial)."""
    page_size, pool_pages, row_pages = 16, 64, 16
    gen = torch.Generator().manual_seed(7)
    table = torch.zeros(3, row_pages * page_size, dtype=torch.int32)
    rows = torch.randperm(pool_pages, generator=gen)[: 3 * row_pages].view(3, row_pages)
    for slot in range(3):
        for j in range(row_pages):
            table[slot, j * page_size : (j + 1) * page_size] = torch.arange(rows[slot, j] * page_size, (rows[slot, j] + 1) * page_size)
    slots, starts, ends = [0, 1, 2], [0, 37, 4 * page_size - 1], [200, 180, 4 * page_size]
    cases = [PagedBatch(table, slots, starts, ends, page_size, pool_pages)]
    cases.append(PagedBatch.decode(table, torch.tensor(slots), torch.tensor([5, 4 * page_size - 2, 4 * page_size - 1]), page_size, pool_pages))
    assert cases[0].block_mask.kv_num_blocks.shape[2] == 2, "the prefill spans two query blocks"
    for batch in cases:
        mask = batch.block_mask
        for b, slot in enumerate(slots):
            own = rows[slot].tolist()
            for qb in range(mask.kv_num_blocks.shape[2]):
                queries = batch.query_position[b, qb * 128 : (qb + 1) * 128].tolist()
                full = set(mask.full_kv_indices[b, 0, qb, : mask.full_kv_num_blocks[b, 0, qb]].tolist())
                partial = set(mask.kv_indices[b, 0, qb, : mask.kv_num_blocks[b, 0, qb]].tolist())
                assert not full & partial
                assert full | partial <= set(own), f"item {b}, query block {qb}: pages {(full | partial) - set(own)} are not its own"
                seen = {own[j] for j in range(max(queries) // page_size + 1)}
                assert seen <= full | partial, f"item {b}, query block {qb}: pages {seen - full - partial} are visible but not visited"
                for page in full:
                    assert (own.index(page) + 1) * page_size - 1 <= min(queries), f"item {b}: page {page} is full but not visible to query {min(queries)}"


def test_decode_step_with_spare_rows_equals_the_eager_step():
    """The graph's step (device tensors alone, a bucket's spare rows repeating item 0) computes the
    eager step's tokens and leaves the pool as the eager step does: a spare row changes nothing."""
    from cacheruntime.runtime.device.llama import LlamaRunner
    from cacheruntime.runtime.device.memory import KVMemory
    from cacheruntime.runtime.device.reqtotoken import ReqToToken
    from cacheruntime.runtime.device.runner import ComputeBatch

    runner = LlamaRunner(SMALL, 64, torch.device("cpu"), seed=2)
    sizes = dict(l1_pages=12, l2_pages=0, page_size=PAGE, layers=SMALL.layers, heads=SMALL.heads, head_dim=SMALL.head_dim, dtype=torch.float32)
    eager, graphed = (KVMemory(device=torch.device("cpu"), **sizes) for _ in range(2))
    eager.l1.copy_(torch.randn(eager.l1.shape, generator=torch.Generator().manual_seed(4)))
    graphed.l1.copy_(eager.l1)
    table = ReqToToken(3, 4 * PAGE, PAGE, torch.device("cpu"))
    table.pages.copy_((torch.arange(12).view(3, 4)[..., None] * PAGE + table.offsets).to(torch.int32))
    slots, positions, ids = [2, 0, 1], [9, 3, 13], [5, 17, 40]
    items = ComputeBatch(slots, positions, [p + 1 for p in positions], [0] * 3, [BatchItem(None, (t,)) for t in ids], [None] * 3)  # type: ignore[arg-type]
    expected = runner.forward(eager, table.table, items)
    spare = 2  # a bucket of 5 for 3 items
    inputs = torch.tensor([ids + [ids[0]] * spare, slots + [slots[0]] * spare, positions + [positions[0]] * spare, [0, 1, 2] + [0] * spare])
    got = runner._decode_step(graphed, table.table, inputs)
    assert got[:3].tolist() == expected.tolist()
    assert torch.allclose(graphed.l1, eager.l1, atol=1e-6), "the spare rows changed the pool"
    written = table.table[torch.tensor(slots), torch.tensor(positions)].long()
    untouched = torch.ones(12 * PAGE, dtype=torch.bool)
    untouched[written] = False
    for layer in range(SMALL.layers):
        for pool_e, pool_g in zip(eager.layer_kv(layer), graphed.layer_kv(layer)):
            assert torch.equal(pool_e[untouched], pool_g[untouched])


@pytest.mark.cuda
def test_cuda_graph_decode_replays_the_eager_step():
    """On CUDA (bf16, pages the compiled kernel takes) decode steps replay a CUDA graph per bucket of
    batch sizes: a full bucket's tokens and K and V equal the eager step's, and a part-full bucket's
    spare rows write nothing but the real items' K and V."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from cacheruntime.runtime.device.llama import LlamaRunner
    from cacheruntime.runtime.device.memory import KVMemory
    from cacheruntime.runtime.device.reqtotoken import ReqToToken
    from cacheruntime.runtime.device.runner import ComputeBatch

    cuda, page, rows, row_pages = torch.device("cuda"), KERNEL_PAGE, 8, 3
    config = DecoderConfig(vocab=256, hidden=128, layers=2, heads=2, head_dim=64, mlp=256, dtype="bfloat16", query_heads=4)
    runner = LlamaRunner(config, row_pages * page, cuda, seed=5)
    sizes = dict(l1_pages=rows * row_pages, l2_pages=0, page_size=page, layers=2, heads=2, head_dim=64, dtype=torch.bfloat16)
    start = torch.randn(2, 2, rows * row_pages, page, 2, 64, generator=torch.Generator().manual_seed(8)).to(cuda, torch.bfloat16)  # l1's layout
    eager, graphed = (KVMemory(device=cuda, **sizes) for _ in range(2))
    table = ReqToToken(rows, row_pages * page, page, cuda)
    table.pages.copy_(
        (torch.randperm(rows * row_pages, generator=torch.Generator().manual_seed(9)).view(rows, row_pages).to(cuda)[..., None] * page + table.offsets).to(
            torch.int32
        )
    )
    rng = random.Random(21)
    print("seeds 5 (weights), 8 (pool), 9 (pages), 21 (batches)")
    for n in (1, 2, 4, 8, 3, 5):
        for memory in (eager, graphed):
            memory.l1.copy_(start)
        slots = rng.sample(range(rows), n)
        positions = [rng.randrange(1, row_pages * page - 1) for _ in slots]
        ids = [rng.randrange(config.vocab) for _ in slots]
        items = ComputeBatch(slots, positions, [p + 1 for p in positions], [0] * n, [BatchItem(None, (t,)) for t in ids], [None] * n)  # type: ignore[arg-type]
        with runner.without_graphs():
            expected = runner.forward(eager, table.table, items).tolist()
        got = runner.forward(graphed, table.table, items).tolist()
        written = table.table[torch.tensor(slots, device=cuda), torch.tensor(positions, device=cuda)].long()
        others = torch.ones(rows * row_pages * page, dtype=torch.bool, device=cuda)
        others[written] = False
        for layer in range(config.layers):
            for pool_e, pool_g in zip(eager.layer_kv(layer), graphed.layer_kv(layer)):
                assert torch.equal(pool_e[others], pool_g[others]), f"B={n}: the graph wrote outside the items' locations"
                assert torch.allclose(pool_e[written].float(), pool_g[written].float(), atol=2e-2), f"B={n}: K or V differ"
        if n in (1, 2, 4, 8):  # a full bucket runs the eager step's shapes: the same kernels
            assert got == expected, f"B={n}: graph tokens {got} != eager {expected}"
    assert runner.graphs is not None and set(runner.graphs.capture_seconds) == {1, 2, 4, 8}, runner.graphs and runner.graphs.capture_seconds


#: the largest relative error (L2 norm of the difference over the norm) allowed between the
#: final hidden state of a paged bf16 step of the 8B shape and its dense recomputation
DENSE_TOLERANCE_8B = 0.05


@pytest.mark.cuda
def test_llama3_8b_shape_paged_steps_match_dense_recomputation():
    """The Llama-3-8B shape in bf16 (seeded random weights): a ragged prefill and decode steps through
    the paged pool (compiled attention, 128-token pages) against a dense causal recomputation of
    each sequence from scratch, compared on the final hidden state each next token is read from."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from cacheruntime.runtime.device.llama import LlamaRunner
    from cacheruntime.runtime.device.memory import KVMemory
    from cacheruntime.runtime.device.reqtotoken import ReqToToken
    from cacheruntime.runtime.device.runner import ComputeBatch

    cuda, config, page, row_pages = torch.device("cuda"), LLAMA_CONFIGS["llama3-8b"], KERNEL_PAGE, 3
    runner = LlamaRunner(config, row_pages * page, cuda, seed=0, cuda_graphs=False)
    memory = KVMemory(
        device=cuda,
        l1_pages=2 * row_pages,
        l2_pages=0,
        page_size=page,
        layers=config.layers,
        heads=config.heads,
        head_dim=config.head_dim,
        dtype=torch.bfloat16,
    )
    table = ReqToToken(2, row_pages * page, page, cuda)
    table.pages.copy_((torch.tensor([[4, 0, 2], [5, 1, 3]], device=cuda)[..., None] * page + table.offsets).to(torch.int32))
    hidden: list[torch.Tensor] = []
    next_tokens = runner._next_tokens
    runner._next_tokens = lambda h: hidden.append(h.float()) or next_tokens(h)  # type: ignore[method-assign]
    rng = random.Random(17)
    print(f"seed 0 (weights), 17 (prompts); tolerance {DENSE_TOLERANCE_8B}")
    sequences = [[rng.randrange(config.vocab) for _ in range(n)] for n in (300, 131)]
    starts = [0, 0]
    errors = []
    for _ in range(4):  # a ragged prefill, then three decode steps
        ends = [len(s) for s in sequences]
        items = ComputeBatch([0, 1], starts, ends, [0, 0], [BatchItem(None, tuple(s[a:])) for s, a in zip(sequences, starts)], [None, None])  # type: ignore[arg-type]
        hidden.clear()
        tokens = runner.forward(memory, table.table, items).tolist()
        paged = hidden[0]
        for b, sequence in enumerate(sequences):
            hidden.clear()
            runner.reference(sequence)
            dense = hidden[0][0]
            errors.append(((paged[b] - dense).norm() / dense.norm()).item())
        for sequence, token in zip(sequences, tokens):
            sequence.append(token)
        starts = ends
    print("relative errors of the final hidden state, per step and item:", [f"{e:.2e}" for e in errors])
    assert max(errors) <= DENSE_TOLERANCE_8B, errors
