"""Helpers shared by the runtime tests (not a test module): builders and a model twin."""

from __future__ import annotations

import attrs
import pytest

from cacheruntime.invariants import B2_plain_values, check_state
from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import AbstractState, BatchCompletion, BatchItem, BatchPlan, CacheRuntimeError, Capability, CopyState, OutOfPages, RuntimeInfo
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, conformance
from cacheruntime.runtime.local import LocalGPURuntime

PS = 2  # page size of the conformance configuration


def twin_model(runtime: LocalGPURuntime, **l3) -> ReferenceModel:
    """The reference model sized and named as `runtime` is (`l3`: its `l3` and `host_mode`)."""
    info = runtime.info()
    return ReferenceModel(
        runtime_id=info.runtime_id,
        page_size=info.page_size,
        max_requests=info.max_requests,
        max_request_tokens=info.max_request_tokens,
        l1_pages=info.l1_pages,
        l2_pages=info.l2_pages,
        vocab_size=info.vocab_size,
        **l3,
    )


def plan(*items: BatchItem, intents=()) -> BatchPlan:
    return BatchPlan(tuple(items), tuple(intents))


def item(request, n=1, *, attach=(), append=False, start=1) -> BatchItem:
    return BatchItem(request, tuple(range(start, start + n)), tuple(attach), append)


def comparable(state: AbstractState) -> AbstractState:
    """The state with the tags of copies still being filled blanked: their bytes are in flight."""
    pages = tuple(
        attrs.evolve(
            p,
            l1_tags=p.l1_tags if p.l1 is not CopyState.FILLING else None,
            l2_tags=p.l2_tags if p.l2 is not CopyState.FILLING else None,
        )
        for p in state.pages
    )
    return attrs.evolve(state, pages=pages)


def fails(runtime, exc: type[CacheRuntimeError], fn, *args):
    """`fn(*args)` raises exactly `exc` and leaves the abstract state as it was (atomicity)."""
    before = runtime.probe()
    with pytest.raises(CacheRuntimeError) as info:
        fn(*args)
    assert type(info.value) is exc, f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    assert comparable(runtime.probe()) == comparable(before), "a failed call changed the runtime"
    return info.value


class Twin:
    """Drive a runtime and the reference model with the same calls and compare everything.

    Results (or error types and OutOfPages counts) must be equal, and after each call so
    must the abstract states. The runtime's transfers complete on their own; when its
    `poll_completions` retires some, the model is told the same `complete_transfer`s.
    """

    def __init__(self, runtime: LocalGPURuntime):
        self.runtime = runtime
        self.model = twin_model(runtime)
        self.model.info()  # twin_model asked the runtime once; keep the call counts equal

    def __getattr__(self, name: str):
        def call(*args):
            if name == "poll_completions":
                return self._poll()
            return self._both(name, *args)

        return call

    def _both(self, name: str, *args):
        outcomes = []
        for side in (self.runtime, self.model):
            try:
                outcomes.append(("ok", getattr(side, name)(*args)))
            except CacheRuntimeError as error:
                outcomes.append(("error", error))
        (r_kind, r_value), (m_kind, m_value) = outcomes
        assert r_kind == m_kind, f"{name}: runtime {r_kind} {r_value!r}, model {m_kind} {m_value!r}"
        if r_kind == "error":
            assert type(r_value) is type(m_value), f"{name}: runtime raised {r_value!r}, model {m_value!r}"
            if isinstance(r_value, OutOfPages):
                assert (r_value.tier, r_value.needed, r_value.free) == (m_value.tier, m_value.needed, m_value.free)
        else:
            r_value = self._as_model(r_value, m_value)
            assert r_value == m_value, f"{name}: runtime returned {r_value!r}, model {m_value!r}"
            assert not B2_plain_values(r_value)
        self.check()
        if r_kind == "error":
            raise r_value
        return r_value

    def _as_model(self, value, model_value):
        """The runtime's value with what the model cannot know replaced by the model's.

        The model claims no test knobs and has no bytes (`page_bytes` 0); it computes
        next tokens as digests, as the tagging runner does, so a tiny runner's tokens
        (compared with `reference_next_token` elsewhere) are not compared here.
        """
        if isinstance(value, RuntimeInfo):
            assert value.capabilities >= model_value.capabilities - {Capability.TAGGED_COMPUTE}
            assert value.page_bytes > 0
            return attrs.evolve(value, capabilities=model_value.capabilities, page_bytes=model_value.page_bytes)
        if isinstance(value, BatchCompletion) and Capability.TAGGED_COMPUTE not in self.runtime.capabilities:
            items = tuple(attrs.evolve(i, next_token=m.next_token) for i, m in zip(value.items, model_value.items))
            return attrs.evolve(value, items=items)
        return value

    def _poll(self):
        """Poll the runtime; the reported transfers the model still has in flight are the ones
        the environment completed since, in the order reported (the model's CompleteTransfer)."""
        done = self.runtime.poll_completions()
        for completion in done:
            if completion.ticket.transfer_id in self.model.state.transfers:
                self.model.complete_transfer(completion.ticket.transfer_id)
        assert self.model.poll_completions() == done
        self.check()
        return done

    def check(self) -> None:
        state = self.runtime.probe()
        assert comparable(state) == comparable(self.model.probe())
        check_state(state)


def new_twin(device: str = "cpu", runner: str = "tagging") -> Twin:
    """A twin on the conformance configuration, with the tagging runner (probe() reads the
    real bytes) or the tiny one (probe() shows the ledger's tags, so bookkeeping the bytes
    would hide shows)."""
    return Twin(conformance(device) if runner == "tagging" else LocalGPURuntime(device=device, **{**CONFORMANCE_OPTIONS, "runner": runner}))


def step(t: Twin, p: BatchPlan):
    """Prepare and execute `p` on both sides."""
    return t.execute_batch(t.prepare_batch(p))
