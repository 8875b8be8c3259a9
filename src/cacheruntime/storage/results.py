"""Per-key outcomes of a store operation.

Every batched operation answers one `KeyResult` per key, in the keys' order. A miss is an
outcome (`MISS`, `ABSENT`), not an error: the L3 tier is a cache that several runtimes
share and that evicts, so a key that existed a moment ago may be gone, and control falls
back to recompute. A failure is `FAILED` with the `StoreError` that says what failed.
`LEASED` is Mooncake's `OBJECT_HAS_LEASE` on remove: the object is still there, protected
by a read lease for a while, and a later remove succeeds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from cacheruntime.storage.errors import StoreError


class Op(enum.Enum):
    """The four store operations."""

    PUT = "put"
    GET = "get"
    EXISTS = "exists"
    REMOVE = "remove"


class Status(enum.Enum):
    """What happened to one key; which statuses an operation can answer is listed in `ALLOWED`."""

    STORED = "stored"  # put: the object is in the store (written now, or already there)
    HIT = "hit"  # get: the object's bytes are in the caller's buffer
    MISS = "miss"  # get: no such object (never stored, removed or evicted)
    PRESENT = "present"  # exists: a hint; the object may be gone by the time it is fetched
    ABSENT = "absent"  # exists / remove: no such object
    REMOVED = "removed"  # remove: the object was removed
    LEASED = "leased"  # remove: the object is read-leased (Mooncake) and stays for now
    FAILED = "failed"  # any: the store failed; `error` says how


#: the statuses each operation may answer (the stores and the worker's tests hold them to it)
ALLOWED = {
    Op.PUT: frozenset({Status.STORED, Status.FAILED}),
    Op.GET: frozenset({Status.HIT, Status.MISS, Status.FAILED}),
    Op.EXISTS: frozenset({Status.PRESENT, Status.ABSENT, Status.FAILED}),
    Op.REMOVE: frozenset({Status.REMOVED, Status.ABSENT, Status.LEASED, Status.FAILED}),
}


@attrs.frozen
class KeyResult:
    """One key's outcome: `nbytes` is the bytes moved for it (put, get), `error` set only when FAILED."""

    key: str
    status: Status
    nbytes: int = 0
    error: StoreError | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if (self.status is Status.FAILED) != (self.error is not None):
            raise ValueError(f"KeyResult {self.key!r}: an error goes with FAILED and only with it (status {self.status.name})")


def failed(key: str, error: StoreError) -> KeyResult:
    """The outcome of a key whose operation failed with `error`."""
    return KeyResult(key, Status.FAILED, error=error)


def leading_hits(results: Iterable[KeyResult]) -> int:
    """How many results from the first are PRESENT or HIT: the pages of a prefix the store can serve.

    SGLang's `batch_exists` answers the same count; a prefix is only useful up to its first gap.
    """
    count = 0
    for result in results:
        if result.status not in (Status.PRESENT, Status.HIT):
            break
        count += 1
    return count
