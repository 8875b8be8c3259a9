"""The cpu section's decode step against SGLang's own code on its CPU path (section `cpu-sglang`).

The `cpu` section's baseline (`cpucost.DirectPools`) is this project's re-implementation
of SGLang's bookkeeping. This section times SGLang's code itself, on its real pools
(`ReqToTokenPool`, `PagedTokenToKVPoolAllocator`, built as the SGLang adapter builds them:
`conformance/adapters/sglang/stack.py`), for the same B decode items, in blocks that
alternate with the boundary's step and with `DirectPools` (`cpucost.alternating`):

- **SGLang's CPU path**: the calls SGLang's `alloc_for_decode_default` makes for one
  paged decode step: the last location of each row read from `req_to_token`,
  `PagedTokenToKVPoolAllocator.alloc_decode`, and `ReqToTokenPool.write` of the B new
  locations; then the sequence lengths advanced as `ScheduleBatch.prepare_for_decode`
  does. Without a Triton-capable platform `alloc_decode` runs `alloc_decode_naive` (torch
  ops on the host), not the Triton kernel; the row is SGLang's CPU path, and the source
  locations of what ran are in its details (`sglang_source`);
- **SGLang's whole call** (a row without a target): `alloc_for_decode` itself, SGLang's
  unchanged function, on a batch that holds the real pools, a `RadixCache` and one
  `ReqKvInfo` per request; on top of the three calls it checks for eviction, advances the
  per-request counters and the auxiliary cache;
- **the boundary on simulated streams** (a diagnostic row without a target): the same
  runtime built with `streams="simulated"`, whose streams run in the calling thread
  (the conformance suite's seeded interleavings), so its step costs the boundary's
  bookkeeping without the CPU stream worker's two thread switches per batch. On CPU the
  default runtime runs each stream on a worker thread; on CUDA no thread is involved.

Each side's number is the median of its block means (`BLOCKS` blocks, alternating); the
details also carry the means, every block, and the median of the blockwise ratios.

Every SGLang side also runs the same null model step as the boundary and `DirectPools`. What SGLang's
scheduler does around these calls per step (building the ForwardBatch, processing results
per request) is not timed, so the baseline is a floor of SGLang's per-step CPU cost.

SGLang is importable only in its own environment (`conformance/adapters/sglang/install.sh`
builds `.venv-sglang`), and there only on the CPU; elsewhere, or with `--device cuda`,
the section is skipped and says why.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import statistics
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.cpucost import CALLS, DecodeSides, Shape, alternating, boundary_rows, decode_sides, timing_detail
from benchmarks.harness import NullRunner
from benchmarks.report import Row

SECTION = "cpu-sglang"

#: Blocks per side: many short ones, each side's number the median of its block means, so
#: that a block in which another process took the core (on a shared 2-core machine a block
#: can take 20x its neighbours) moves the row less than a mean over all steps would.
BLOCKS = 30


def installed() -> bool:
    """Whether this python has SGLang installed (by its metadata: a folder named sglang on the path does not count)."""
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def unavailable(device: torch.device) -> str | None:
    """Why the section cannot run here, or None when it can."""
    if device.type != "cpu":
        return f"SGLang's CPU path is measured on the CPU: run with --device cpu (this run is on {device.type})"
    try:
        if not installed():
            raise ImportError("no sglang distribution installed")
        from conformance.adapters.sglang.stack import prepare_imports

        prepare_imports()
        from sglang.srt.mem_cache import allocation  # noqa: F401  (the import SGLang's CPU path needs)
    except ImportError as error:
        return (
            f"SGLang is not importable in this python ({type(error).__name__}: {error}); run it under the SGLang "
            "environment's python (conformance/adapters/sglang/install.sh builds .venv-sglang) with the repository "
            "and conformance/adapters/sglang/stubs on PYTHONPATH"
        )
    return None


def _where(fn: Any) -> str:
    """`sglang/...py:LINE` of `fn` in the installed SGLang."""
    path = Path(inspect.getsourcefile(fn) or "?")
    parts = path.parts
    tail = Path(*parts[parts.index("sglang") :]) if "sglang" in parts else path
    return f"{tail}:{inspect.getsourcelines(fn)[1]}"


def sglang_source() -> dict[str, str]:
    """Where each piece of SGLang this section runs is defined in the installed SGLang."""
    from sglang.srt.mem_cache import allocation
    from sglang.srt.mem_cache.allocator import paged
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    return {
        "alloc_for_decode_default": _where(allocation.alloc_for_decode_default),
        "PagedTokenToKVPoolAllocator.alloc_decode": _where(paged.PagedTokenToKVPoolAllocator.alloc_decode),
        "alloc_decode_naive (the body that runs on CPU)": _where(paged.alloc_decode_naive),
        "ReqToTokenPool.write": _where(ReqToTokenPool.write),
    }


class SGLangDecode:
    """SGLang's real pools with `shape.batch` rows of `shape.context` tokens, and one decode step on them.

    `whole`: the step is SGLang's `alloc_for_decode` (its whole function); otherwise the
    three calls it makes on the pools (`step` says which).
    """

    def __init__(self, shape: Shape, *, whole: bool):
        from sglang.srt.managers.schedule_batch import ReqKvInfo, ScheduleBatch
        from sglang.srt.mem_cache import allocation

        from conformance.adapters.sglang.stack import build_stack

        ps = shape.page_size
        # One spare page per row more than the runtime's pool: alloc_for_decode's eviction
        # check asks for a whole page per row every step (alloc_paged_token_slots_decode).
        stack = build_stack(page_size=ps, max_requests=shape.batch, max_request_tokens=shape.max_tokens, l1_pages=shape.pages + shape.batch, l2_pages=0)
        self.allocator, self.pool = stack.allocator, stack.req_to_token_pool
        if self.allocator.use_triton_kernels:
            raise RuntimeError("SGLang's allocator chose its Triton kernels on this platform: this section measures its CPU path")
        self.alloc_for_decode = allocation.alloc_for_decode
        self.whole = whole
        reqs = [SimpleNamespace(kv=ReqKvInfo()) for _ in range(shape.batch)]
        rows = self.pool.alloc(reqs)
        if rows is None:
            raise RuntimeError(f"SGLang's ReqToTokenPool has no {shape.batch} free rows")
        for req in reqs:  # the prefill's allocation and table write, not timed
            locations = self.allocator.alloc(-(-shape.context // ps) * ps)
            self.pool.write((req.kv.req_pool_idx, slice(0, shape.context)), locations[: shape.context].to(torch.int32))
            req.kv.kv_allocated_len = req.kv.kv_committed_len = shape.context
        lengths = torch.full((shape.batch,), shape.context, dtype=torch.int64)
        indices = torch.tensor(rows, dtype=torch.int64)
        # What alloc_for_decode reads of a ScheduleBatch; on CPU the "device" tensors are host tensors.
        self.batch = SimpleNamespace(
            device="cpu",
            reqs=reqs,
            req_pool_indices=indices,
            req_pool_indices_cpu=indices.clone(),
            seq_lens=lengths,
            seq_lens_cpu=lengths.clone(),
            req_to_token_pool=self.pool,
            tree_cache=stack.tree,
            model_config=SimpleNamespace(is_encoder_decoder=False),
        )
        self.batch.maybe_evict_swa = types.MethodType(ScheduleBatch.maybe_evict_swa, self.batch)
        self.slots = list(range(shape.batch))
        self.null = NullRunner(torch.device("cpu"))

    def step(self) -> list[int]:
        b = self.batch
        if self.whole:
            self.alloc_for_decode(b, 1)
        else:  # alloc_for_decode_default's paged path, its calls on the pools only
            last_loc = self.pool.req_to_token[b.req_pool_indices, b.seq_lens - 1]
            out = self.allocator.alloc_decode(b.seq_lens + 1, b.seq_lens_cpu + 1, last_loc)
            if out is None:
                raise RuntimeError("SGLang's allocator is out of pages")
            self.pool.write((b.req_pool_indices, b.seq_lens.clone()), out.to(torch.int32))
        # ScheduleBatch.prepare_for_decode, after alloc_for_decode
        b.seq_lens = b.seq_lens + 1
        b.seq_lens_cpu = b.seq_lens_cpu + 1
        return self.null.finish(self.null.forward(None, self.pool.req_to_token, self.slots).tolist(), self.slots)

    def lengths(self) -> list[int]:
        """Each row's length in the batch (for the caller's check that every step ran)."""
        return [int(n) for n in self.batch.seq_lens_cpu]


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> str | None:
    """The section's rows, or why it was skipped."""
    reason = unavailable(device)
    if reason is not None:
        return reason
    version = importlib.metadata.version("sglang")
    source = sglang_source()
    for batch in args.cpu_batches:
        with guard(SECTION, f"B={batch}"), decode_sides(args, device, batch) as sides:
            simulated_split = dict.fromkeys(CALLS, 0.0)
            with boundary_rows(args, device, sides.shape, simulated_split, streams="simulated") as simulated:
                _measure(args, sides, simulated, version, source, rows)
    return None


def _measure(args: Any, sides: DecodeSides, simulated: Callable[[], None], version: str, source: dict[str, str], rows: list[Row]) -> None:
    shape = sides.shape
    calls, whole = SGLangDecode(shape, whole=False), SGLangDecode(shape, whole=True)
    for _ in range(args.cpu_warmup):
        simulated()
        calls.step()
        whole.step()
    steps = {**sides.steps, "boundary_simulated_streams": simulated, "sglang_cpu_path": calls.step, "sglang_alloc_for_decode": whole.step}
    timed = alternating(steps, args.cpu_steps, BLOCKS)
    expected = [shape.context + args.cpu_warmup + args.cpu_steps] * shape.batch
    if calls.lengths() != expected or whole.lengths() != expected:
        raise RuntimeError(f"SGLang's rows did not advance one token per step: {calls.lengths()[:4]}..., {whole.lengths()[:4]}... (want {expected[0]})")
    us = {name: statistics.median(side["block_means"]) * 1e6 for name, side in timed.items()}
    pairs = {
        name: statistics.median(b / o for b, o in zip(timed["boundary"]["block_means"], side["block_means"], strict=True))
        for name, side in timed.items()
        if name != "boundary"
    }
    detail = {
        **timing_detail(args, sides, timed),
        "blocks": len(timed["boundary"]["block_means"]),
        "median_block_us": us,
        "mean_us": {name: side["seconds"] * 1e6 for name, side in timed.items()},
        "median_blockwise_ratio": pairs,
        "sglang_version": version,
        "sglang_source": source,
        "sglang_triton": False,
    }
    b = shape.batch
    sglang = f"SGLang {version} CPU path: alloc_decode (naive torch, not Triton) + ReqToToken write"
    for what, side, baseline, name, target in (
        ("SGLang's CPU path", "boundary", "sglang_cpu_path", sglang, True),
        ("in-process", "boundary", "in_process", "in-process on pools", True),
        ("SGLang's alloc_for_decode", "boundary", "sglang_alloc_for_decode", f"SGLang {version} alloc_for_decode, whole function, CPU", False),
        ("SGLang's CPU path, boundary on simulated streams", "boundary_simulated_streams", "sglang_cpu_path", sglang, False),
    ):
        rows.append(
            Row(
                SECTION,
                f"CPU per decode step B={b} vs {what}",
                "us",
                us[side],
                us[baseline],
                name,
                target_on="ratio" if target else None,
                target_op="<=" if target else None,
                target_value=1.0 if target else None,
                detail=detail,
            )
        )
