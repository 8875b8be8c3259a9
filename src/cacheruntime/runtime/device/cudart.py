"""The CUDA runtime's 2D copy (`cudaMemcpy2DAsync`), called through ctypes.

A page of L1 is `2 * layers` rows far apart (one per layer's K and V), a page of L2 one
contiguous block. `torch.Tensor.copy_` between host and device does not issue a 2D copy for
the strided side: it copies through a contiguous device temporary and a copy kernel
(ATen's `copy_requires_temporaries`). `cudaMemcpy2DAsync` moves the page in one DMA on the
copy engines, with no staging and no kernel, so a restore and a backup of short runs
overlap each other and leave the SMs to compute (measured on an H200,
`benchmarks/diagnostics/copypaths.py`: 0.92-0.93 of a pinned copy at page size 16, one page
per run, in both directions at once 0.87-0.93 where the UVA gather kernel got 0.53).

The library is the `libcudart` torch has loaded (found in the process's mappings), so the
copies go through the same runtime, context and streams as torch's own work; where none is
found (or the call is missing) `load` returns None and the caller keeps its other paths.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind
_MAX_PITCH = 11  # cudaDevAttrMaxPitch


class Cudart:
    """`cudaMemcpy2DAsync` of one loaded libcudart, and the device's largest pitch."""

    def __init__(self, lib: Any, device_index: int):
        copy = lib.cudaMemcpy2DAsync
        size = ctypes.c_size_t
        copy.argtypes = [ctypes.c_void_p, size, ctypes.c_void_p, size, size, size, ctypes.c_int, ctypes.c_void_p]
        copy.restype = ctypes.c_int
        self._copy = copy
        self._lib = lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        value = ctypes.c_int(0)
        if lib.cudaDeviceGetAttribute(ctypes.byref(value), _MAX_PITCH, device_index) != 0:
            lib.cudaGetLastError()
            raise OSError("cudaDeviceGetAttribute(cudaDevAttrMaxPitch) failed")
        #: The largest pitch a 2D copy accepts on this device (bytes).
        self.max_pitch = value.value

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, to_device: bool, stream: int) -> None:
        """`height` rows of `width` bytes from `src` to `dst` (each side with its pitch) on `stream`, asynchronously.

        A refused copy raises here; its error is cleared first, so that torch's next launch
        check does not report it as its own.
        """
        err = self._copy(dst, dst_pitch, src, src_pitch, width, height, _HOST_TO_DEVICE if to_device else _DEVICE_TO_HOST, stream)
        if err:
            self._lib.cudaGetLastError()
            raise RuntimeError(f"cudaMemcpy2DAsync failed: {self._lib.cudaGetErrorString(err).decode()} ({err})")


@functools.cache
def load(device_index: int) -> Cudart | None:
    """The 2D copy of the libcudart this process uses (CUDA initialized), or None where it is not reachable.

    Looked up once per device: every KVMemory of the process shares it.
    """
    for path in _candidates():
        try:
            return Cudart(ctypes.CDLL(path), device_index)
        except (OSError, AttributeError):
            continue
    return None


def _candidates() -> list[str]:
    """The libcudart torch loaded first (its path in the process's mappings), then the usual names."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "libcudart.so" in path and path not in found:
                    found.append(path)
    except OSError:
        pass
    by_name = ctypes.util.find_library("cudart")
    return found + ([by_name] if by_name else []) + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
