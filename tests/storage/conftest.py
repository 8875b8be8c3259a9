"""Stores for the storage tests: each backend behind one fixture, and the Mooncake cluster.

The Mooncake tests skip only where the `[mooncake]` wheel is not installed (CI installs
it, so there they run); a cluster that is installed but cannot start fails them.
"""

from __future__ import annotations

import importlib.util

import pytest

from cacheruntime.storage import FaultyStore, FileStore

#: the read lease of the test cluster: long enough that a remove right after a get still
#: meets it on a loaded machine, short enough that waiting it out is cheap
LEASE_MS = 1500


def mooncake_installed() -> bool:
    return importlib.util.find_spec("mooncake") is not None


needs_mooncake = pytest.mark.skipif(not mooncake_installed(), reason="the [mooncake] extra (mooncake-transfer-engine-non-cuda) is not installed")


@pytest.fixture(scope="session")
def mooncake_cluster(tmp_path_factory):
    from cacheruntime.storage.master import LocalMooncake

    with LocalMooncake(tmp_path_factory.mktemp("mooncake"), lease_ms=LEASE_MS) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def mooncake_store(mooncake_cluster):
    from cacheruntime.storage.mooncake import MooncakeStore

    store = MooncakeStore(mooncake_cluster.config())
    yield store
    store.close()


@pytest.fixture(params=["file", "faulty-file", pytest.param("mooncake", marks=needs_mooncake)])
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "l3")
    if request.param == "faulty-file":
        return FaultyStore(FileStore(tmp_path / "l3"))
    return request.getfixturevalue("mooncake_store")
