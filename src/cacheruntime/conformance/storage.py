"""The store the `storage` check gives a runtime that claims L3: one it can slow down and make fail.

The suite, not the runtime, owns the L3 store of a storage case: the check calls the target's
factory with `l3=` a `SuiteStore`, a `FaultyStore` around a fresh backend of the kind the
target's `store` option names (`open_backend`). Owning it lets the check play the
environment's steps of the contract (spec/protocol.md §9) and mirror each on the model:

- an object removed behind the runtime's back (`FaultyStore.evict`; the model's
  `remove_object`), mirrored only when the store says it removed it (a Mooncake object read
  within its lease stays: the environment's step did not happen);
- a store write that fails (`fail_put`: the put of a key answers FAILED without reaching the
  backend; the model's transfer is doomed and fails with `TransferFailure.STORE`);
- a store read that fails (`fail_gets`: every get of a key answers FAILED without reaching the
  backend, until `heal`; the model's fetch of it is doomed and fails with `STORE`, and the batch
  reading it with `ComputeFailed`). It lasts until healed, not for one get, because a runtime's
  `probe()` reads its objects through the same store: which get came first, the probe's or the
  fetch's, is timing, and a one-shot failure would go to whichever it was;
- a store write held in flight (`FaultyStore.hold` of PUT, only on thread streams: a simulated
  stream runs the step on the caller's thread, which the gate would block), so other steps
  run while a persist's staging is still in use (S2).

A failure is keyed, not counted: the keys are the suite's, fresh for every persist, so the put
that fails is exactly the one of the persist the check armed it for, whatever else is queued.
Nothing here uses time to decide anything.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cacheruntime.storage import FaultyStore, FileStore, InjectedFault, KeyResult, Status, Store
from cacheruntime.storage.results import failed

#: One prefix per suite store: a Mooncake cluster outlives a case, and a key must name the same
#: bytes in every case that writes it (a store keeps the first object put under a key).
_STORES = itertools.count()


def open_backend(spec: str) -> tuple[Store, Path | None]:
    """The backend `spec` names, fresh, and the directory to delete with it: `file` (a `FileStore`
    in a new temporary directory) or `mooncake:MASTER_ADDRESS,METADATA_URL` (a `MooncakeStore` client)."""
    kind, _, where = spec.partition(":")
    if kind == "file" and not where:
        directory = Path(tempfile.mkdtemp(prefix="cacheruntime-l3-"))
        return FileStore(directory), directory
    if kind == "mooncake" and where.count(",") == 1:
        from cacheruntime.storage.mooncake import MooncakeConfig, MooncakeStore

        master, metadata = where.split(",")
        return MooncakeStore(MooncakeConfig(master_address=master, metadata_url=metadata)), None
    raise ValueError(f"the store option {spec!r} names no backend: give file, or mooncake:MASTER_ADDRESS,METADATA_URL")


class SuiteStore(FaultyStore):
    """A `FaultyStore` with failures by key, the keys it hands out, and its backend's directory."""

    def __init__(self, spec: str = "file") -> None:
        inner, self.directory = open_backend(spec)
        super().__init__(inner)
        self.prefix = f"s{os.getpid()}-{next(_STORES)}"
        self._keys = itertools.count()
        self._doomed: set[str] = set()
        self._unreadable: set[str] = set()

    def fresh_keys(self, count: int) -> tuple[str, ...]:
        """Keys no persist of this store (nor of any other suite store) used before."""
        return tuple(f"{self.prefix}-{next(self._keys)}" for _ in range(count))

    def fail_put(self, key: str) -> None:
        """The next put of `key` answers FAILED (`InjectedFault`) and writes nothing."""
        self._doomed.add(key)

    def fail_gets(self, key: str) -> None:
        """Every get of `key` answers FAILED (`InjectedFault`) and reads nothing, until `heal(key)`; the object stays."""
        self._unreadable.add(key)

    def heal(self, key: str) -> None:
        """Gets of `key` reach the backend again."""
        self._unreadable.discard(key)

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        doomed = {i for i, key in enumerate(keys) if key in self._doomed}
        self._doomed -= {keys[i] for i in doomed}
        return self._answer(keys, sources, doomed, super().put, "put")

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        return self._answer(keys, targets, {i for i, key in enumerate(keys) if key in self._unreadable}, super().get, "get")

    @staticmethod
    def _answer(keys: Sequence[str], buffers: Sequence[Any], doomed: set[int], call: Any, what: str) -> tuple[KeyResult, ...]:
        """`call` on the keys not `doomed` (positions), FAILED for the doomed ones, in the keys' order."""
        through = [i for i in range(len(keys)) if i not in doomed]
        passed = dict(zip(through, call([keys[i] for i in through], [buffers[i] for i in through]) if through else ()))
        return tuple(passed[i] if i in passed else failed(keys[i], InjectedFault(f"the {what} of {keys[i]!r} failed on purpose")) for i in range(len(keys)))

    def evicted(self, key: str) -> bool:
        """Remove the object under `key` behind the runtime's back; whether the store removed it."""
        (result,) = self.evict((key,))
        return result.status is Status.REMOVED

    def close(self) -> None:
        super().close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
