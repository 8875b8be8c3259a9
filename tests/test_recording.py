"""The recorder forwards every boundary call unchanged, logs what came back, and prints calls as protocol calls."""

from __future__ import annotations

import itertools

import pytest

from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import BatchItem, BatchPlan, RequestRuntimeHandle, RuntimeInterface, StaleHandle, UnknownHandle
from cacheruntime.recording import BOUNDARY_OPERATIONS, Call, Recorder, format_call, format_calls


def _model() -> ReferenceModel:
    return ReferenceModel(runtime_id="m", page_size=2, max_requests=2, max_request_tokens=8, l1_pages=4, l2_pages=4)


def test_every_boundary_operation_is_recorded_not_passed_through():
    assert set(BOUNDARY_OPERATIONS) == {
        "info",
        "open_request",
        "close_request",
        "prepare_batch",
        "execute_batch",
        "cancel_batch",
        "publish",
        "split",
        "retain",
        "release",
        "submit",
        "poll_completions",
        "wait_completions",
        "restart",
    }
    assert all(name in Recorder.__dict__ for name in BOUNDARY_OPERATIONS)
    assert isinstance(Recorder(_model()), RuntimeInterface)


def test_calls_are_forwarded_and_logged_with_their_value_or_error():
    bare, recorded = _model(), Recorder(_model())
    handle = recorded.open_request()
    assert handle == bare.open_request()
    plan = BatchPlan((BatchItem(handle, (1, 2, 3)),))
    batch = recorded.prepare_batch(plan)
    done = recorded.execute_batch(batch)
    assert done == bare.execute_batch(bare.prepare_batch(plan))
    unissued = RequestRuntimeHandle("m", 0, 0, 7)
    with pytest.raises(UnknownHandle) as raised:
        recorded.close_request(unissued)
    assert [(c.operation, c.args) for c in recorded.calls] == [
        ("open_request", ()),
        ("prepare_batch", (plan,)),
        ("execute_batch", (batch,)),
        ("close_request", (unissued,)),
    ]
    assert [c.value for c in list(recorded.calls)[:3]] == [handle, batch, done]
    assert recorded.calls[3].error is raised.value and recorded.calls[3].raised and not recorded.calls[0].raised
    assert recorded.probe() == bare.probe(), "the failed close changed nothing, and probe() passes through"


def test_other_attributes_pass_through_read_and_written():
    model = _model()
    recorded = Recorder(model)
    saved = model.state.clone()
    recorded.open_request()
    recorded.state = saved  # as the suite undoes a call in the model
    assert model.state is saved and recorded.state is saved
    assert not hasattr(recorded, "no_such_attribute")
    assert len(recorded.calls) == 1


def test_keep_bounds_the_log_and_a_shared_clock_orders_two_recorders():
    clock = itertools.count()
    first, second = Recorder(_model(), keep=2, clock=clock), Recorder(_model(), clock=clock)
    for _ in range(3):
        first.info()
        second.info()
    assert [c.index for c in first.calls] == [2, 4] and [c.index for c in second.calls] == [1, 3, 5]
    printed = format_calls(second.calls, last=2, marker="<-- here")
    assert printed.splitlines()[0] == "  ... 1 earlier calls left out"
    assert printed.splitlines()[1].startswith("  2  info() -> RuntimeInfo(runtime_id='m', epoch=0,")
    assert printed.endswith("  <-- here")


def test_calls_print_in_the_protocols_own_repr():
    handle = RequestRuntimeHandle("m", 0, 1, 2)
    assert format_call(Call(0, "open_request", (), handle)) == "open_request() -> RequestRuntimeHandle(runtime_id='m', epoch=0, slot_id=1, generation=2)"
    error = StaleHandle("request slot 1 is at generation 3, not 2")
    expected = (
        "close_request(RequestRuntimeHandle(runtime_id='m', epoch=0, slot_id=1, generation=2)) raises StaleHandle: request slot 1 is at generation 3, not 2"
    )
    assert format_call(Call(1, "close_request", (handle,), error=error)) == expected
    assert str(Call(2, "publish", (handle, 0, 1), error=KeyError(5))) == f"publish({handle!r}, 0, 1) raises KeyError: 5"
