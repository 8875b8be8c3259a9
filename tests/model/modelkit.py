"""Small helpers shared by the model tests (not a test module)."""

from __future__ import annotations

import copy

import attrs
import pytest

from cacheruntime.invariants import B2_plain_values
from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import BatchItem, BatchPlan, CacheRuntimeError, Tier

PS = 4  # page size of the default model


def new_model(**kw) -> ReferenceModel:
    kw.setdefault("page_size", PS)
    return ReferenceModel(**kw)


def plan(*items, intents=()) -> BatchPlan:
    return BatchPlan(tuple(items), tuple(intents))


def item(request, n=1, *, attach=(), append=False, start=1) -> BatchItem:
    return BatchItem(request, tuple(range(start, start + n)), tuple(attach), append)


def compute(m: ReferenceModel, request, n=1, *, attach=(), append=False, intents=()):
    """Prepare and execute one single-item batch; return the completion."""
    batch = m.prepare_batch(plan(item(request, n, attach=attach, append=append), intents=intents))
    done = m.execute_batch(batch)
    assert not B2_plain_values(done)
    return done


def extent(m: ReferenceModel, pages=2):
    """Open a request, compute `pages` full pages and publish them: (handle, ref)."""
    h = m.open_request()
    compute(m, h, pages * m.page_size)
    return h, m.publish(h, 0, pages)


def fails(m: ReferenceModel, exc: type[CacheRuntimeError], fn, *args, **kwargs) -> CacheRuntimeError:
    """Call `fn`, which must raise exactly `exc`, and check it changed nothing."""
    state, view = copy.deepcopy(m.state), m.probe()
    with pytest.raises(CacheRuntimeError) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc, f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    assert info.value.what and isinstance(info.value.fix, str)
    assert m.state == state, "a failed call changed the model state"
    assert m.probe() == view, "a failed call changed the abstract state"
    m.check_invariants()
    return info.value


def free(m: ReferenceModel, tier: Tier) -> int:
    return len(next(p for p in m.probe().pools if p.tier is tier).free)


def page_view(m: ReferenceModel, name: int):
    return next(p for p in m.probe().pages if p.page == name)


def foreign(handle):
    return attrs.evolve(handle, runtime_id="elsewhere")
