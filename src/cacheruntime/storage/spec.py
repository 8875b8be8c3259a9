"""Store specs: the one-string name of a store a runtime or a CLI is given (`file:DIR`)."""

from __future__ import annotations

from pathlib import Path

from cacheruntime.storage.filestore import FileStore
from cacheruntime.storage.store import Store


def open_store(spec: str) -> Store:
    """The store `spec` names: `file:DIR`, a `FileStore` in DIR; a one-line
    `ValueError` for anything else."""
    kind, _, where = spec.partition(":")
    if kind != "file" or not where:
        raise ValueError(f"the L3 store {spec!r} is not one this names: give file:DIR (a FileStore in DIR)")
    return FileStore(Path(where))
