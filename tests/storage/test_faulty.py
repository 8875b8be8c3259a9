"""The test store's controls do what the conformance suite will rely on."""

from __future__ import annotations

import threading

import pytest

from cacheruntime.storage import FaultyStore, FileStore, InjectedFault, Op, Status

PAGE = 512


@pytest.fixture
def faulty(tmp_path):
    return FaultyStore(FileStore(tmp_path))


def test_the_nth_key_fails_counted_over_calls_and_never_reaches_the_store(faulty):
    faulty.fail_nth(Op.PUT, 2)
    faulty.fail_nth(Op.PUT, 4)
    first = faulty.put(["a", "b", "c"], [bytearray(PAGE)] * 3)
    second = faulty.put(["d"], [bytearray(PAGE)])
    assert [r.status for r in first + second] == [Status.STORED, Status.FAILED, Status.STORED, Status.FAILED]
    assert isinstance(first[1].error, InjectedFault)
    assert [r.status for r in faulty.inner.exists(["a", "b", "c", "d"])] == [Status.PRESENT, Status.ABSENT, Status.PRESENT, Status.ABSENT]


def test_a_failed_get_leaves_the_other_keys_hits(faulty):
    faulty.put(["a", "b"], [bytearray(b"a" * PAGE), bytearray(b"b" * PAGE)])
    faulty.fail_nth(Op.GET, 1)
    targets = [bytearray(PAGE), bytearray(PAGE)]
    assert [r.status for r in faulty.get(["a", "b"], targets)] == [Status.FAILED, Status.HIT]
    assert targets[1] == b"b" * PAGE


def test_an_evicted_object_misses(faulty):
    faulty.put(["a"], [bytearray(PAGE)])
    assert faulty.exists(["a"])[0].status is Status.PRESENT
    faulty.evict(["a"])
    assert faulty.get(["a"], [bytearray(PAGE)])[0].status is Status.MISS


def test_a_held_gate_stops_the_call_until_released(faulty):
    faulty.hold(Op.PUT)
    answers = []
    caller = threading.Thread(target=lambda: answers.append(faulty.put(["a"], [bytearray(PAGE)])))
    caller.start()
    faulty.arrivals(Op.PUT, 1)
    assert answers == [] and faulty.inner.exists(["a"])[0].status is Status.ABSENT
    faulty.release(Op.PUT)
    caller.join()
    assert answers[0][0].status is Status.STORED
