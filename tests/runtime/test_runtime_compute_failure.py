"""A runner that raises fails the batch (spec/protocol.md §4.5), on the runtime as in the model.

The runner seam (`LocalGPURuntime(runner=...)`) takes a tagging runner that raises on its
Nth forward, before or after writing its KV. The runtime's `execute_batch` must raise
`ComputeFailed` and leave the state the model's `fail_compute` leaves (compared through
`probe()`, with the bytes the contract leaves undefined masked: positions no executed batch
wrote), keep every invariant, and go on serving: the items prepared again compute the
tokens the model computes, so no byte the failed compute wrote is read as a valid one (D1).
"""

from __future__ import annotations

import attrs
import pytest
import torch
from runtimekit import PS, item, plan, twin_model

from cacheruntime.invariants import check_state
from cacheruntime.protocol import (
    AbstractState,
    Backup,
    BatchState,
    CacheRuntimeError,
    ComputeFailed,
    CopyState,
    Demote,
    NotBackedUp,
    NotPrepared,
    Publish,
    Restore,
)
from cacheruntime.runtime.device.runner import DecoderConfig, TaggingRunner
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime


class FailingRunner:
    """The tagging runner, raising on its `fail_at`-th forward: before its KV writes, or after them."""

    tagged = True

    def __init__(self, fail_at: int, when: str):
        self.inner = TaggingRunner(DecoderConfig(), torch.device("cpu"))
        self.fail_at, self.when, self.calls = fail_at, when, 0

    def forward(self, memory, table, items):
        self.calls += 1
        if self.calls == self.fail_at:
            if self.when == "after":
                self.inner.forward(memory, table, items)
            raise RuntimeError("injected compute failure")
        return self.inner.forward(memory, table, items)

    def finish(self, outputs, items):
        return self.inner.finish(outputs, items)

    def page_tags(self, pages):
        return self.inner.page_tags(pages)


def runtime_failing(fail_at: int, when: str) -> LocalGPURuntime:
    options = {**CONFORMANCE_OPTIONS, "runner": FailingRunner(fail_at, when)}
    return LocalGPURuntime(**options)


def defined(state: AbstractState) -> AbstractState:
    """The state with the bytes the contract leaves undefined masked: tags of positions never
    written (version 0) and of copies that are not valid."""

    def tags(copy: CopyState, values: tuple[int, ...], versions: tuple[int, ...]):
        return tuple(t if v else None for t, v in zip(values, versions)) if copy is CopyState.VALID else None

    pages = tuple(attrs.evolve(p, l1_tags=tags(p.l1, p.l1_tags, p.versions), l2_tags=tags(p.l2, p.l2_tags, p.versions)) for p in state.pages)
    return attrs.evolve(state, pages=pages)


class Pair:
    """The runtime and the model, driven with the same calls; `fail` is the model's FailCompute."""

    def __init__(self, runtime: LocalGPURuntime):
        self.runtime, self.model = runtime, twin_model(runtime)
        self.model.info()

    def both(self, name: str, *args):
        value = getattr(self.runtime, name)(*args)
        assert getattr(self.model, name)(*args) == value if name != "info" else True
        self.check()
        return value

    def execute_failing(self, batch) -> ComputeFailed:
        with pytest.raises(ComputeFailed) as runtime_error:
            self.runtime.execute_batch(batch)
        with pytest.raises(ComputeFailed) as model_error:
            self.model.fail_compute(batch)
        assert runtime_error.value.batches == model_error.value.batches
        self.check()
        return runtime_error.value

    def check(self) -> None:
        state = self.runtime.probe()
        assert defined(state) == defined(self.model.probe())
        check_state(state)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failed_decode_step_has_no_visible_effect_and_the_retry_computes_right(when):
    pair = Pair(runtime_failing(fail_at=2, when=when))
    h = pair.both("open_request")
    pair.both("execute_batch", pair.both("prepare_batch", plan(item(h, 3))))
    step = pair.both("prepare_batch", plan(item(h, 1, start=7)))
    before = pair.runtime.probe().slots[0]
    error = pair.execute_failing(step)
    assert error.batches == (step.batch_id,)
    slot = pair.runtime.probe().slots[0]
    assert (slot.num_tokens, slot.reserved_tokens, slot.pages) == (3, 3, before.pages[: -(-3 // PS)])
    assert (step.batch_id, BatchState.FAILED) in {(b.batch_id, b.state) for b in pair.runtime.probe().batches}
    for call in ("execute_batch", "cancel_batch"):
        with pytest.raises(NotPrepared):
            getattr(pair.runtime, call)(step)
    retry = pair.both("prepare_batch", plan(item(h, 1, start=7)))
    pair.both("execute_batch", retry)  # the digests of the tags read back agree: no stale byte is read


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failed_batch_with_intents_restores_and_a_dependent_fails_as_a_whole(when):
    pair = Pair(runtime_failing(fail_at=2, when=when))
    a, b = pair.both("open_request"), pair.both("open_request")
    pair.both("execute_batch", pair.both("prepare_batch", plan(item(a, 2 * PS))))
    x = pair.both("publish", a, 0, 2)
    pair.both("submit", (Backup(x),))
    pair.both("wait_completions")
    pair.both("close_request", a)
    pair.both("submit", (Demote(x),))
    first = pair.both("prepare_batch", plan(item(b, 1, attach=[x]), intents=[Restore(x), Publish(b, 0, 1), Backup(x)]))
    second = pair.both("prepare_batch", plan(item(b, 2)))
    error = pair.execute_failing(first)
    assert error.batches == (first.batch_id, second.batch_id)
    state = pair.runtime.probe()
    assert state.slots[b.slot_id].pages == () and state.slots[b.slot_id].reserved_tokens == 0
    assert not state.transfers, "the restore compute waited for completed; no backup started"
    assert [e.generation for e in state.extents] == [x.generation], "no extent was published"
    retry = pair.both("prepare_batch", plan(item(b, 1, attach=[x]), intents=[Publish(b, 0, 1)]))
    pair.both("execute_batch", retry)


def test_an_invalid_intent_fails_execute_before_compute_runs():
    pair = Pair(runtime_failing(fail_at=2, when="after"))
    a, b = pair.both("open_request"), pair.both("open_request")
    pair.both("execute_batch", pair.both("prepare_batch", plan(item(a, 2 * PS))))
    x = pair.both("publish", a, 0, 2)
    batch = pair.both("prepare_batch", plan(item(b, 1), intents=[Demote(x)]))
    before = pair.runtime.probe()
    for side in (pair.runtime.execute_batch, pair.model.fail_compute):
        with pytest.raises(CacheRuntimeError) as error:
            side(batch)
        assert type(error.value) is NotBackedUp
    assert pair.runtime.probe() == before and pair.runtime.device_layer.runner.calls == 1, "compute never ran"
    pair.check()
