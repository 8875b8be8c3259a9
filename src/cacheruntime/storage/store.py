"""The `Store` interface: batched put, get, exists and remove of page objects by content key.

The shape follows SGLang's `HiCacheStorage` (batched calls over page keys, per-key
answers, existence as a hint) with two changes that the runtime's ownership rules need:
data moves between the store and buffers the caller owns (the runtime's pinned staging
pages), so the store never allocates a page; and every key gets a typed `KeyResult`
instead of a bool, so a miss, a read lease and a failure are told apart.

A store call blocks on I/O. The GPU loop never calls one directly: it submits to a
`StorageWorker`, which runs them on its own threads.

The buffers belong to the caller for the whole call: a get writes a page only through its
buffer, a put reads it only from its buffer, and neither keeps a reference afterwards. A
get that fails or misses leaves the buffer's bytes unspecified (the caller does not mark
the page valid). Objects are immutable by key: a put of a key that is already stored
answers STORED without rewriting it, since the same content key names the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from cacheruntime.storage.results import KeyResult


@runtime_checkable
class Store(Protocol):
    """A page-object store; every method answers one `KeyResult` per key, in order."""

    #: the backend's name in messages and reports ("file", "mooncake", ...)
    name: str

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        """Store each source buffer's bytes under its key: STORED or FAILED."""
        ...

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        """Read each object into its writable target, which must be the object's size: HIT, MISS or FAILED."""
        ...

    def exists(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        """Whether each object is there now, a hint: PRESENT, ABSENT or FAILED."""
        ...

    def remove(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        """Remove each object: REMOVED, ABSENT, LEASED (still read-protected; retry later) or FAILED."""
        ...

    def close(self) -> None:
        """Release the store's connections; the objects stay (they belong to the store)."""
        ...
