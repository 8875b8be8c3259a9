"""What can go wrong in the storage side, as types.

Two kinds, kept apart because the caller handles them differently:

- `InvalidStoreArgument` (a `ValueError`): the caller passed something no store can act on
  (a malformed key, a buffer of the wrong kind, lists of different lengths). It is raised
  on the caller's thread before any I/O, so nothing changed; the message says what to fix.
- `StoreError` and its subclasses: the store could not do what was asked for one key
  (the disk said no, the Mooncake master is gone, the object is not the size of the
  buffer). These are never raised by a batched operation: they travel as the `error` of a
  failed `KeyResult`, so one bad key does not lose the other keys' outcomes, and control
  can fall back to recompute for exactly the pages that failed.
"""

from __future__ import annotations


class InvalidStoreArgument(ValueError):
    """A store call's arguments are malformed; raised before any I/O, nothing changed."""


class StoreError(Exception):
    """A store operation failed for one key; carried in a `KeyResult`, never raised by a batch."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (Mooncake master down, RPC failure); retry later or recompute."""


class StoreIOError(StoreError):
    """The backend's I/O failed (an `OSError` of the file store: disk full, permissions)."""


class StoreFull(StoreError):
    """The store has no room for the object (Mooncake: no segment space left)."""


class SizeMismatch(StoreError):
    """The stored object is not the size of the caller's buffer (a page of another layout)."""


class LeaseExpired(StoreError):
    """Mooncake: the read lease ran out before the data arrived; the bytes read are discarded."""


class ObjectNotReady(StoreError):
    """Mooncake: the object exists but its write has not completed (another client is writing it)."""


class Unsupported(StoreError):
    """The backend has no such operation (an SGLang storage backend without remove)."""


class InjectedFault(StoreError):
    """A failure the test store (`FaultyStore`) was told to inject."""
