"""`ProcessGPURuntime`: the contract of `spec/protocol.md` with the whole physical domain in another process.

Control holds this client; the runtime process (`server.py`) holds a `LocalGPURuntime`
with everything physical: slots, ReqToToken, the allocator, both pools, streams, events
and the runner. The client imports no torch: what crosses is the protocol's frozen values,
one request message per boundary call and one reply (B1), counted in `messages`, with one
exception, counted in `unsent`: a `poll_completions` that the runtime process has said
must report nothing (below) is answered here, and only its count crosses, inside the next
message.

A poll without a message. The reply of a successful `execute_batch` says whether a poll
made now would report nothing and change nothing but the poll count (the server's
`poll_reports_nothing`: no transfer in flight, no completion unreported or held, the
machinery alive). Nothing in the runtime process can change that before the next message
(transfers start only in calls), so every poll until the client's next message is answered
`()` here (the process's exit sentinel checked first: a dead process is RuntimeLost at
the poll, as before), and the next message carries how many there were: the runtime
process makes those polls first, for real, so that B1's counts and everything else a later
call or `probe()` observes are what they would have been. In a decode loop with nothing in
flight this saves one round trip of three per step; a poll while transfers are in flight,
or after any call but `execute_batch`, still crosses, since only the runtime process can
see what finished.

A decode step in short form (`wire.py` says how): a `prepare_batch` of the very items of
the last immutable plan the runtime accepted crosses as its intents alone, and an
`execute_batch` completion of that plan's handles as its token columns; `short` counts both.

Transport: one Unix stream socket in a private directory (the runtime process connects to
the client's), each message its length and then its bytes (`link.py`, which says why not
`multiprocessing.connection`'s framing), request and reply in strict turn. Its descriptor is
polled together with the process's exit sentinel (below). ZeroMQ (REQ/REP over `ipc://`,
what SGLang runs between its processes) was the first transport: its I/O threads put two
thread hand-offs each way into every call, so one round trip cost 70-130 us on the H200 host
(docs/benchmarks.md, `processsplit`): three a step were more than the ITL target's whole
margin (3% of a 6.5 ms step, 195 us). It needs no package either.
Serialization: `wire.py` (pickle with a dispatch table of the records' constructors, a
decode step's plan and completion as columns; chosen by measurement: docs/process-runtime.md).

The client starts, supervises and stops the runtime process. It forks it from a fork
server that has torch and the runtime already imported (`multiprocessing`'s forkserver
with a preload), so a start or a restart after a crash costs a fork and the runtime's
construction, not an interpreter and torch's import; the fork server never touches a
device, so the new process may initialise CUDA. A process that cannot start (the factory
raises, the interpreter dies) is `RuntimeStartFailed` with the process's traceback.

Death of the runtime process is found directly, never by a timeout: every call waits on
the socket *and* the process's exit sentinel, so a SIGKILL mid-call ends the wait at once.
That is the spec's RuntimeLost (spec/protocol.md §4.15): the outstanding call and every
later one but `info` (answered from what control last saw) and `restart` raise
`RuntimeFault`. `restart()` then forks a new runtime process whose epoch the client
chooses, one past the last epoch it saw, and whose slot generations continue the ones it
saw (H2), so no handle of the dead process can be valid again (H1). A live runtime
restarts in place (it drains, §4.14); one whose device broke (a restart raises
`RuntimeFault`) is replaced by a new process, the only recovery for a broken CUDA context.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import select
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

from cacheruntime.protocol import (
    AbstractState,
    BatchCompletion,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    InvalidArgument,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    RuntimeFault,
    RuntimeInfo,
    TierIntent,
    TransferCompletion,
    TransferKind,
    TransferTicket,
)
from cacheruntime.runtime.process import wire
from cacheruntime.runtime.process.link import Link

#: How often a client waiting for an `execute_batch` warms a step's code, on at most how many items (`_warm`).
WARM_EVERY_S, WARM_ITEMS = 100e-6, 16
#: Imported by the fork server once, so every runtime process starts with them loaded.
PRELOAD = ["cacheruntime.runtime.process.server"]


class RuntimeStartFailed(RuntimeFault):
    """The runtime process could not start: its factory raised or the process died before serving."""

    fix = "read the runtime process's error above; check the factory and its options (they run in the runtime process)"


class ProcessGPURuntime:
    """A GPU cache runtime in a child process, driven over a Unix socket; `factory` builds it there.

    `factory` is "module:function" returning a `LocalGPURuntime`, called in the runtime
    process with `options`; both must be importable and picklable without torch here.
    """

    def __init__(self, factory: str = "cacheruntime.runtime.factories:local", *, start_timeout_s: float = 600.0, spin_us: float = 0.0, **options: Any):
        self.factory = factory
        self.options = options
        #: How long each side busy-polls the socket for the other's next message before it sleeps
        #: in the kernel (0: it sleeps at once). See `_wait_reply`.
        self.spin_s = spin_us / 1e6
        #: How long a new runtime process may take to serve its first call (the runtime's
        #: construction: a device's context, a model's weights) before it counts as hung.
        self.start_timeout_s = start_timeout_s
        #: Request messages sent, per operation: one per boundary call (B1), never per token.
        self.messages: Counter[str] = Counter()
        #: Boundary calls answered without a message, per operation (only `poll_completions`).
        self.unsent: Counter[str] = Counter()
        #: Messages that crossed in short form, per operation: a `prepare_batch` of the accepted
        #: plan's items (its intents only), an `execute_batch` completion of them (its tokens only).
        self.short: Counter[str] = Counter()
        self._quiet = False  # the runtime process said a poll now reports nothing (execute_batch's reply)
        #: The items of the last immutable plan the runtime accepted (`wire.PREPARE_REMEMBER`), and
        #: their handles: the runtime process remembers the same, so a plan with these very items
        #: crosses as its intents alone, and a completion of them as its token columns.
        self._accepted: tuple[BatchItem, ...] | None = None
        self._accepted_requests: list[RequestRuntimeHandle] | None = None
        self._unsent_polls = 0  # polls answered here since the last message: the next one carries them
        #: The last step's laid-out completion (with the handles it was rebuilt around) and prepare reply (`_warm`).
        self._warm_completion: tuple[bytes, list[RequestRuntimeHandle]] | None = None
        self._warm_handle: bytes | None = None
        self.lost_cause = ""  # why the runtime process is gone; "" while it serves
        self._lock = threading.Lock()  # one call at a time crosses the link; others wait their turn
        self._directory = tempfile.mkdtemp(prefix="cacheruntime-process-")
        # The socket directory goes with the client even if it is never closed (a test, a suite
        # that drops its runtimes): at collection or at interpreter exit, whichever comes first.
        self._remove_directory = weakref.finalize(self, shutil.rmtree, self._directory, True)
        self._link: Link | None = None
        self._process: Any = None
        #: Waits on the socket and the process's exit sentinel together; built once per process, not per call.
        self._poller = select.poll()
        self._spawned = 0
        #: The generation each slot's next open would get, as far as control has seen (a new
        #: process continues from them: H2 holds across processes).
        self._generations: dict[int, int] = {}
        try:
            self._info = self._spawn(0)
        except BaseException:
            self._release()
            raise

    # -- the runtime process ------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The runtime process's id (None once stopped): what a supervisor, or a crash test, signals."""
        return None if self._process is None else self._process.pid

    def _spawn(self, epoch: int) -> RuntimeInfo:
        """Fork a runtime process at `epoch` (continuing the generations seen), wait until it serves."""
        self._spawned += 1
        endpoint = os.path.join(self._directory, f"runtime-{self._spawned}")
        error_file = os.path.join(self._directory, f"start-error-{self._spawned}.txt")
        generations = tuple(self._generations.get(slot, 0) for slot in range(max(self._generations, default=-1) + 1))
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        from cacheruntime.runtime.process import child

        process = context.Process(
            target=child.main,
            args=(endpoint, self.factory, self.options, epoch, generations, error_file, self.spin_s),
            name="cacheruntime-runtime",
            daemon=True,
        )
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(endpoint)
            listener.listen(1)
            try:
                process.start()
            except (OSError, pickle.PicklingError, TypeError, AttributeError) as error:
                raise RuntimeStartFailed(f"the runtime process did not start: {error}") from error
            self._process = process
            self.lost_cause = ""
            try:
                self._link = self._accept(listener)
                info = self._call("info", timeout_s=self.start_timeout_s)
            except TimeoutError as error:
                self._stop()
                raise RuntimeStartFailed(f"the runtime process ({self.factory}) did not serve within {self.start_timeout_s} s; it was killed") from error
            except RuntimeFault as error:
                why = Path(error_file).read_text().strip() if os.path.exists(error_file) else self.lost_cause
                raise RuntimeStartFailed(f"the runtime process ({self.factory}) did not start: {why}") from error
        finally:
            listener.close()
        return info  # type: ignore[no-any-return]

    def _accept(self, listener: socket.socket) -> Link:
        """The new process's connection (it connects first thing), or its death (RuntimeFault), or TimeoutError."""
        waiting = select.poll()
        waiting.register(listener, select.POLLIN)
        waiting.register(self._process.sentinel, select.POLLIN)
        if not waiting.poll(self.start_timeout_s * 1000):
            raise TimeoutError("connect")
        listener.setblocking(False)
        try:
            link, _ = listener.accept()
        except BlockingIOError:  # not a connection: the process ended before it connected
            raise self._died("start") from None
        connection = Link(link)
        self._poller = select.poll()
        self._poller.register(connection.fileno(), select.POLLIN)
        self._poller.register(self._process.sentinel, select.POLLIN)
        return connection

    def _lose(self, cause: str) -> None:
        """RuntimeLost: the runtime process is gone; drop the socket, reap the process."""
        self.lost_cause = cause
        self._quiet, self._unsent_polls = False, 0  # polls of a lost epoch: nothing can count them now
        self._accepted = self._accepted_requests = None  # a new process remembers no plan
        self._warm_completion = self._warm_handle = None
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._process is not None:
            self._process.join(timeout=1.0)
            self._process = None

    def _stop(self) -> None:
        """End the runtime process without a word (it is broken or must be replaced)."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        self._lose(self.lost_cause or "stopped by the client")

    def _call(self, operation: str, *args: Any, timeout_s: float | None = None, sent_as: str = "", remember: Any = None, **kwargs: Any) -> Any:
        """One boundary call: one request message, then the reply or the process's death, whichever comes first
        (`timeout_s`, for a process's first call only: TimeoutError if neither came by then).

        `sent_as`: the request's name on the wire if not `operation` (a short or remembering
        `prepare_batch`); `remember`: the items to remember if the reply is OK (`PREPARE_REMEMBER`)."""
        if self._link is None:
            raise RuntimeFault(f"{operation}: the runtime process is gone ({self.lost_cause})")
        try:
            data = wire.dumps_request(sent_as or operation, args, kwargs, self._unsent_polls)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise InvalidArgument(f"{operation}: an argument cannot cross to the runtime process: {error}") from error
        try:
            self._link.send(data)
            self.messages[operation] += 1
            if sent_as == wire.PREPARE_AGAIN:
                self.short[operation] += 1
            self._quiet, self._unsent_polls = False, 0
            ready = self._wait_reply(timeout_s, operation == "execute_batch")
            if not ready:
                raise TimeoutError(operation)
            if self._link.fileno() not in {fd for fd, _ in ready}:
                raise self._died(operation)
            data = self._link.recv()
            reply = wire.loads_reply(data)
        except (TimeoutError, RuntimeFault):  # TimeoutError is an OSError: not a closed socket
            raise
        except (EOFError, OSError):  # the process's end of the socket closed: it died
            raise self._died(operation) from None
        except BaseException:  # interrupted (Ctrl-C) with the call's outcome unknown: the runtime is lost to control
            self.lost_cause = f"{operation} was interrupted; whether it ran is unknown"
            self._stop()
            raise
        self._quiet = wire.quiet(reply)
        if remember is not None and reply[0] == wire.OK:  # as the runtime process did on sending it
            self._accepted, self._accepted_requests = remember, wire.requests_of(remember)
        if wire.laid_out(data):  # a decode step's: what `_warm` runs through again while the next step computes
            if reply[0] == wire.ON_PLAN:
                self._warm_completion = (data, self._accepted_requests)  # type: ignore[assignment]
            else:
                self._warm_handle = data
        if reply[0] == wire.ON_PLAN:
            self.short[operation] += 1
            return wire.completion_of_plan(reply[1], self._accepted_requests)  # type: ignore[arg-type]
        return wire.raise_reply(reply)

    def _wait_reply(self, timeout_s: float | None, warm: bool = False) -> list[tuple[int, int]]:
        """The reply's (or the process's death's) poll events; none if `timeout_s` passed first.

        With `spin_s`, it first busy-polls that long: a thread that sleeps in the kernel wakes up
        on a core that may have gone into a deep idle state, and a serving engine's processes
        avoid that wait the same way (SGLang's scheduler polls its sockets without blocking
        while it has work; vLLM's shared-memory queue spins before it sleeps). With `warm` (an
        `execute_batch`), it runs `_warm` every `WARM_EVERY_S` meanwhile; a warm-up that raises
        (it cannot on bytes its side decoded before) ends the warming, never the call."""
        if self.spin_s:
            now = time.perf_counter()
            deadline, due = now + self.spin_s, now
            warming = warm and self._warm_completion is not None
            while now < deadline:
                ready = self._poller.poll(0)
                if ready:
                    return ready
                if warming and now >= due:
                    try:
                        self._warm()
                    except Exception:
                        warming = False
                    due = time.perf_counter() + WARM_EVERY_S
                now = time.perf_counter()
        return self._poller.poll(None if timeout_s is None else timeout_s * 1000)

    def _warm(self) -> None:
        """Run control's part of a decode step's messages on the last step's bytes, throwing the values away.

        After a wait of milliseconds the code that runs next runs cold, two to four times slower
        than back to back, while the GPU idles; run every 100 us of the wait, it runs as fast as
        back to back (`benchmarks/diagnostics/afterspin.py`, docs/process-runtime.md). The calls
        are pure (a laid-out message holds no request handle: no handle table changes). A reply
        landing mid-warm-up waits for it, so a larger completion is cut to `WARM_ITEMS` items once."""
        completion, requests = self._warm_completion  # type: ignore[misc]
        if len(requests) > WARM_ITEMS:
            batch, counts, tokens, published, tickets = wire.loads_reply(completion)[1]
            cut = [batch, counts[:WARM_ITEMS], tokens[:WARM_ITEMS], published, tickets]
            completion, requests = wire.dumps_reply((wire.ON_PLAN, cut, True)), requests[:WARM_ITEMS]
            self._warm_completion = (completion, requests)
        wire.completion_of_plan(wire.loads_reply(completion)[1], requests)
        if self._warm_handle is not None:
            wire.loads_reply(self._warm_handle)
        wire.dumps_request(wire.PREPARE_AGAIN, ((),), {}, 1)

    def _died(self, operation: str) -> RuntimeFault:
        """RuntimeLost: the runtime process ended; reap it and say so."""
        self._process.join(timeout=1.0)
        pid, code = self._process.pid, self._process.exitcode
        self._lose(f"the runtime process {pid} ended with exit code {code}")
        return RuntimeFault(f"{operation}: the runtime process is gone ({self.lost_cause})")

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._call(operation, *args, **kwargs)

    def close(self) -> None:
        """Drain and stop the runtime process (it closes its runtime first); the client is unusable afterwards.
        Closing twice is closing once."""
        with self._lock:
            if self.lost_cause == "closed":
                return
            if self._link is not None:
                try:
                    self._call("close")
                except RuntimeFault:
                    pass
            if self._process is not None:
                self._process.join(timeout=10.0)
            self._release()

    def _release(self) -> None:
        """Stop the runtime process if any, and give back the socket context and the socket directory."""
        self._stop()
        self.lost_cause = "closed"
        self._remove_directory()

    # -- the interface ------------------------------------------------------------------

    def info(self) -> RuntimeInfo:
        """Identity, epoch, sizes and claims: as the runtime process last said (it answers while lost too)."""
        return self._info

    def open_request(self) -> RequestRuntimeHandle:
        request: RequestRuntimeHandle = self._forward("open_request")
        self._generations[request.slot_id] = request.generation + 1  # closing or a restart moves past it
        return request

    def close_request(self, request: RequestRuntimeHandle) -> None:
        self._forward("close_request", request)

    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        with self._lock:
            if self._accepted is not None and type(plan) is BatchPlan and plan.items is self._accepted:
                return self._call("prepare_batch", plan.intents, sent_as=wire.PREPARE_AGAIN)  # type: ignore[no-any-return]
            items = wire.immutable_items(plan)
            if items is None:  # a plan that could change in place: crosses whole, remembered by neither side
                return self._call("prepare_batch", plan)  # type: ignore[no-any-return]
            return self._call("prepare_batch", plan, sent_as=wire.PREPARE_REMEMBER, remember=items)  # type: ignore[no-any-return]

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        return self._forward("execute_batch", batch)  # type: ignore[no-any-return]

    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        self._forward("cancel_batch", batch)

    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        return self._forward("publish", request, first_page, page_count)  # type: ignore[no-any-return]

    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        return self._forward("split", extent, at_page)  # type: ignore[no-any-return]

    def retain(self, extent: CacheExtentRef) -> None:
        self._forward("retain", extent)

    def release(self, extent: CacheExtentRef) -> None:
        self._forward("release", extent)

    def submit(self, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
        return self._forward("submit", intents)  # type: ignore[no-any-return]

    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        with self._lock:
            if self._quiet and self._process is not None and not select.select([self._process.sentinel], [], [], 0)[0]:
                self._unsent_polls += 1
                self.unsent["poll_completions"] += 1
                return ()
            return self._call("poll_completions")  # type: ignore[no-any-return]

    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        return self._forward("wait_completions")  # type: ignore[no-any-return]

    def restart(self) -> RuntimeInfo:
        """A live runtime restarts in place; a lost one (or one whose restart fails) is replaced by a new
        process at one past the last epoch control saw. Every old handle is stale either way."""
        with self._lock:
            self._warm_completion = self._warm_handle = None  # an old epoch's bytes: nothing to keep them for
            if self._link is not None:
                try:
                    self._info = self._call("restart")
                    return self._info
                except RuntimeFault as error:
                    self.lost_cause = str(error)
            self._stop()
            self._info = self._spawn(self._info.epoch + 1)
            return self._info

    # -- the runtime's test-only surfaces, over the link ---------------------------------

    def probe(self) -> AbstractState:
        return self._forward("probe")  # type: ignore[no-any-return]

    def set_transfer_delay(self, seconds: float, kind: TransferKind | None = None) -> None:
        self._forward("set_transfer_delay", seconds, kind)

    def set_schedule_seed(self, seed: int) -> None:
        self._forward("set_schedule_seed", seed)

    def inject_fault(self, kind: Any, nth: int, *, site: str | None = None) -> None:
        self._forward("inject_fault", kind, nth, site=site)

    def reference_next_token(self, token_ids: list[int]) -> int:
        """The runner's next token recomputed without cache (the main job's output check; not a boundary call)."""
        return self._forward("reference_next_token", list(token_ids))  # type: ignore[no-any-return]
