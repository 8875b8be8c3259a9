"""`MooncakeStore`: the `Store` interface over Mooncake Store (`mooncake.store.MooncakeDistributedStore`).

Mooncake keeps objects in memory segments that its clients mount, placed by a master
(`mooncake_master`). A runtime's client mounts none (`global_segment_bytes=0`): the objects
then live in a separate segment holder (`mooncake_client`, started with the master by
`cacheruntime.storage.master.LocalMooncake`), so they outlive the runtime, as an L3 must. A
client that mounts a segment loses what was placed there when it closes.

Data moves with `batch_put_from` / `batch_get_into` between the store and the caller's
buffers by address, without a copy on this side (over TCP Mooncake copies through its
transfer engine; registering buffers is an RDMA optimization that TCP does not need). A
read-only source (`bytes`) has no address to lend, so its put copies it once.

Mooncake's answers map to outcomes as follows, without hiding any:

| Mooncake | outcome |
|---|---|
| get: the object's size | HIT |
| get: `OBJECT_NOT_FOUND` (-704) | MISS |
| get: another size, or `INVALID_PARAMS` (-600: the buffer is smaller than the object) | FAILED `SizeMismatch` |
| get: `LEASE_EXPIRED` (-707) | FAILED `LeaseExpired` (the read outlived its lease; the bytes are void) |
| get: `REPLICA_IS_NOT_READY` (-703) | FAILED `ObjectNotReady` (a write in flight) |
| put: 0 (also for a key already stored) | STORED |
| put: `NO_AVAILABLE_HANDLE` (-200) | FAILED `StoreFull` |
| exists: 1 / 0 | PRESENT / ABSENT (a hint: a lease-free object may be evicted after) |
| remove: 0 / `OBJECT_NOT_FOUND` | REMOVED / ABSENT |
| remove: `OBJECT_HAS_LEASE` (-706) | LEASED: a get (or exists) granted a read lease of the master's `default_kv_lease_ttl`; the object stays until it runs out |
| `RPC_FAIL` (-900) and other RPC errors | FAILED `StoreUnavailable` (the master is unreachable) |
| any other negative code | FAILED `StoreError` naming the code |

A dead master. The first call after the master died answers `RPC_FAIL` at once, but every
later one blocks about 4.5 s inside Mooncake's client, reconnecting (measured with the 0.3.13
wheel), and the runtime asks the store on every admission (`l3_exists`) and every persist: a
job would crawl. So once a call met `StoreUnavailable`, each later call first checks that the
master's port accepts a connection (milliseconds on a refused port) and, while it does not,
answers every key FAILED `StoreUnavailable` without entering Mooncake; once it does, calls go
through again. The decision is the port's answer, never a timer.
"""

from __future__ import annotations

import ctypes
import importlib
import socket
from collections.abc import Sequence
from typing import Any

import attrs

from cacheruntime.storage.arguments import byte_views, check_keys, lendable
from cacheruntime.storage.errors import LeaseExpired, ObjectNotReady, SizeMismatch, StoreError, StoreFull, StoreUnavailable
from cacheruntime.storage.results import KeyResult, Status, failed

#: Mooncake's ErrorCode values that this adapter tells apart (mooncake-store/include/types.h)
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
LEASE_EXPIRED = -707
OBJECT_REPLICA_BUSY = -714
RPC_FAIL = -900
RPC_TIMEOUT = -901

#: how long the reachability probe of the master waits for a connection
REACH_SECONDS = 2.0


@attrs.frozen
class MooncakeConfig:
    """Where a Mooncake client finds its cluster, and what it contributes to it."""

    #: the master's RPC address, host:port
    master_address: str
    #: the metadata server's URL (the master's embedded HTTP one: http://host:port/metadata)
    metadata_url: str
    #: the address this client's transfer engine listens on
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    #: memory this client mounts into the store; 0: a pure client, its objects outlive it
    global_segment_bytes: int = 0
    #: the client's own transfer buffer
    local_buffer_bytes: int = 16 << 20


class MooncakeStore:
    """A Mooncake Store client as a `Store`; see the module docstring for the outcome mapping."""

    name = "mooncake"

    def __init__(self, config: MooncakeConfig) -> None:
        try:
            store_module = importlib.import_module("mooncake.store")
        except ImportError as error:
            raise ImportError(f"the mooncake store needs the [mooncake] extra: pip install 'cacheruntime[mooncake]' ({error})") from error
        self.config = config
        _check_reachable(config.master_address)
        self._client = store_module.MooncakeDistributedStore()
        code = self._client.setup(
            config.local_hostname,
            config.metadata_url,
            config.global_segment_bytes,
            config.local_buffer_bytes,
            config.protocol,
            "",
            config.master_address,
        )
        if code != 0:
            raise StoreUnavailable(
                f"Mooncake setup against master {config.master_address} (metadata {config.metadata_url}) failed with code {code}: "
                "is mooncake_master running there with its HTTP metadata server? (cacheruntime.storage.master starts one)"
            )
        #: a call met StoreUnavailable: probe the master before the next one (the module docstring, a dead master)
        self._master_lost = False

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        views = [lendable(view) for view in byte_views(checked, sources, writable=False)]
        if not checked:
            return ()
        if (down := self._unreachable(checked, "put")) is not None:
            return down
        codes = self._client.batch_put_from(list(checked), [_address(view) for view in views], [view.nbytes for view in views])
        return self._noted(
            tuple(
                KeyResult(key, Status.STORED, view.nbytes) if code == 0 else failed(key, _error(code, "put", key))
                for key, view, code in zip(checked, views, codes)
            )
        )

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        views = byte_views(checked, targets, writable=True)
        if not checked:
            return ()
        if (down := self._unreachable(checked, "get")) is not None:
            return down
        codes = self._client.batch_get_into(list(checked), [_address(view) for view in views], [view.nbytes for view in views])
        return self._noted(tuple(_got(key, view.nbytes, code) for key, view, code in zip(checked, views, codes)))

    def exists(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        if not checked:
            return ()
        if (down := self._unreachable(checked, "exists")) is not None:
            return down
        codes = self._client.batch_is_exist(list(checked))
        return self._noted(
            tuple(
                KeyResult(key, Status.PRESENT) if code == 1 else KeyResult(key, Status.ABSENT) if code == 0 else failed(key, _error(code, "exists", key))
                for key, code in zip(checked, codes)
            )
        )

    def remove(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        if not checked:
            return ()
        if (down := self._unreachable(checked, "remove")) is not None:
            return down
        codes = self._client.batch_remove(list(checked))
        return self._noted(tuple(_removed(key, code) for key, code in zip(checked, codes)))

    def _unreachable(self, keys: tuple[str, ...], op: str) -> tuple[KeyResult, ...] | None:
        """After a call met a lost master: every key FAILED `StoreUnavailable` while its port refuses
        connections (the call would block in Mooncake's reconnect); None when the call may go through."""
        if not self._master_lost:
            return None
        try:
            _check_reachable(self.config.master_address)
        except StoreUnavailable as error:
            return tuple(failed(key, StoreUnavailable(f"Mooncake {op} of {key!r}: {error}")) for key in keys)
        self._master_lost = False
        return None

    def _noted(self, results: tuple[KeyResult, ...]) -> tuple[KeyResult, ...]:
        """`results`, having noted whether one says the master is lost (then the next call probes it first)."""
        self._master_lost = any(isinstance(result.error, StoreUnavailable) for result in results)
        return results

    def close(self) -> None:
        """Close the client (it unmounts its segment, if it mounted one, and leaves the cluster)."""
        self._client.close()


def _check_reachable(address: str) -> None:
    """`StoreUnavailable` at once if nothing listens at the master's address.

    Mooncake's own setup retries an absent master for about 90 seconds before it fails
    (measured with the 0.3.13 wheel); a closed port is answered here in milliseconds.
    """
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=REACH_SECONDS).close()
    except (OSError, ValueError) as error:
        raise StoreUnavailable(
            f"no Mooncake master answers at {address} ({error}): is mooncake_master running there? (cacheruntime.storage.master starts one)"
        ) from None


def _address(view: memoryview) -> int:
    """The address of a writable contiguous byte view (ctypes keeps the view alive while used)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _got(key: str, size: int, code: int) -> KeyResult:
    if code == size:
        return KeyResult(key, Status.HIT, size)
    if code == OBJECT_NOT_FOUND:
        return KeyResult(key, Status.MISS)
    if code >= 0:
        return failed(key, SizeMismatch(f"Mooncake object {key!r} has {code} bytes, the buffer {size}"))
    if code == INVALID_PARAMS:
        return failed(key, SizeMismatch(f"Mooncake refused the get of {key!r} into {size} bytes (INVALID_PARAMS: the object is larger)"))
    return failed(key, _error(code, "get", key))


def _removed(key: str, code: int) -> KeyResult:
    if code == 0:
        return KeyResult(key, Status.REMOVED)
    if code == OBJECT_NOT_FOUND:
        return KeyResult(key, Status.ABSENT)
    if code == OBJECT_HAS_LEASE:
        return KeyResult(key, Status.LEASED)
    return failed(key, _error(code, "remove", key))


def _error(code: int, op: str, key: str) -> StoreError:
    """The typed error for a negative Mooncake code."""
    where = f"Mooncake {op} of {key!r}"
    if code in (RPC_FAIL, RPC_TIMEOUT):
        return StoreUnavailable(f"{where}: the master did not answer (RPC error {code})")
    if code == NO_AVAILABLE_HANDLE:
        return StoreFull(f"{where}: no segment space left (NO_AVAILABLE_HANDLE)")
    if code == LEASE_EXPIRED:
        return LeaseExpired(f"{where}: the read lease expired before the data arrived (LEASE_EXPIRED)")
    if code in (REPLICA_IS_NOT_READY, OBJECT_REPLICA_BUSY):
        return ObjectNotReady(f"{where}: the object's write has not completed (code {code})")
    return StoreError(f"{where} failed with Mooncake error code {code}")
