"""The runtime process of `ProcessGPURuntime`: a `LocalGPURuntime` that serves one client over a Unix socket.

The whole physical domain lives here (slots, ReqToToken, allocator, pools, streams, the
runner): the client only ever sends one request message per boundary call and gets one
reply, except for polls it answered itself because `execute_batch`'s reply said a poll
would report nothing (`client.py`): the next request carries how many, and they run here
first. Typed errors travel back as they were raised (`wire.error_reply`); anything else
(a bug, a test knob's `ValueError`) by its type and message, and the process keeps serving.
`close` drains the runtime and ends the process.

Imported in the runtime process only (and preloaded by the fork server, `client.py`), never
by control: it imports torch.
"""

from __future__ import annotations

import gc
import importlib
import select
import socket
import time
from typing import Any

from cacheruntime.protocol import BatchItem, BatchPlan, PreparedBatchHandle, RequestRuntimeHandle
from cacheruntime.recording import BOUNDARY_OPERATIONS
from cacheruntime.runtime.local import LocalGPURuntime
from cacheruntime.runtime.process import wire
from cacheruntime.runtime.process.link import Link

#: What control may ask of the runtime process: the interface, and the test-only surfaces the
#: runtime claims (INTROSPECTION, DELAY_KNOB, SCHEDULE_SEED, FAULT_INJECTION) with the main job's
#: output check. Nothing else on the runtime object is reachable over the link.
OPERATIONS = frozenset(BOUNDARY_OPERATIONS) | {"probe", "set_transfer_delay", "set_schedule_seed", "inject_fault", "reference_next_token"}


def build(factory: str, options: dict[str, Any]) -> LocalGPURuntime:
    """The runtime `factory` ("module:function") makes with `options`."""
    module, _, name = factory.partition(":")
    runtime = getattr(importlib.import_module(module), name)(**options)
    if not isinstance(runtime, LocalGPURuntime):
        raise TypeError(f"{factory} made a {type(runtime).__name__}, not a LocalGPURuntime")
    return runtime


def poll_reports_nothing(runtime: LocalGPURuntime) -> bool:
    """Whether `poll_completions` would now report nothing and change nothing but its count and
    the device layer's pump flag, and would still until the next call: no transfer in flight
    (none finishes meanwhile, none starts but in a call), none completed and unreported or held
    by the reporting choice, and the machinery alive (a poll would not raise RuntimeFault). Its
    `pump_idle` then finds no queued backup piece to issue (a queued piece is a transfer in flight)."""
    ledger = runtime.ledger
    state = ledger.state
    return not (state.transfers or state.unreported or ledger.held or state.lost) and runtime.device_layer.alive()


def receive(link: Link, poller: select.poll, spin_s: float) -> bytes:
    """The next request, busy-polling for it `spin_s` before sleeping (the client's `_wait_reply` says why)."""
    if spin_s:
        deadline = time.perf_counter() + spin_s
        while not poller.poll(0) and time.perf_counter() < deadline:
            pass
    return link.recv()


def serve(endpoint: str, factory: str, options: dict[str, Any], epoch: int, generations: tuple[int, ...], spin_s: float = 0.0) -> None:
    """Connect to the client's socket at `endpoint`, build the runtime (continuing at `epoch` and
    `generations` when `epoch` > 0), then answer requests until `close` (or the client is gone),
    busy-polling for each `spin_s` before sleeping."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(endpoint)  # first: the client waits for it, then for the reply to its first call
    link = Link(sock)
    poller = select.poll()
    poller.register(link.fileno(), select.POLLIN)
    runtime = build(factory, options)
    if epoch or any(generations):
        runtime.ledger.continue_lost(epoch, list(generations) + [0] * (runtime.max_requests - len(generations)))
    # Started: what exists now (torch's modules, the runner, pools and ledger as built) lives as
    # long as the process, so it moves to the collector's permanent generation, as a serving engine
    # does after start-up (vLLM's `gc.freeze()`; the bench's `steady_gc` does it for the control
    # process). Otherwise each full collection walks it all inside whatever call allocated last:
    # at B=256 that was 1.2 ms of a 1.45 ms plan decode here (250 us with the collector held off).
    gc.collect()
    gc.freeze()
    accepted: tuple[BatchItem, ...] | None = None  # the items both sides remember (`wire.PREPARE_REMEMBER`)
    requests: list[RequestRuntimeHandle] | None = None  # their handles, the very objects
    #: The batches prepared of those very items (remembering or again) and not yet executed or
    #: cancelled: only their completions cross short, since the client rebuilds a short one around
    #: the handles of the items it remembers, which are then the handles control put in the plan.
    of_remembered: set[PreparedBatchHandle] = set()
    try:
        while True:
            operation, args, kwargs, unsent_polls = wire.loads_request(receive(link, poller, spin_s))
            for _ in range(unsent_polls):  # each reports nothing (poll_reports_nothing held): their counts and
                runtime.poll_completions()  # their one effect, `pump_idle`'s flag, as if made in their turn
            if operation == "close":
                runtime.close()
                link.send(wire.dumps_reply((wire.OK, None)))
                return
            remember, again = operation == wire.PREPARE_REMEMBER, operation == wire.PREPARE_AGAIN
            if remember:
                operation = "prepare_batch"
            elif again:  # the client's plan has the remembered plan's very items
                operation, args = "prepare_batch", (BatchPlan(accepted, *args),)  # type: ignore[arg-type]
            try:
                if operation not in OPERATIONS:
                    raise AttributeError(f"the runtime process serves no operation {operation!r}")
                value = getattr(runtime, operation)(*args, **kwargs)
                reply: tuple[Any, ...] = (wire.OK, value)
                if remember:  # accepted: the client remembers the same items on this reply
                    accepted = args[0].items
                    requests = wire.requests_of(accepted)
                    of_remembered = {value}
                elif again:
                    of_remembered.add(value)
                elif operation == "execute_batch":
                    parts = wire.completion_on_plan(value, requests) if args[0] in of_remembered else None
                    of_remembered.discard(args[0])
                    reply = (wire.OK if parts is None else wire.ON_PLAN, value if parts is None else parts, poll_reports_nothing(runtime))
                elif operation == "cancel_batch":
                    of_remembered.discard(args[0])
                elif operation == "restart":
                    of_remembered.clear()
            except Exception as error:
                reply = wire.error_reply(error)
            link.send(wire.dumps_reply(reply))
    except (EOFError, OSError):  # the client's end closed (ECONNRESET if it died with a reply unread): nobody is left to serve
        runtime.close()
    finally:
        link.close()
