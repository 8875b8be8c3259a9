"""A CPU stand-in for the one sgl_kernel copy op that SGLang's `direct` io backend calls.

SGLang 0.5.23 binds `transfer_kv_direct` in `sglang/srt/mem_cache/pool_host/mha.py` only
on CUDA/HIP (from `sgl_kernel.kvcacheio`) or XPU; on a CPU machine the name is never
bound, so `HiCacheController.write()` with `io_backend="direct"` dies with
`NameError: name 'transfer_kv_direct' is not defined` (see docs/sglang-report.md, S0).
`install()` binds a plain torch gather/scatter with the same signature and meaning
(per layer: `dst[dst_indices] = src[src_indices]`, token indices), and nothing else:
the controller, host pool, allocator and transfer engine are SGLang's own.
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


def install() -> bool:
    """Bind the stand-in where SGLang's host pool looks it up; True if it was missing."""
    from sglang.srt.mem_cache.pool_host import mha

    if getattr(mha, "transfer_kv_direct", None) is not None:
        return False
    mha.transfer_kv_direct = transfer_kv_direct
    return True
