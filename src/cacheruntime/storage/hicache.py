"""`HiCacheStore`: an SGLang `HiCacheStorage` backend (`HiCacheFile`, ...) serving as a `Store`.

SGLang's backends expose two page interfaces. The one every backend implements (its
abstract methods) is the one SGLang's cache controller drives for `HiCacheFile` and for a
"dynamic" backend without `interface_v1`, `_generic_page_get` / `_generic_page_set`:
`batch_get(keys, target_locations)` reads each page into a flat tensor the caller gives and
answers, per key, the page's tensor or None; `batch_set(keys, values)` writes flat tensors
and answers one bool for the whole batch; `exists(key)` answers one bool. This bridge makes
exactly those calls, with tensors that view the caller's buffers (no copy), and maps the
answers without adding a check SGLang lacks or dropping one it has:

| HiCacheStorage | outcome |
|---|---|
| `batch_get`: the target tensor for a key | HIT |
| `batch_get`: another tensor for a key | HIT after copying it into the target, as SGLang's controller copies it into the host pool; another size fails that copy, as it does SGLang's: FAILED `SizeMismatch` |
| `batch_get`: None for a key (or for the batch) | MISS: the ABC's meaning ("None if the key does not exist"); SGLang's interface cannot tell a failed read from a missing page, so neither can this |
| `batch_set`: True / False | every key STORED / every key FAILED `StoreError` (the answer does not say which keys were stored) |
| `exists(key)`: True / False | PRESENT / ABSENT |
| any call raising | FAILED for each key it answers for: `StoreIOError` for an `OSError`, else `StoreError` naming the exception |
| remove | FAILED `Unsupported`: `HiCacheStorage` has no per-key delete (only `clear()` of everything) |

The object sizes are the backend's business: `HiCacheFile` reads as many bytes as the
target holds, so an object larger than the target answers a hit of its first bytes, and
one shorter raises ("Short read") out of its `batch_get`, failing the whole batch. The
bridge reports that as it is (tests/sglang/test_hicache_bridge.py pins it).

The zero-copy interface (`batch_get_v1` / `batch_set_v1`, which SGLang uses for Mooncake,
3FS, NIXL, ...) addresses pages by index into a host pool the backend registered
(`register_mem_pool_host`), not by caller buffers; a backend that only serves that
interface is not served by this bridge.

Argument checks are the `Store`'s own (`InvalidStoreArgument` before any call reaches the
backend), as for every store. Needs torch (the [runtime] extra); SGLang itself is not
imported: any object with these methods serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from cacheruntime.storage.arguments import byte_views, check_keys, lendable
from cacheruntime.storage.errors import SizeMismatch, StoreError, StoreIOError, Unsupported
from cacheruntime.storage.results import KeyResult, Status, failed


class HiCacheBackend(Protocol):
    """The methods of SGLang's `HiCacheStorage` that the bridge calls (abstract in the ABC)."""

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> Any: ...

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool: ...

    def exists(self, key: str) -> bool: ...


class HiCacheStore:
    """An SGLang `HiCacheStorage` as a `Store`; see the module docstring for the mapping."""

    def __init__(self, backend: HiCacheBackend) -> None:
        self.backend = backend
        self.name = f"sglang:{type(backend).__name__}"

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        views = [lendable(view) for view in byte_views(checked, sources, writable=False)]
        try:
            stored = self.backend.batch_set(list(checked), [_tensor(view) for view in views])
        except Exception as error:
            return tuple(failed(key, _raised(error, "batch_set", key)) for key in checked)
        if stored:
            return tuple(KeyResult(key, Status.STORED, view.nbytes) for key, view in zip(checked, views))
        return tuple(
            failed(key, StoreError(f"{self.name}.batch_set answered False for a batch of {len(checked)}: it does not say which keys were stored"))
            for key in checked
        )

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        tensors = [_tensor(view) for view in byte_views(checked, targets, writable=True)]
        try:
            pages = self.backend.batch_get(list(checked), tensors)
        except Exception as error:
            return tuple(failed(key, _raised(error, "batch_get", key)) for key in checked)
        if pages is None:
            return tuple(KeyResult(key, Status.MISS) for key in checked)
        if not isinstance(pages, list | tuple) or len(pages) != len(checked):
            answer = StoreError(f"{self.name}.batch_get answered {type(pages).__name__} {pages!r:.60}, not one page or None per key")
            return tuple(failed(key, answer) for key in checked)
        return tuple(_got(key, target, page) for key, target, page in zip(checked, tensors, pages))

    def exists(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        return tuple(self._exists_one(key) for key in check_keys(keys))

    def remove(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        return tuple(failed(key, Unsupported(f"{self.name} cannot remove {key!r}: SGLang's HiCacheStorage has no per-key delete")) for key in check_keys(keys))

    def close(self) -> None:
        """Close the backend if it has a `close` (the ABC declares none; SGLang calls it where present)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def _exists_one(self, key: str) -> KeyResult:
        try:
            present = self.backend.exists(key)
        except Exception as error:
            return failed(key, _raised(error, "exists", key))
        return KeyResult(key, Status.PRESENT if present else Status.ABSENT)


def _tensor(view: memoryview) -> torch.Tensor:
    """A flat uint8 tensor over the view's bytes, sharing them (what SGLang's flat data pages are)."""
    return torch.frombuffer(view, dtype=torch.uint8)


def _got(key: str, target: torch.Tensor, page: torch.Tensor | None) -> KeyResult:
    if page is None:
        return KeyResult(key, Status.MISS)
    if page.data_ptr() != target.data_ptr() or page.nbytes != target.nbytes:
        flat = page.detach().reshape(-1).view(torch.uint8)
        if flat.numel() != target.numel():
            return failed(key, SizeMismatch(f"the backend answered {flat.numel()} bytes for {key!r}, the buffer has {target.numel()}"))
        target.copy_(flat)
    return KeyResult(key, Status.HIT, target.numel())


def _raised(error: Exception, call: str, key: str) -> StoreError:
    """The typed failure of a key whose backend call raised."""
    where = f"SGLang backend {call} for {key!r} raised {type(error).__name__}: {error}"
    return StoreIOError(where) if isinstance(error, OSError) else StoreError(where)
