"""Build SGLang's real cache stack on CPU: request rows, paged KV allocator, device and
host KV pools, the HiCache controller (direct io backend) and the radix tree: the legacy
`RadixCache`, or 0.5.23's default `UnifiedRadixCache` with the Rust or the Python TreeCore
(`TREES`, selected by the adapter option `tree`).

Shared by the adapter (`adapter.py`) and the direct probes (`tests/sglang/`). Nothing
here changes SGLang's behaviour: it constructs the classes with the arguments SGLang's
own scheduler and tests use, on `device="cpu"`.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The adapter option `tree` -> the TreeCore backend UnifiedRadixCache is built with (None:
# the legacy RadixCache). 0.5.23's scheduler builds UnifiedRadixCache for a plain model
# (mem_cache/registry.py: default_radix_cache_factory -> create_unified_radix_cache) with the
# TreeCore SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND names (default "rust"; tree_core_registry.py).
TREES: dict[str, str | None] = {"radix": None, "unified-rust": "rust", "unified-python": "python"}
# The adapter option `write_policy` -> SGLang's `--hicache-write-policy` (the unified tree's
# HiCache: write-through backs an entry up at insert, write-back when eviction demotes it).
WRITE_POLICIES = ("write_through", "write_back")


def prepare_imports() -> None:
    """Put the torchvision import-only stub on sys.path and bind the CPU copy op."""
    stubs = str(HERE / "stubs")
    if stubs not in sys.path:
        sys.path.append(stubs)
    os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "0")
    from . import cpu_kernels

    cpu_kernels.install()


@dataclass
class Stack:
    """SGLang's objects, as a scheduler process holds them."""

    page_size: int
    req_to_token_pool: object  # ReqToTokenPool
    kv_pool: object  # MHATokenToKVPool (L1)
    allocator: object  # PagedTokenToKVPoolAllocator (or TokenToKVPoolAllocator at page_size 1)
    host_pool: object | None  # MHATokenToKVPoolHost (L2; the unified tree's: its HostPoolGroup)
    controller: object | None  # HiCacheController (the unified tree's: its HybridCacheController)
    tree: object  # RadixCache or UnifiedRadixCache
    tree_kind: str = "radix"  # a key of TREES
    write_policy: str = "write_through"

    @property
    def unified(self) -> bool:
        return TREES[self.tree_kind] is not None

    @property
    def tree_hicache(self) -> bool:
        """The host tier is the unified tree's own HiCache: the tree backs up, demotes and loads back."""
        return self.unified and self.controller is not None


def build_stack(
    *,
    page_size: int = 4,
    max_requests: int = 4,
    max_request_tokens: int = 64,
    l1_pages: int = 16,
    l2_pages: int = 32,
    layer_num: int = 1,
    head_dim: int = 2,
    paged: bool | None = None,
    tree: str = "radix",
    write_policy: str = "write_through",
) -> Stack:
    """A CPU stack sized like the protocol's RuntimeInfo (pages of `page_size` tokens).

    `tree` (a key of `TREES`): on "unified-*" with `l2_pages` the host tier is the tree's own
    HiCache, attached as the scheduler attaches it (`hicache_unified`), with `write_policy`.
    """
    if tree not in TREES:
        raise ValueError(f"tree={tree!r}: one of {sorted(TREES)}")
    if write_policy not in WRITE_POLICIES:
        raise ValueError(f"write_policy={write_policy!r}: one of {list(WRITE_POLICIES)}")
    if TREES[tree] is None and write_policy != "write_through":
        raise ValueError(f"write_policy={write_policy!r} needs a unified tree: 0.5.23's HiCacheController reads it only on the CUDA kernel path (notes.md)")
    prepare_imports()
    import torch

    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.radix_cache import RadixCache

    tokens = l1_pages * page_size
    req_pool = ReqToTokenPool(size=max_requests, max_context_len=max_request_tokens, device="cpu", enable_memory_saver=False)
    kv = MHATokenToKVPool(tokens, page_size, torch.float32, 1, head_dim, layer_num, "cpu", False, start_layer=0, end_layer=layer_num)
    if paged is None:
        paged = page_size > 1
    if paged:
        allocator = PagedTokenToKVPoolAllocator(tokens, page_size, torch.float32, "cpu", kv, need_sort=False)
    else:
        allocator = TokenToKVPoolAllocator(tokens, torch.float32, "cpu", kv, need_sort=False)
    host = controller = None
    if l2_pages and TREES[tree] is None:
        host = MHATokenToKVPoolHost(
            kv.get_device_pool_infos()[0].buffer_info,
            2.0,
            0,
            page_size,
            "layer_first",
            pin_memory=False,
            device="cpu",
            device_capacity_tokens=kv.size,
            start_layer=kv.start_layer,
            end_layer=kv.end_layer,
            write_back_staging=kv.hicache_write_back_staging,
            host_token_capacity=l2_pages * page_size,
        )
        controller = HiCacheController(
            allocator,
            host,
            page_size,
            tp_group=None,
            load_cache_event=threading.Event(),
            io_backend="direct",
            write_policy="write_through",
        )
    params = CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator, page_size=page_size)
    backend = TREES[tree]
    if backend is None:
        return Stack(page_size, req_pool, kv, allocator, host, controller, RadixCache(params), tree)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    # As create_unified_radix_cache sets them for a model with neither SWA nor Mamba layers;
    # the backend through CacheInitParams.tree_core_backend (the per-cache override of the
    # environment variable), resolved by SGLang's own fallback policy.
    params.tree_components = (ComponentType.FULL,)
    params.tree_core_backend = backend
    unified = UnifiedRadixCache(params)
    chosen = getattr(unified, "_tree_core_backend", None)
    if chosen != backend:  # SGLang fell back (tree_core_registry._rust_fallback_reason): not the tree asked for
        raise RuntimeError(f"tree={tree!r}: SGLang built the {chosen!r} TreeCore instead (see its log line 'Using the Python TreeCore: ...')")
    if l2_pages:
        host, controller = hicache_unified(unified, params, l1_pages=l1_pages, l2_pages=l2_pages, write_policy=write_policy)
    return Stack(page_size, req_pool, kv, allocator, host, controller, unified, tree, write_policy)


def hicache_unified(tree, params, *, l1_pages: int, l2_pages: int, write_policy: str) -> tuple[object, object]:
    """Attach HiCache to a UnifiedRadixCache as 0.5.23's scheduler does; the host pool group and the controller.

    `create_unified_radix_cache` (mem_cache/registry.py:191-199) calls
    `cache.init_hicache(server_args, params)` when `--enable-hierarchical-cache` is set; that
    reads the server's published config (`get_memory()`: host memory mode, write policy, io
    backend, layout, ratio) and builds `HostPoolGroup` + `HybridCacheController` through
    `attach_hybrid_pool_to_unified_cache` (`_PlainKvStrategy`, `build_kv_only_stack`). Here the
    config is published with SGLang's own test hook (`RuntimeContext.override_server_args`,
    a resolved `ServerArgs(model_path="dummy")` with these fields), for one rank on CPU:
    `enable_hierarchical_cache`, `hicache_io_backend="direct"` (the `kernel` backend is
    CUDA-only), `hicache_mem_layout="layer_first"`, `hicache_host_memory_mode="cache"`
    (SGLang's default) and `hicache_write_policy`. The host pool is sized by `hicache_ratio`
    (pool_host/base.py:220-226: `int(device_tokens * ratio)` tokens, then one page more),
    chosen so it holds exactly `l2_pages` pages. Differences from the GPU scheduler (notes.md):
    no `tp_worker` to register the layer-transfer counter with (registry.py:197-199), the
    host buffer unpinned (cpu_kernels.py), and `load_back_threshold` 1 token instead of
    init_hicache's 10 (a protocol Restore is an explicit load; the scheduler's threshold
    decides between loading and recomputing a short prefix, which no protocol call asks).
    """
    from sglang.srt.runtime_context import get_context

    ratio = (l2_pages - 1) / l1_pages
    server_args = (
        get_context()
        .override_server_args(
            enable_hierarchical_cache=True,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_host_memory_mode="cache",
            hicache_write_policy=write_policy,
            hicache_ratio=ratio,
        )
        .install()
    )  # the process's published config from here on, as a scheduler process has one
    tree.init_hicache(server_args, params)
    tree.load_back_threshold = 1
    controller = tree.cache_controller
    group = controller.mem_pool_host
    pages = group.anchor_entry.host_pool.page_num
    if pages != l2_pages:
        raise RuntimeError(f"l2_pages={l2_pages}: SGLang sized the host pool at {pages} pages (hicache_ratio {ratio})")
    return group, controller
