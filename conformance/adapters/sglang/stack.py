"""Build SGLang's real cache stack on CPU: request rows, paged KV allocator, device and
host KV pools, the HiCache controller (direct io backend) and a RadixCache.

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
    host_pool: object | None  # MHATokenToKVPoolHost (L2)
    controller: object | None  # HiCacheController
    tree: object  # RadixCache


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
) -> Stack:
    """A CPU stack sized like the protocol's RuntimeInfo (pages of `page_size` tokens)."""
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
    if l2_pages:
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
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator, page_size=page_size))
    return Stack(page_size, req_pool, kv, allocator, host, controller, tree)
