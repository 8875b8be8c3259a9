"""`HiCacheStore`'s answers to what SGLang's real `HiCacheFile` never answers (that one is tested
in tests/sglang/test_hicache_bridge.py): a page returned in a tensor of the backend's own, and a
`batch_get` that answers None or something that is not one page per key."""

from __future__ import annotations

import pytest
import torch

from cacheruntime.storage import SizeMismatch, Status, StoreError
from cacheruntime.storage.hicache import HiCacheStore


class OwnTensors:
    """A backend whose `batch_get` answers tensors of its own, as the ABC allows."""

    def __init__(self, answer):
        self.answer = answer

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        return self.answer(keys)

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        return True

    def exists(self, key):
        return True


def test_a_page_in_the_backends_own_tensor_is_copied_into_the_target():
    store = HiCacheStore(OwnTensors(lambda keys: [torch.full((8,), 7, dtype=torch.int16), torch.zeros(3, dtype=torch.int16)]))
    targets = [bytearray(16), bytearray(16)]
    got = store.get(["a", "b"], targets)
    assert got[0].status is Status.HIT and targets[0] == torch.full((8,), 7, dtype=torch.int16).numpy().tobytes()
    assert got[1].status is Status.FAILED and isinstance(got[1].error, SizeMismatch)


@pytest.mark.parametrize(("answer", "status"), [(None, Status.MISS), (3, Status.FAILED), ([None], Status.FAILED)])
def test_a_batch_answer_that_is_not_one_page_per_key(answer, status):
    got = HiCacheStore(OwnTensors(lambda keys: answer)).get(["a", "b"], [bytearray(4), bytearray(4)])
    assert [r.status for r in got] == [status] * 2
    assert all(r.error is None if status is Status.MISS else type(r.error) is StoreError for r in got)
