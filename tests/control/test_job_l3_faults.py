"""`cacheruntime run --l3`: the store fails under the job (issue 21 item 6's faults) and the job goes on by recompute.

Two faults, each a typed outcome that loses nothing (spec/protocol.md §9.3-§9.5): a file
store whose every write fails (a read-only directory, a full disk), and a Mooncake master
killed after a first run filled the cluster, while the second run fetches from it. In both
the job exits 0, every served token equals its recomputation (0 output mismatches), no turn
is abandoned, and the summary counts the failures.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import signal
from typing import ClassVar

import pytest

from cacheruntime.cli import main
from cacheruntime.storage import FaultyStore, FileStore, StoreIOError
from cacheruntime.storage.results import KeyResult, failed

SMALL = ("--requests", "8", "--new-tokens", "3", "6")


def run(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    code = main(["run", "--quiet", "--json", str(out), *SMALL, *args])
    return code, json.loads(out.read_text())


class DiskFull(FaultyStore):
    """A file store whose disk is full: every put answers FAILED `StoreIOError` (ENOSPC), as
    `FileStore` answers an `OSError` from its write; reads and queries go through."""

    def put(self, keys, sources) -> tuple[KeyResult, ...]:
        reason = OSError(errno.ENOSPC, "No space left on device")
        return tuple(failed(key, StoreIOError(f"put of {key!r}: {reason}")) for key in keys)


@pytest.mark.parametrize("mode", ["resident", "buffer_only"])
def test_every_store_write_failing_loses_nothing(tmp_path, monkeypatch, mode):
    """Every persist fails (STORE): counted, its pages stay as they were, the job serves every turn."""
    monkeypatch.setattr("cacheruntime.runtime.l3calls.open_store", lambda spec: DiskFull(FileStore(tmp_path / "l3")))
    code, summary = run(tmp_path, "full", "--l3", f"file:{tmp_path / 'l3'}", "--host-mode", mode)
    assert code == 0 and summary["output_mismatches"] == 0 and summary["turns_abandoned"] == 0
    seen = summary["faults_seen"]
    assert seen["failed_persists"] > 0 and seen["failed_persists"] == summary["transfers"]["persists"]
    assert summary["persisted_bytes"] == 0 and summary["hit_tokens_l3"] == 0
    assert not [p for p in (tmp_path / "l3").iterdir() if not p.name.startswith(".")]


def test_the_store_directory_removed_under_the_job_loses_nothing(tmp_path, monkeypatch):
    """A real `FileStore` whose directory is gone once the runtime opened it (no injected fault):
    every put fails with the operating system's error (ENOENT), every hint answers absent."""
    root = tmp_path / "l3"

    def vanished(spec):
        store = FileStore(root)
        root.rmdir()
        return store

    monkeypatch.setattr("cacheruntime.runtime.l3calls.open_store", vanished)
    code, summary = run(tmp_path, "gone", "--l3", f"file:{root}")
    assert code == 0 and summary["output_mismatches"] == 0 and summary["turns_abandoned"] == 0
    assert summary["faults_seen"]["failed_persists"] > 0 and summary["faults_seen"]["failed_persists"] == summary["transfers"]["persists"]
    assert summary["persisted_bytes"] == 0 and summary["hit_tokens_l3"] == 0 and not root.exists()


needs_mooncake = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None, reason="the [mooncake] extra (mooncake-transfer-engine-non-cuda) is not installed"
)


class MasterKilledAtFirstFetch(FaultyStore):
    """A Mooncake client whose cluster's master is killed (SIGKILL) as the first fetch's read
    reaches the store: that read and everything after it meet a dead master."""

    cluster: ClassVar[object] = None
    killed: ClassVar[list[int]] = []

    def get(self, keys, targets) -> tuple[KeyResult, ...]:
        if not self.killed:
            master = self.cluster._processes[0]  # LocalMooncake starts the master first
            master.send_signal(signal.SIGKILL)
            master.wait()
            self.killed.append(master.pid)
        return super().get(keys, targets)


@needs_mooncake
def test_the_mooncake_master_killed_while_the_second_run_fetches(tmp_path, monkeypatch):
    """Run 1 persists into a cluster; run 2 finds the hits (l3_exists), and the master dies as its
    first fetch reads: that fetch fails (STORE), its batch fails and its turn recomputes; later
    hints answer absent (a failed query is no hit), persists fail; the job still serves every turn."""
    from cacheruntime.storage import mooncake
    from cacheruntime.storage.master import LocalMooncake

    with LocalMooncake(tmp_path / "mooncake") as cluster:
        store = f"mooncake:{cluster.master_address},{cluster.metadata_url}"
        code, first = run(tmp_path, "first", "--l3", store)
        assert code == 0 and first["output_mismatches"] == 0 and first["persisted_bytes"] > 0
        real = mooncake.MooncakeStore
        MasterKilledAtFirstFetch.cluster, MasterKilledAtFirstFetch.killed = cluster, []
        monkeypatch.setattr(mooncake, "MooncakeStore", lambda config: MasterKilledAtFirstFetch(real(config)))
        code, second = run(tmp_path, "second", "--l3", store)
    assert MasterKilledAtFirstFetch.killed, "the second run never fetched: the fault did not strike"
    assert code == 0 and second["output_mismatches"] == 0 and second["turns_abandoned"] == 0
    seen = second["faults_seen"]
    assert seen["failed_fetches"] >= 1 and seen["compute_failures"] >= 1 and second["turns_retried"] >= 1
    assert second["fetched_bytes"] == 0 and second["hit_tokens_l3"] == 0
    assert second["requests"] == first["requests"] and second["tokens"] == first["tokens"]


@needs_mooncake
def test_a_dead_master_is_answered_without_entering_mooncake(tmp_path):
    """After a call met the dead master (RPC_FAIL), later calls probe its port and answer FAILED
    `StoreUnavailable` themselves (Mooncake's client would block ~4.5 s per call reconnecting)."""
    from cacheruntime.storage import Status, StoreUnavailable
    from cacheruntime.storage.master import LocalMooncake
    from cacheruntime.storage.mooncake import MooncakeStore

    with LocalMooncake(tmp_path / "mooncake") as cluster:
        store = MooncakeStore(cluster.config())
        assert store.put(["page"], [bytearray(64)])[0].status is Status.STORED
        master = cluster._processes[0]
        master.send_signal(signal.SIGKILL)
        master.wait()
        first = store.exists(["page"])[0]
        assert first.status is Status.FAILED and isinstance(first.error, StoreUnavailable) and "RPC error" in str(first.error)
        for answer in (store.get(["page"], [bytearray(64)]), store.exists(["page", "other"]), store.put(["new"], [bytearray(64)])):
            assert all(r.status is Status.FAILED and isinstance(r.error, StoreUnavailable) and "no Mooncake master answers" in str(r.error) for r in answer)
        store.close()
