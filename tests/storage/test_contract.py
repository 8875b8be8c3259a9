"""What every backend answers, held to the `Store` interface (file, a FaultyStore passing through, Mooncake).

Keys are fresh per test (the Mooncake store is shared by the session), so no test sees
another's objects.
"""

from __future__ import annotations

import array
import os
import uuid

import pytest

from cacheruntime.storage import ALLOWED, InvalidStoreArgument, Op, SizeMismatch, Status, Store, leading_hits

PAGE = 4096


def fresh(count: int) -> list[str]:
    tag = uuid.uuid4().hex
    return [f"{tag}-{i}" for i in range(count)]


def allowed(op: Op, results) -> bool:
    return all(result.status in ALLOWED[op] for result in results)


def test_a_backend_is_a_store(store):
    assert isinstance(store, Store)


def test_put_then_get_moves_the_bytes_into_the_callers_buffers(store):
    keys = fresh(3)
    pages = [bytearray(os.urandom(PAGE)) for _ in keys]
    put = store.put(keys, pages)
    assert [r.status for r in put] == [Status.STORED] * 3 and [r.nbytes for r in put] == [PAGE] * 3
    targets = [bytearray(PAGE) for _ in keys]
    got = store.get(keys, [memoryview(t) for t in targets])
    assert [r.status for r in got] == [Status.HIT] * 3 and [r.key for r in got] == keys
    assert targets == pages


def test_a_typed_buffer_and_a_read_only_source_are_taken_as_bytes(store):
    key = fresh(1)
    source = array.array("d", range(PAGE // 8))
    assert store.put(key, [bytes(source)])[0].status is Status.STORED
    target = array.array("d", bytes(PAGE))
    assert store.get(key, [target])[0].status is Status.HIT
    assert target == source


def test_a_missing_object_is_a_miss_and_absent_not_an_error(store):
    keys = fresh(2)
    store.put(keys[:1], [bytearray(PAGE)])
    got = store.get(keys, [bytearray(PAGE), bytearray(PAGE)])
    assert [r.status for r in got] == [Status.HIT, Status.MISS]
    exists = store.exists(keys)
    assert [r.status for r in exists] == [Status.PRESENT, Status.ABSENT]
    assert leading_hits(exists) == 1
    assert [r.status for r in store.remove(keys[1:])] == [Status.ABSENT]


def test_a_put_of_a_stored_key_answers_stored(store):
    key = fresh(1)
    page = bytearray(os.urandom(PAGE))
    assert store.put(key, [page])[0].status is Status.STORED
    assert store.put(key, [page])[0].status is Status.STORED
    back = bytearray(PAGE)
    assert store.get(key, [back])[0].status is Status.HIT and back == page


def test_removed_objects_miss(store):
    keys = fresh(2)
    store.put(keys, [bytearray(PAGE), bytearray(PAGE)])
    removed = store.remove(keys)
    assert allowed(Op.REMOVE, removed)
    assert [r.status for r in removed] == [Status.REMOVED, Status.REMOVED]
    assert [r.status for r in store.get(keys, [bytearray(PAGE), bytearray(PAGE)])] == [Status.MISS, Status.MISS]


def test_an_object_of_another_size_fails_typed_never_a_hit(store):
    keys = fresh(2)
    store.put(keys, [bytearray(PAGE), bytearray(PAGE)])
    got = store.get(keys, [bytearray(PAGE // 2), bytearray(2 * PAGE)])
    assert [r.status for r in got] == [Status.FAILED, Status.FAILED]
    assert all(isinstance(r.error, SizeMismatch) for r in got)


@pytest.mark.parametrize(
    ("keys", "buffers"),
    [
        (["../escape"], [bytearray(PAGE)]),
        ([".hidden"], [bytearray(PAGE)]),
        ([""], [bytearray(PAGE)]),
        ("onekey", [bytearray(PAGE)]),
        (["a", "a"], [bytearray(PAGE), bytearray(PAGE)]),
        (["a", "b"], [bytearray(PAGE)]),
        (["a"], [bytes(PAGE)]),  # a get needs a writable buffer
        (["a"], [bytearray()]),
        (["a"], [memoryview(bytearray(2 * PAGE))[::2]]),
        (["a"], [object()]),
    ],
)
def test_malformed_arguments_raise_before_any_io(store, keys, buffers):
    with pytest.raises(InvalidStoreArgument):
        store.get(keys, buffers)


def test_every_answer_is_one_the_operation_may_give(store):
    keys = fresh(2)
    pages = [bytearray(PAGE), bytearray(PAGE)]
    assert allowed(Op.PUT, store.put(keys[:1], pages[:1]))
    assert allowed(Op.GET, store.get(keys, pages))
    assert allowed(Op.EXISTS, store.exists(keys))
    assert allowed(Op.REMOVE, store.remove(keys))
