"""The file store's durability rule: a crashed writer never leaves a torn object visible.

The crash is real: a child process starts a put, writes half the page into the temporary
file and reports it over a pipe, then blocks; the parent kills it with SIGKILL at that
point (no sleeps: the pipe says when) and looks at the directory as a restarted runtime would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from cacheruntime.storage import FileStore, Status, StoreIOError

PAGE = 1 << 16

CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys
    from cacheruntime.storage import filestore

    real_write = os.write

    def half_then_hang(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        print("half written", flush=True)
        sys.stdin.read()  # the parent kills us here

    filestore.os.write = half_then_hang
    filestore.FileStore(sys.argv[1]).put(["torn"], [bytearray(b"x" * {page})])
    """
).format(page=PAGE)


def test_a_writer_killed_mid_put_leaves_no_object_visible(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert child.stdout.readline().strip() == "half written"
    temporaries = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert len(temporaries) == 1 and temporaries[0].stat().st_size == PAGE // 2  # the half page is on disk
    child.send_signal(signal.SIGKILL)
    child.wait()
    restarted = FileStore(tmp_path)
    assert restarted.exists(["torn"])[0].status is Status.ABSENT
    assert restarted.get(["torn"], [bytearray(PAGE)])[0].status is Status.MISS
    assert restarted.sweep_temporaries() == 1 and list(tmp_path.iterdir()) == []
    assert restarted.put(["torn"], [bytearray(b"y" * PAGE)])[0].status is Status.STORED


def test_a_failed_write_answers_failed_and_leaves_no_temporary(tmp_path, monkeypatch):
    from cacheruntime.storage import filestore

    def disk_full(fd, data):
        raise OSError(28, "No space left on device")

    store = FileStore(tmp_path)
    store.put(["kept"], [bytearray(PAGE)])
    monkeypatch.setattr(filestore.os, "write", disk_full)
    result = store.put(["lost"], [bytearray(PAGE)])[0]
    assert result.status is Status.FAILED and isinstance(result.error, StoreIOError) and "No space" in str(result.error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_a_put_of_a_stored_key_does_not_rewrite_it(tmp_path):
    store = FileStore(tmp_path)
    store.put(["k"], [bytearray(PAGE)])
    before = os.stat(tmp_path / "k").st_ino
    assert store.put(["k"], [bytearray(PAGE)])[0].status is Status.STORED
    assert os.stat(tmp_path / "k").st_ino == before


def test_with_fsync_a_put_round_trips(tmp_path):
    store = FileStore(tmp_path, fsync=True)
    page = bytearray(os.urandom(PAGE))
    assert store.put(["synced"], [page])[0].status is Status.STORED
    back = bytearray(PAGE)
    assert FileStore(tmp_path).get(["synced"], [back])[0].status is Status.HIT and back == page


def test_a_store_whose_directory_vanished_fails_every_key_typed(tmp_path):
    store = FileStore(tmp_path / "gone")
    (tmp_path / "gone").rmdir()
    results = store.put(["a", "b"], [bytearray(PAGE), bytearray(PAGE)])
    assert [r.status for r in results] == [Status.FAILED, Status.FAILED]
    assert all(isinstance(r.error, StoreIOError) for r in results)
