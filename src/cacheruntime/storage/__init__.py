"""The storage side: the L3 tier's `Store` interface, its backends and the worker that runs them.

Control names pages by content keys; the GPU runtime owns the pinned staging pages; this
package owns the store I/O and runs it off the GPU loop (`StorageWorker`). Backends:
`FileStore` (a directory, the embedded default), `MooncakeStore` (`cacheruntime.storage.mooncake`,
extra `[mooncake]`), `FaultyStore` (a wrapper the tests slow down and make fail).
See docs/storage.md.
"""

from cacheruntime.storage.errors import (
    InjectedFault,
    InvalidStoreArgument,
    LeaseExpired,
    ObjectNotReady,
    SizeMismatch,
    StoreError,
    StoreFull,
    StoreIOError,
    StoreUnavailable,
    Unsupported,
)
from cacheruntime.storage.faulty import FaultyStore
from cacheruntime.storage.filestore import FileStore
from cacheruntime.storage.results import ALLOWED, KeyResult, Op, Status, leading_hits
from cacheruntime.storage.store import Store
from cacheruntime.storage.worker import RequestId, StorageWorker, StoreCompletion

__all__ = [
    "ALLOWED",
    "FaultyStore",
    "FileStore",
    "InjectedFault",
    "InvalidStoreArgument",
    "KeyResult",
    "LeaseExpired",
    "ObjectNotReady",
    "Op",
    "RequestId",
    "SizeMismatch",
    "Status",
    "StorageWorker",
    "Store",
    "StoreCompletion",
    "StoreError",
    "StoreFull",
    "StoreIOError",
    "StoreUnavailable",
    "Unsupported",
    "leading_hits",
]
