"""ProcessGPURuntime: the interface across a process boundary, with control free of torch.

Control's side is checked in fresh interpreters (a test's own process has torch loaded by
others): the client, the conformance factory and the main job run there and `sys.modules`
must hold no torch at the end. The rest runs here: one message per call (B1), typed errors
as the runtime raised them, a clear error when the process cannot start, `close()`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cacheruntime.protocol import (
    Backup,
    BatchCompletion,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    ItemResult,
    OutOfPages,
    PageRun,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    RuntimeFault,
    StaleHandle,
    Tier,
    TransferKind,
    UnknownHandle,
)
from cacheruntime.runtime.process import ProcessGPURuntime, RuntimeStartFailed, wire

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"))

CLIENT_WITHOUT_TORCH = """
import sys
from cacheruntime.protocol import BatchItem, BatchPlan
from cacheruntime.runtime.factories import process_conformance
runtime = process_conformance()
request = runtime.open_request()
done = runtime.execute_batch(runtime.prepare_batch(BatchPlan((BatchItem(request, (1, 2, 3)),))))
assert done.items[0].num_tokens == 3, done
assert runtime.probe().slots[0].live
runtime.close()
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""

JOB_WITHOUT_TORCH = """
import sys
from cacheruntime.cli import main
code = main(["run", "--runtime", "process", "--requests", "12", "--quiet"])
print("exit", code, "torch" in sys.modules)
"""


def test_the_client_drives_a_runtime_process_and_imports_no_torch():
    done = subprocess.run([sys.executable, "-c", CLIENT_WITHOUT_TORCH], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_main_job_runs_on_a_runtime_process_with_no_mismatch_and_no_torch_in_control():
    done = subprocess.run([sys.executable, "-c", JOB_WITHOUT_TORCH], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _field(done.stdout, "output_mismatches") == "0"
    # a poll that must report nothing crosses as a count in the next message (client.py): fewer messages than calls
    assert float(_field(done.stdout, "boundary_messages_per_batch_mean")) <= float(_field(done.stdout, "boundary_calls_per_batch_mean"))
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False"


@contextlib.contextmanager
def in_process_and_across(**options):
    """The conformance runtime in this process and across the boundary (`options` for the client),
    the local one started as the client starts its own (one `info` call); both closed after."""
    from cacheruntime.runtime.factories import conformance

    local, process = conformance(), ProcessGPURuntime("cacheruntime.runtime.factories:conformance", **options)
    local.info()
    try:
        yield local, process
    finally:
        process.close()
        local.close()


def _field(stdout: str, name: str) -> str:
    return next(line.split(None, 1)[1].strip() for line in stdout.splitlines() if line.split(None, 1)[:1] == [name])


@pytest.fixture(scope="module")
def runtime():
    client = ProcessGPURuntime("cacheruntime.runtime.factories:conformance")
    yield client
    client.close()


def test_one_message_per_boundary_call_whatever_the_tokens(runtime):
    request = runtime.open_request()
    before = sum(runtime.messages.values())
    handle = runtime.prepare_batch(BatchPlan((BatchItem(request, tuple(range(20))),)))
    runtime.execute_batch(handle)
    runtime.poll_completions()
    assert sum(runtime.messages.values()) - before == 2  # the poll after it reports nothing: no message (below)
    assert sum(runtime.messages.values()) + sum(runtime.unsent.values()) - before == 3
    runtime.close_request(request)


def test_a_poll_that_must_report_nothing_costs_no_message_and_still_counts(runtime):
    calls = dict(runtime.probe().boundary_calls)
    request = runtime.open_request()
    runtime.execute_batch(runtime.prepare_batch(BatchPlan((BatchItem(request, (1, 2)),))))
    sent, unsent = sum(runtime.messages.values()), runtime.unsent["poll_completions"]
    assert runtime.poll_completions() == () and runtime.poll_completions() == ()
    assert (sum(runtime.messages.values()), runtime.unsent["poll_completions"]) == (sent, unsent + 2)
    after = dict(runtime.probe().boundary_calls)  # the probe's message carries the two polls' count
    assert after["poll_completions"] - calls.get("poll_completions", 0) == 2
    runtime.close_request(request)


def _decode_loop(rt):
    """What a scheduler does: prefill, a backup in flight over some steps, decode steps each
    followed by polls (no probe between them), a wait; every result, then the state."""
    requests = [rt.open_request() for _ in range(2)]
    results = [rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1, 2, 3, 4)) for r in requests)))), rt.poll_completions()]
    results.append(rt.submit((Backup(rt.publish(requests[0], 0, 2)),)))
    for _ in range(6):
        results.append(rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, append_previous_output=True) for r in requests)))))
        results += [rt.poll_completions(), rt.poll_completions()]
    return [*results, rt.wait_completions(), rt.probe()]


def test_polls_answered_without_a_message_leave_every_result_and_the_state_as_in_process():
    with in_process_and_across() as (local, process):
        assert _decode_loop(process) == _decode_loop(local)  # the probe last: B1's counts, pages, transfers
        assert process.unsent["poll_completions"] > 0 and process.messages["poll_completions"] > 0


def test_sides_that_spin_before_they_sleep_give_the_same_results_and_still_see_a_death_at_once():
    with in_process_and_across(spin_us=5000) as (local, process):
        assert _decode_loop(process) == _decode_loop(local)
        os.kill(process.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RuntimeFault, match="gone"):
            process.open_request()
        assert time.monotonic() - started < 2  # the spin ends at the exit sentinel, not at its deadline


def test_a_poll_crosses_while_a_transfer_is_in_flight_and_a_dead_process_is_lost_at_an_unsent_poll():
    client = ProcessGPURuntime("cacheruntime.runtime.factories:conformance_threads")
    try:
        client.set_transfer_delay(0.5, TransferKind.BACKUP)
        request = client.open_request()
        client.execute_batch(client.prepare_batch(BatchPlan((BatchItem(request, (1, 2, 3, 4)),))))
        client.submit((Backup(client.publish(request, 0, 2)),))
        client.execute_batch(client.prepare_batch(BatchPlan((BatchItem(request, (5,)),))))  # the backup is in flight
        sent = client.messages["poll_completions"]
        client.poll_completions()
        assert client.messages["poll_completions"] == sent + 1
        assert len(client.wait_completions()) == 1
        client.execute_batch(client.prepare_batch(BatchPlan((BatchItem(request, (6,)),))))
        os.kill(client.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        with pytest.raises(RuntimeFault, match="gone"):
            while time.monotonic() < deadline:  # once the exit sentinel is up, the poll is lost, not answered
                client.poll_completions()
                time.sleep(0.01)
        assert client.restart().epoch == 1
    finally:
        client.close()


def test_typed_errors_arrive_with_their_type_and_fields(runtime):
    with pytest.raises(UnknownHandle):
        runtime.close_request(RequestRuntimeHandle("local", 0, 3, 7))
    request = runtime.open_request()
    with pytest.raises(OutOfPages) as raised:
        runtime.prepare_batch(BatchPlan((BatchItem(request, tuple(range(30))),)))
    assert (raised.value.tier, raised.value.needed, raised.value.free) == (Tier.L1, 15, 12)
    with pytest.raises(ValueError, match="negative"):
        runtime.set_transfer_delay(-1.0)
    runtime.close_request(request)
    with pytest.raises(StaleHandle):
        runtime.close_request(request)


def test_a_runtime_process_that_cannot_start_is_a_typed_error_with_its_reason():
    with pytest.raises(RuntimeStartFailed, match="l1_pages"):
        ProcessGPURuntime("cacheruntime.runtime.factories:local", l1_pages=0)
    with pytest.raises(RuntimeStartFailed, match="no_such_factory"):
        ProcessGPURuntime("cacheruntime.runtime.factories:no_such_factory")


def test_the_wire_format_round_trips_every_kind_of_value():
    request = RequestRuntimeHandle("local", 2, 1, 5)
    plan = BatchPlan((BatchItem(request, (1, 2), (), True),))
    message = ("prepare_batch", (plan,), {}, [1, [2]], (), ((1, 2), (3, 4)))
    assert wire.loads(wire.dumps(message)) == message


def test_plans_and_completions_cross_as_columns_and_anything_else_as_it_was():
    requests = [RequestRuntimeHandle("local", 2, slot, 5) for slot in range(3)]
    plan = BatchPlan(tuple(BatchItem(r, (slot,), (), slot == 1) for slot, r in enumerate(requests)))
    done = BatchCompletion(PreparedBatchHandle("local", 2, 7), tuple(ItemResult(r, 9, None) for r in requests), (), ())
    odd = [
        BatchPlan(()),
        BatchPlan((BatchItem(requests[0]), "not an item")),
        BatchPlan([BatchItem(requests[0])]),  # a list where the protocol says tuple
        BatchPlan((BatchItem(("local", 2, 0, 5)),)),  # a handle that is not one
        BatchPlan((BatchItem(RequestRuntimeHandle("local", True, 0, 5.0)),)),  # fields of the wrong types
    ]
    for value in (plan, done, *odd):
        back = wire.loads(wire.dumps((wire.OK, value)))[1]
        assert back == value and type(back.items) is type(value.items)
        assert [type(x) for x in back.items] == [type(x) for x in value.items]
    fields = wire.loads(wire.dumps((wire.OK, odd[-1])))[1].items[0].request
    assert (type(fields.epoch), type(fields.generation)) == (bool, float)


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (a layout must not turn True into 1 or a list into a tuple)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(map(_same, a, b))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)  # type: ignore[attr-defined,index]
    fields = getattr(type(a), "__attrs_attrs__", None)
    if fields is not None:
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields)
    return a == b


def test_a_decode_step_s_messages_cross_in_their_layouts_and_anything_else_is_pickled():
    batch = PreparedBatchHandle("local-7", 2, 41)
    parts = [batch, [1] * 3, [5, 0, 2**40], (), ()]
    laid_out = [
        (wire.dumps_request, wire.loads_request, (wire.PREPARE_AGAIN, ((),), {}, 1)),
        (wire.dumps_request, wire.loads_request, ("execute_batch", (batch,), {}, 0)),
        (wire.dumps_reply, wire.loads_reply, (wire.OK, batch)),
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, parts, True)),
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, parts, False)),
    ]
    pickled = [
        (wire.dumps_request, wire.loads_request, (wire.PREPARE_AGAIN, ([],), {}, 1)),  # a list of intents
        (wire.dumps_request, wire.loads_request, (wire.PREPARE_AGAIN, ((Backup(CacheExtentRef("x", 0, 1, 0)),),), {}, 0)),
        (wire.dumps_request, wire.loads_request, ("execute_batch", (PreparedBatchHandle("local-7", True, 41),), {}, 0)),
        (wire.dumps_request, wire.loads_request, ("execute_batch", (PreparedBatchHandle("local-7", 2, 2**63),), {}, 0)),
        (wire.dumps_request, wire.loads_request, ("execute_batch", (PreparedBatchHandle("\ud800", 2, 41),), {}, 0)),
        (wire.dumps_request, wire.loads_request, ("execute_batch", (("local-7", 2, 41),), {}, 0)),
        (wire.dumps_request, wire.loads_request, ("execute_batch", (batch,), {"extra": 1}, 0)),
        (wire.dumps_reply, wire.loads_reply, (wire.OK, PreparedBatchHandle("local-7", 2, 4.0))),
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, [batch, [1, 1, 1], [5, True, 2], (), ()], True)),
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, [batch, [1, 1, 1], [5, 0, 2**64], (), ()], True)),
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, [batch, [1], [5], [CacheExtentRef("x", 0, 1, 0)], ()], True)),
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, [batch, [1], [5], [], ()], True)),  # a list, not the empty tuple
        (wire.dumps_reply, wire.loads_reply, (wire.ON_PLAN, [batch, [], [], (), ()], False)),  # no items
        (wire.dumps_reply, wire.loads_reply, (wire.OK, None)),
    ]
    for dumps, loads, message in laid_out + pickled:
        data = dumps(*message) if dumps is wire.dumps_request else dumps(message)
        assert (data[:1] == b"\x80") == ((dumps, loads, message) in pickled), message  # a pickle opens with its protocol
        assert _same(loads(data), message), message


def test_a_link_carries_whole_messages_of_any_size_and_says_when_its_peer_closed():
    import socket

    from cacheruntime.runtime.process.link import BUFFER_BYTES, Link

    ours, theirs = socket.socketpair()
    near, far = Link(ours), Link(theirs)
    for size in (0, 1, BUFFER_BYTES - 8, BUFFER_BYTES - 7, 3 * BUFFER_BYTES + 5):
        message = bytes(range(256)) * (size // 256) + bytes(size % 256)
        near.send(message)
        assert far.recv() == message
        far.send(message[::-1])
        assert near.recv() == message[::-1]
    near.send(b"one")
    near.send(b"two")  # two at once: the strict turn is broken
    with pytest.raises(ConnectionError, match="beyond a message"):
        far.recv()
    near.close()
    with pytest.raises(EOFError):
        far.recv()
    far.close()


def test_a_handle_arrives_as_the_receiving_process_s_own_object_of_its_value_and_types():
    # `received`: a plan's bytes as another process sent them (made first, so that what this process
    # sends next decides which object of the value it holds)
    received = wire.dumps((wire.OK, BatchPlan((BatchItem(RequestRuntimeHandle("own", 0, 4, 2), (), (), True),))))
    sent = RequestRuntimeHandle("own", 0, 4, 2)
    wire.dumps((wire.OK, sent))  # sent once: remembered here
    assert wire.loads(received)[1].items[0].request is sent
    odd = BatchPlan((BatchItem(RequestRuntimeHandle("own", True, 4, 2.0)),))  # equal as a key, other types
    back = wire.loads(wire.dumps((wire.OK, odd)))[1].items[0].request
    assert back is not sent and (type(back.epoch), type(back.generation)) == (bool, float)
    assert wire.loads(received)[1].items[0].request is sent  # the odd one was not remembered
    in_a_plan = RequestRuntimeHandle("own", 0, 4, 2)
    wire.dumps((wire.OK, BatchPlan((BatchItem(in_a_plan, (1,)),))))  # a plan's handles sent as columns: remembered too
    assert wire.loads(received)[1].items[0].request is in_a_plan
    newer = RequestRuntimeHandle("own", 0, 4, 3)
    assert wire.loads(wire.dumps((wire.OK, newer)))[1] is newer  # the slot's next generation replaces it
    again = wire.loads(received)[1].items[0].request
    assert again == sent and again is not sent and again is not in_a_plan


def test_a_runtime_process_that_never_serves_is_a_typed_error_and_is_killed():
    with pytest.raises(RuntimeStartFailed, match=r"did not serve within 1\.0 s"):
        ProcessGPURuntime("signal:pause", start_timeout_s=1.0)  # the factory blocks until a signal: the kill


def test_close_ends_the_runtime_process_and_every_later_call_is_a_typed_error():
    client = ProcessGPURuntime("cacheruntime.runtime.factories:conformance")
    pid = client.pid
    client.close()
    client.close()
    assert client.pid is None
    with pytest.raises(OSError):
        os.kill(pid, 0)  # reaped: no such process
    with pytest.raises(RuntimeFault, match="closed"):
        client.open_request()


def test_a_runtime_s_own_error_subclass_arrives_as_its_protocol_type():
    class LedgerStale(StaleHandle):
        pass

    with pytest.raises(StaleHandle, match="epoch 3") as raised:
        wire.raise_reply(wire.loads(wire.dumps(wire.error_reply(LedgerStale("epoch 3 is over")))))
    assert type(raised.value) is StaleHandle and raised.value.what == "epoch 3 is over"


class Interrupted(Exception):
    """What the alarm raises in the waiting call, as Ctrl-C's KeyboardInterrupt would."""


def _interrupt(signum, frame):
    raise Interrupted()


def test_an_interrupted_call_leaves_the_runtime_lost_until_restart():
    client = ProcessGPURuntime("cacheruntime.runtime.factories:conformance_threads")
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        client.set_transfer_delay(30.0, TransferKind.BACKUP)
        request = client.open_request()
        client.execute_batch(client.prepare_batch(BatchPlan((BatchItem(request, (1, 2, 3, 4)),))))
        client.submit((Backup(client.publish(request, 0, 2)),))
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            client.wait_completions()  # the backup takes 30 s: the alarm interrupts the wait
        with pytest.raises(RuntimeFault, match="interrupted"):
            client.poll_completions()
        assert client.restart().epoch == 1
        assert client.open_request().epoch == 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        client.close()


def test_the_job_runs_on_a_runtime_process_without_pyzmq():
    """The link is a plain Unix socket (client.py): the process runtime needs no package beyond the runtime's."""
    code = "import sys; sys.modules['zmq'] = None; from cacheruntime.cli import main; sys.exit(main(['run', '--runtime', 'process', '--requests', '4', '--quiet']))"
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _field(done.stdout, "output_mismatches") == "0"


def _repeated_plans(rt):
    """A decode set prepared as one immutable plan step after step (its short form across the
    boundary), broken by a plan the runtime rejects, a plan of equal but other items, another
    set, and a restart; every result or error, then the state."""
    out: list = []

    def call(fn, *args):
        try:
            out.append(fn(*args))
        except CacheRuntimeError as error:
            out.append((type(error).__name__, str(error)))

    requests = [rt.open_request() for _ in range(3)]
    call(lambda: rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1, 2, 3)) for r in requests)))))
    decode = BatchPlan(tuple(BatchItem(r, append_previous_output=True) for r in requests))
    for _ in range(3):
        call(lambda: rt.execute_batch(rt.prepare_batch(decode)))
    held = [rt.prepare_batch(decode), rt.prepare_batch(decode)]  # two prepared at once, neither executed
    for batch in reversed(held):
        call(rt.cancel_batch, batch)
    equal = BatchPlan(tuple(BatchItem(r, append_previous_output=True) for r in requests))  # equal values, other objects
    call(lambda: rt.execute_batch(rt.prepare_batch(equal)))
    call(lambda: rt.execute_batch(rt.prepare_batch(decode)))  # the accepted items are now `equal`'s
    call(rt.close_request, requests[2])
    call(rt.prepare_batch, decode)  # a closed request: rejected, whatever form it crossed in
    two = BatchPlan(decode.items[:2], (Backup(rt.publish(requests[0], 0, 1)),))
    for _ in range(2):
        call(lambda: rt.execute_batch(rt.prepare_batch(two)))
    rt.restart()
    call(rt.prepare_batch, two)  # stale handles after the restart
    return [*out, rt.wait_completions(), rt.probe()]


def test_a_plan_prepared_again_crosses_short_and_everything_is_as_in_process():
    with in_process_and_across() as (local, process):
        assert _repeated_plans(process) == _repeated_plans(local)
        # Short: every prepare of the accepted plan's very items (decode's 2nd and 3rd steps, both held
        # batches, decode with a closed request, `two` again, `two` after the restart), none of `equal`
        # or of `decode` after it; and every completion (each of the accepted plan's own handles).
        assert (process.short["prepare_batch"], process.short["execute_batch"]) == (7, 8)


def test_a_spinning_client_warms_a_decode_step_s_code_while_it_waits_and_changes_nothing(monkeypatch):
    from cacheruntime.runtime.process import client as client_module

    monkeypatch.setattr(client_module, "WARM_ITEMS", 2)  # the decode set has 3 items: its sample is cut
    with in_process_and_across(spin_us=20_000) as (local, process):
        sizes = []
        warm = process._warm

        def counted():
            warm()
            sizes.append(len(process._warm_completion[1]))

        process._warm = counted  # type: ignore[method-assign]
        assert _repeated_plans(process) == _repeated_plans(local)
        assert sizes and set(sizes) <= {2}  # warmed while waiting for a short completion after the first, cut to 2
        assert (process.short["prepare_batch"], process.short["execute_batch"]) == (7, 8)
        assert process._warm_completion is None  # the restart dropped the old epoch's bytes


def test_a_warm_up_that_raises_leaves_the_call_to_its_outcome():
    with in_process_and_across(spin_us=20_000) as (local, process):
        plans = []
        for rt in (local, process):
            requests = [rt.open_request() for _ in range(2)]
            plans.append(BatchPlan(tuple(BatchItem(r, append_previous_output=True) for r in requests)))
            rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1, 2)) for r in requests))))
        for _ in range(2):
            assert process.execute_batch(process.prepare_batch(plans[1])) == local.execute_batch(local.prepare_batch(plans[0]))
        process._warm_completion = (b"C but not a completion", [])  # what no reply can leave: the warm-up raises
        assert process.execute_batch(process.prepare_batch(plans[1])) == local.execute_batch(local.prepare_batch(plans[0]))
        assert process.probe() == local.probe() and process.lost_cause == ""


def test_a_completion_of_a_plan_sent_whole_carries_the_handles_control_put_in_it():
    """A plan that crosses whole (a list of ids) after an equal copy of its handle, or a stale handle
    of its slot, crossed: control gets back the plan's own handle objects, as in-process."""
    with in_process_and_across() as (local, process):
        for rt in (local, process):
            request = rt.open_request()
            rt.execute_batch(rt.prepare_batch(BatchPlan([BatchItem(copy.copy(request), (1, 2))])))  # a copy crossed
            done = rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, [3]),))))
            assert done.items[0].request is request
            with pytest.raises(StaleHandle):
                rt.close_request(RequestRuntimeHandle("local", request.epoch, request.slot_id, request.generation - 1))
            done = rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, [4]),))))
            assert done.items[0].request is request


def test_the_runtime_process_closes_its_runtime_when_control_dies_with_a_reply_unread():
    from pathlib import Path as _Path

    client = ProcessGPURuntime("cacheruntime.runtime.factories:conformance")
    process = client._process
    client._link.send(wire.dumps_request("probe", (), {}, 0))  # its reply is never read
    time.sleep(0.2)
    client._link.close()  # as a dying control process closes it: the runtime process's next read is ECONNRESET
    client._link = None
    process.join(timeout=10)
    assert process.exitcode == 0  # through `close`, not an error exit
    assert not list(_Path(client._directory).glob("start-error-*"))
    client.close()


class _PlainPlan(BatchPlan):
    """A plan subclass that crosses as a plain `BatchPlan` (the runtime takes subclasses)."""

    def __reduce__(self):
        return (BatchPlan, (self.items, self.intents))


def _mutated_plans(rt):
    """Plans whose lists (which the runtime takes where the protocol says tuple) change between two
    prepares, and a plan subclass: every result or error, then the state."""
    out: list = []

    def call(fn):
        try:
            out.append(fn())
        except CacheRuntimeError as error:
            out.append((type(error).__name__, str(error)))

    request = rt.open_request()
    items = [BatchItem(request, (1, 2, 3))]
    listed = BatchPlan(items)
    call(lambda: rt.execute_batch(rt.prepare_batch(listed)))
    items[0] = BatchItem(request, (4, 5))
    call(lambda: rt.execute_batch(rt.prepare_batch(listed)))
    ids = [6, 7]
    by_list = BatchPlan((BatchItem(request, ids),))
    call(lambda: rt.execute_batch(rt.prepare_batch(by_list)))
    ids[:] = [-1]
    call(lambda: rt.execute_batch(rt.prepare_batch(by_list)))
    plain = _PlainPlan((BatchItem(request, (8,)),))
    for _ in range(2):
        call(lambda: rt.execute_batch(rt.prepare_batch(plain)))
    return [*out, rt.probe()]


def test_a_plan_whose_lists_change_in_place_and_a_plan_subclass_cross_whole_and_are_as_in_process():
    with in_process_and_across() as (local, process):
        assert _mutated_plans(process) == _mutated_plans(local)
        assert process.short == {}  # nothing was remembered, nothing crossed short


def test_a_short_prepare_that_meets_a_dead_process_says_prepare_batch_and_counts_no_short_message():
    process = ProcessGPURuntime("cacheruntime.runtime.factories:conformance")
    try:
        plan = BatchPlan((BatchItem(process.open_request(), (1, 2)),))
        process.execute_batch(process.prepare_batch(plan))
        os.kill(process.pid, signal.SIGKILL)
        process._process.join(5)
        with pytest.raises(RuntimeFault, match=r"^prepare_batch: the runtime process is gone"):
            process.prepare_batch(plan)  # the items remembered: it would cross short
        assert process.short["prepare_batch"] == 0
    finally:
        process.close()


def test_only_an_immutable_plan_is_remembered_and_a_completion_crosses_short_only_on_its_handles():
    requests = [RequestRuntimeHandle("local", 0, slot, 1) for slot in range(3)]
    items = tuple(BatchItem(r, (1,)) for r in requests)
    assert wire.immutable_items(BatchPlan(items)) is items
    extent = CacheExtentRef("local", 0, 3, (PageRun(0, 2),))
    assert wire.immutable_items(BatchPlan((BatchItem(requests[0], (), (extent,)),))) is not None
    for changeable in (
        type("Plan", (BatchPlan,), {})(items),  # not exactly a BatchPlan
        BatchPlan(list(items)),  # a list of items
        BatchPlan((BatchItem(requests[0], [1]),)),  # a list of ids
        BatchPlan((BatchItem(requests[0], (), [extent]),)),  # a list of extents
        BatchPlan((BatchItem(requests[0], (), (CacheExtentRef("local", 0, 3, [PageRun(0, 2)]),)),)),  # a list of runs
        BatchPlan((BatchItem(("local", 0, 0, 1), (1,)),)),  # a handle that is not one
    ):
        assert wire.immutable_items(changeable) is None, changeable

    def completion(handles, cls=ItemResult):
        return BatchCompletion(PreparedBatchHandle("local", 0, 4), tuple(cls(h, 9, 7) for h in handles), (), ())

    accepted = wire.requests_of(items)
    parts = wire.completion_on_plan(completion(requests), accepted)
    assert wire.completion_of_plan(parts, accepted) == completion(requests)
    equal = [RequestRuntimeHandle("local", 0, slot, 1) for slot in range(3)]
    assert wire.completion_on_plan(completion(equal), accepted) is None  # equal handles, not the plan's own
    assert wire.completion_on_plan(completion(requests[:2]), accepted) is None
    assert wire.completion_on_plan(completion(requests[::-1]), accepted) is None
    assert wire.completion_on_plan(completion(requests, type("Result", (ItemResult,), {})), accepted) is None
    assert wire.completion_on_plan(completion(requests), None) is None


def test_a_completion_carries_the_handles_control_put_in_its_plan():
    """A short completion is rebuilt around the remembered items' handles: only a batch prepared
    of those items may cross short, or control would get another plan's (equal) handle objects."""
    with in_process_and_across() as (local, process):
        for rt in (local, process):
            request = rt.open_request()
            remembered = BatchPlan((BatchItem(request, (1, 2)),))
            rt.execute_batch(rt.prepare_batch(remembered))
            copied = copy.copy(request)  # equal, another object
            done = rt.execute_batch(rt.prepare_batch(BatchPlan([BatchItem(copied, append_previous_output=True)])))  # a list: whole
            assert done.items[0].request is copied
            done = rt.execute_batch(rt.prepare_batch(remembered))
            assert done.items[0].request is request
        assert process.short == {"execute_batch": 2, "prepare_batch": 1}
