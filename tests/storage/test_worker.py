"""The storage worker runs store calls off the caller's thread and reports each completion once.

The store's gate (FaultyStore.hold) keeps a request in flight for as long as a test needs,
so "the caller was not blocked" is checked by the submit returning while the gate is shut.
"""

from __future__ import annotations

import pytest

from cacheruntime.storage import FaultyStore, FileStore, InvalidStoreArgument, Op, Status, StorageWorker, StoreError

PAGE = 1024


@pytest.fixture
def faulty(tmp_path):
    return FaultyStore(FileStore(tmp_path))


@pytest.fixture
def worker(faulty):
    worker = StorageWorker(faulty, threads=2)
    yield worker
    worker.close()


def test_a_submit_returns_while_the_store_is_blocked_and_the_completion_follows(faulty, worker):
    faulty.put(["a", "b"], [bytearray(b"a" * PAGE), bytearray(b"b" * PAGE)])
    faulty.hold(Op.GET)
    targets = [bytearray(PAGE), bytearray(PAGE), bytearray(PAGE)]
    request = worker.submit_get(["a", "b", "c"], targets)
    faulty.arrivals(Op.GET, 1)
    assert worker.poll() == () and worker.in_flight == 1
    faulty.release(Op.GET)
    done = worker.wait(request)
    assert done.request == request and done.op is Op.GET and done.ok
    assert [r.status for r in done.results] == [Status.HIT, Status.HIT, Status.MISS]
    assert done.bytes_moved == 2 * PAGE and targets[:2] == [b"a" * PAGE, b"b" * PAGE]
    assert worker.poll() == () and worker.in_flight == 0


def test_poll_reports_every_completion_once_in_request_order(worker):
    put = worker.submit_put(["a"], [bytearray(PAGE)])
    worker.wait(put)
    requests = [worker.submit_put(["b"], [bytearray(PAGE)]), worker.submit_remove(["a", "z"])]
    worker.close()  # finishes both
    done = worker.poll()
    assert [c.request for c in done] == requests
    assert [r.status for r in done[1].results] == [Status.REMOVED, Status.ABSENT]
    assert done[0].bytes_moved == PAGE and done[1].bytes_moved == 0 and worker.poll() == ()


def test_a_failed_key_is_reported_with_its_error_and_the_rest_kept(faulty, worker):
    faulty.fail_nth(Op.PUT, 1)
    done = worker.wait(worker.submit_put(["a", "b"], [bytearray(PAGE), bytearray(PAGE)]))
    assert not done.ok and [r.status for r in done.results] == [Status.FAILED, Status.STORED]
    assert done.bytes_moved == PAGE


class Raising:
    name = "raising"

    def get(self, keys, targets):
        raise RuntimeError("backend bug")


def test_a_store_that_raises_becomes_a_failed_completion_not_a_lost_request():
    worker = StorageWorker(Raising(), threads=1)
    done = worker.wait(worker.submit_get(["a", "b"], [bytearray(PAGE), bytearray(PAGE)]))
    worker.close()
    assert [r.status for r in done.results] == [Status.FAILED, Status.FAILED]
    assert isinstance(done.results[0].error, StoreError) and "backend bug" in str(done.results[0].error)


def test_malformed_requests_raise_on_the_callers_thread_and_queue_nothing(worker):
    with pytest.raises(InvalidStoreArgument):
        worker.submit_get(["a"], [bytes(PAGE)])
    with pytest.raises(InvalidStoreArgument):
        worker.submit_put(["../a"], [bytearray(PAGE)])
    assert worker.in_flight == 0 and worker.poll() == ()
