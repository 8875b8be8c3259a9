"""The Mooncake backend against a real cluster on loopback: what only Mooncake does.

The read lease: a get leases the object for the master's `default_kv_lease_ttl`
(`LEASE_MS` here), and a remove inside it answers LEASED, not REMOVED and not an error;
once the lease runs out the remove goes through. Objects live in the cluster's segment
holder, so a second client (a restarted runtime) reads what the first one stored.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from tests.storage.conftest import LEASE_MS, needs_mooncake

from cacheruntime.storage import Status, StoreUnavailable

pytestmark = needs_mooncake
PAGE = 4096


def test_a_remove_inside_a_read_lease_answers_leased_then_goes_through(mooncake_store):
    key = [f"lease-{uuid.uuid4().hex}"]
    mooncake_store.put(key, [bytearray(PAGE)])
    leased_at = time.monotonic()
    assert mooncake_store.get(key, [bytearray(PAGE)])[0].status is Status.HIT
    first = mooncake_store.remove(key)[0].status
    # inside the lease the object stays; a machine stalled past it may see it removed already
    within_lease = time.monotonic() - leased_at < LEASE_MS / 1000
    assert first is (Status.LEASED if within_lease else Status.REMOVED)
    # the lease runs out: bounded retries (three leases), the verdict is that it ends REMOVED
    deadline = time.monotonic() + 3 * LEASE_MS / 1000
    status = first
    while status is Status.LEASED and time.monotonic() < deadline:
        time.sleep(0.05)
        status = mooncake_store.remove(key)[0].status
    assert status is Status.REMOVED
    assert mooncake_store.get(key, [bytearray(PAGE)])[0].status is Status.MISS


def test_a_second_client_reads_what_a_closed_one_stored(mooncake_cluster):
    from cacheruntime.storage.mooncake import MooncakeStore

    key = [f"restart-{uuid.uuid4().hex}"]
    page = bytearray(os.urandom(PAGE))
    first = MooncakeStore(mooncake_cluster.config())
    assert first.put(key, [page])[0].status is Status.STORED
    first.close()
    second = MooncakeStore(mooncake_cluster.config())
    back = bytearray(PAGE)
    assert second.get(key, [back])[0].status is Status.HIT and back == page
    second.close()


def test_a_client_without_a_master_is_a_typed_error_at_once():
    from cacheruntime.storage.master import free_port
    from cacheruntime.storage.mooncake import MooncakeConfig, MooncakeStore

    nowhere = MooncakeConfig(master_address=f"127.0.0.1:{free_port()}", metadata_url=f"http://127.0.0.1:{free_port()}/metadata")
    with pytest.raises(StoreUnavailable, match="is mooncake_master running"):
        MooncakeStore(nowhere)
