"""CPU stand-ins for the two CUDA-only steps of SGLang's HiCache on CPU: the one sgl_kernel
copy op the `direct` io backend calls, and the host buffer's CUDA registration.

SGLang 0.5.23 binds `transfer_kv_direct` in `sglang/srt/mem_cache/pool_host/mha.py` only
on CUDA/HIP (from `sgl_kernel.kvcacheio`) or XPU; on a CPU machine the name is never
bound, so `HiCacheController.write()` with `io_backend="direct"` dies with
`NameError: name 'transfer_kv_direct' is not defined` (see docs/sglang-report.md, S0).
`install()` binds a plain torch gather/scatter with the same signature and meaning
(per layer: `dst[dst_indices] = src[src_indices]`, token indices), and nothing else:
the controller, host pool, allocator and transfer engine are SGLang's own.

`install()` also makes the host buffer of a pool on the CPU unpinned: 0.5.23's HiCache
assembler (`hybrid_cache/hybrid_pool_assembler.py:224-233`, `build_kv_host_pool`, the path
`UnifiedRadixCache.init_hicache` takes) builds `MHATokenToKVPoolHost` without a
`pin_memory` argument, whose default is True (`pool_host/mha.py:143`), and the allocation
function for a `cpu` transfer device (`pool_host/common.py:453-460`, the default
`alloc_with_host_register`) then registers the buffer with CUDA (`:348-349` ->
`_cuda_host_register`, `:147` `torch.cuda.cudart()`), which raises "Torch not compiled with
CUDA enabled" on a CPU torch. The stand-in is SGLang's own `alloc_with_host_register` with
`pin_memory=False`: the same buffer, not page-locked (pinning only speeds a GPU's DMA).
"""

from __future__ import annotations

import torch


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """Copy the rows `src_indices` of every source layer into rows `dst_indices` of its peer."""
    del page_size  # the CUDA op copies page runs; row by row gives the same bytes
    src_indices = src_indices.to(torch.int64).cpu()
    dst_indices = dst_indices.to(torch.int64).cpu()
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices] = src[src_indices].to(dst.device)


def alloc_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    """SGLang's `alloc_with_host_register` for a CPU host buffer, without the CUDA registration."""
    from sglang.srt.mem_cache.pool_host import common

    del pin_memory  # page-locking needs CUDA; a CPU torch has none
    return common.alloc_with_host_register(dims, dtype, device, False, allocator, registration_granularity_bytes)


def install() -> bool:
    """Bind the stand-ins where SGLang's host pool looks them up; True if the copy op was missing."""
    from sglang.srt.mem_cache.pool_host import common, mha

    if not torch.cuda.is_available():
        common.ALLOC_MEMORY_FUNCS["cpu"] = alloc_unpinned
    if getattr(mha, "transfer_kv_direct", None) is not None:
        return False
    mha.transfer_kv_direct = transfer_kv_direct
    return True
