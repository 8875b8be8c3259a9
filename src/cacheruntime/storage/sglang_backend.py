"""`CacheRuntimeStorage`: this runtime's L3 `Store` as an SGLang `HiCacheStorage` backend.

SGLang loads an out-of-tree backend by module and class name through the "dynamic" backend
of `StorageBackendFactory`, which constructs it as `class(storage_config, kwargs)`:

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{"backend_name":
      "cacheruntime", "module_path": "cacheruntime.storage.sglang_backend",
      "class_name": "CacheRuntimeStorage", "store": "file:/var/cache/l3"}'

`store` names the store: `file:DIR` is a `FileStore` in DIR. The class implements the
methods SGLang's cache controller calls on a dynamic backend without `interface_v1`
(`_generic_page_get` / `_generic_page_set` and the prefix query), each a translation onto
one batched `Store` call:

| HiCacheStorage | Store |
|---|---|
| `batch_get(keys, target_locations)`, `get` | `get` into the flat target tensors; HIT answers the target, MISS or FAILED None (SGLang's only other answer; a FAILED is logged with its error) |
| `batch_set(keys, values)`, `set` | `put` of the flat value tensors; True when every key is STORED |
| `exists(key)` | `exists`: PRESENT |
| `batch_exists(keys)` | `exists`, then `leading_hits`: the pages of the prefix the store holds |
| `close()` | `close` |

Not served: the zero-copy `batch_get_v1` / `batch_set_v1` (a constructor with
`interface_v1` set refuses) and the v2 pool transfers (`batch_*_v2`, the ABC's
NotImplementedError stays); `clear()` stays the ABC's no-op, since a `Store` removes only
keys it is given.

Keys are SGLang's page hashes with the suffix `HiCacheFile` gives them, so tensor-parallel
ranks that share a store keep their shards apart: `_{model}_{tp_rank}_{tp_size}`, or
`_{model}` for an MLA model, whose KV every rank holds whole; `_{pp_size}_{pp_rank}` after it
under pipeline parallelism. Context-parallel and decode-context-parallel shards are
refused at construction: HiCacheFile suffixes those too and this class does not.

Importing this module needs SGLang (the `.venv-sglang` environment) and torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from cacheruntime.storage.arguments import check_keys
from cacheruntime.storage.filestore import FileStore
from cacheruntime.storage.results import KeyResult, Status, leading_hits
from cacheruntime.storage.store import Store

logger = logging.getLogger(__name__)


class CacheRuntimeStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang is untyped outside its venv
    """A cacheruntime `Store` as an SGLang HiCache storage backend; see the module docstring."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        extra = storage_config.extra_config or {}
        if extra.get("interface_v1"):
            raise ValueError("CacheRuntimeStorage serves SGLang's generic page path, not the zero-copy v1 one: leave interface_v1 unset")
        if storage_config.attn_cp_size > 1 or storage_config.dcp_size > 1:
            raise ValueError("CacheRuntimeStorage does not key context-parallel shards apart: run it with attn_cp_size and dcp_size 1")
        self.store: Store = open_store(extra.get("store"))
        model = "-".join(storage_config.model_name.split("/")) if storage_config.model_name else ""
        pipeline = f"_{storage_config.pp_size}_{storage_config.pp_rank}" if storage_config.pp_size > 1 else ""
        rank = "" if storage_config.is_mla_model else f"_{storage_config.tp_rank}_{storage_config.tp_size}"
        self.suffix = f"_{model}{rank}{pipeline}"
        check_keys(["0" + self.suffix])  # a model name no key can carry fails here, not on every call

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[torch.Tensor | None]:
        results = self.store.get(self._keys(keys), [_flat_bytes(target) for target in target_locations])
        return [target if self._reports(result, "get") is Status.HIT else None for target, result in zip(target_locations, results)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        results = self.store.put(self._keys(keys), [_flat_bytes(value.contiguous()) for value in values])
        return all(self._reports(result, "put") is Status.STORED for result in results)

    def exists(self, key: str) -> bool:
        return self.store.exists(self._keys([key]))[0].status is Status.PRESENT

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        return leading_hits(self.store.exists(self._keys(keys)))

    def close(self) -> None:
        self.store.close()

    def _keys(self, keys: list[str]) -> list[str]:
        return [key + self.suffix for key in keys]

    def _reports(self, result: KeyResult, op: str) -> Status:
        """The result's status, after logging a failure (SGLang's answers cannot carry it)."""
        if result.error is not None:
            logger.warning("cacheruntime store %s of %s failed: %s", op, result.key, result.error)
        return result.status


def open_store(spec: object) -> Store:
    """The store `spec` names (`file:DIR`); a one-line `ValueError` for anything else."""
    kind, _, where = str(spec).partition(":")
    if kind != "file" or not where:
        raise ValueError(f"extra_config 'store' is {spec!r}: give file:DIR (a FileStore in DIR)")
    return FileStore(Path(where))


def _flat_bytes(tensor: torch.Tensor) -> Any:
    """The tensor's bytes as a numpy array sharing them; a non-contiguous tensor raises (a page is one run of bytes)."""
    return tensor.detach().view(-1).view(torch.uint8).numpy()
