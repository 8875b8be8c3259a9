"""`LocalGPURuntime`: the contract of `spec/protocol.md` on real KV memory, in the caller's process.

The runtime owns request slots with generations, the ReqToToken table (a device int32
tensor `[max_requests, max_request_tokens]` of token locations that attention reads), the
page allocator with its device and host free lists, the page-name table (logical page ->
device and/or host physical page), the KV pools (`pools.KVMemory`), a compute, an H2D and a
D2H stream with events (`streams`), and a model runner (`runner`). Control only ever gets
the frozen values of `cacheruntime.protocol` (B2).

Every call first runs its bookkeeping (`state.State`) on a copy and commits it only when
every precondition held, in the reference model's check order; only then does it touch
the device (write ReqToToken, start transfers, run compute). A raised `CacheRuntimeError`
therefore leaves the runtime exactly as it was.

Ordering (the reason the runtime exists, invariants O1-O3):
- restores start on the H2D stream inside `prepare_batch` (and `submit`); a restore whose
  host source is still being filled waits for that backup's event;
- `execute_batch` makes the compute stream wait for the KV_READY event of every restore of
  a page it reads (O1), then runs the batch, then records a compute event;
- a backup's D2H waits for the latest compute event before it reads device pages (O2);
- a physical page goes back to its free list only once every transfer that reads or writes
  it has been retired (deferred free, O3); compute never outlives `execute_batch`, which
  returns only with the batch's outputs on the host.

A transfer is *retired* (its copies become valid, deferred frees it blocks run, its
completion is queued for reporting) at the points the model completes it: when compute
needs it (`execute_batch`), when `poll_completions` finds its event done, or at
`wait_completions`. So the runtime's state differs from the model's only in when the
environment completes transfers, which `poll_completions` tells control.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import torch

from cacheruntime import pageruns
from cacheruntime.protocol import (
    AbstractState,
    AlreadyExecuted,
    Backup,
    BatchCompletion,
    BatchDependency,
    BatchPlan,
    BatchView,
    CacheExtentRef,
    Capability,
    Close,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    ExtentView,
    ForeignRuntime,
    Intent,
    InvalidPageRun,
    InvalidPlan,
    ItemResult,
    NoL2,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfOrder,
    OutOfPages,
    OutOfSlots,
    PageView,
    PoolView,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestBusy,
    RequestRuntimeHandle,
    Restore,
    RowFull,
    RuntimeInfo,
    SlotView,
    StaleHandle,
    Tier,
    TierIntent,
    TransferCompletion,
    TransferKind,
    TransferTicket,
    TransferView,
    UnknownHandle,
    Unsupported,
    WouldLoseData,
)
from cacheruntime.runtime.pools import KVMemory
from cacheruntime.runtime.runner import ComputeItem, DecoderConfig, make_runner
from cacheruntime.runtime.state import Batch, Copy, Extent, Page, Slot, State, Transfer, fresh_state
from cacheruntime.runtime.streams import Event, Result, Stream, make_stream, to_device


@attrs.frozen
class Launched:
    """A transfer issued to its stream: the event after its copy, and the copy's result."""

    event: Event
    result: Result


def operation(method: Callable) -> Callable:
    """Run a boundary call on a copy of the bookkeeping; keep it only if the call succeeds.

    The method commits (`self._commit()`) once every precondition held and before it
    touches the device; a method without device work is committed on return. An error
    before the commit rolls the bookkeeping back, so nothing changed.
    """

    @functools.wraps(method)
    def call(self: LocalGPURuntime, *args: Any, **kwargs: Any) -> Any:
        saved = self._state
        self._state = saved.clone()
        self._operation, self._committed, self._to_launch = method.__name__, False, []
        try:
            result = method(self, *args, **kwargs)
        except BaseException:
            if not self._committed:
                self._rollback(saved)
            raise
        if not self._committed:
            self._commit()
        return result

    return call


class LocalGPURuntime:
    """A GPU cache runtime in the caller's process, on torch, for `device="cpu"` or `"cuda"`.

    The module docstring says how it orders work. Guards and ordering steps are small
    methods so that the conformance suite can break them one at a time (mutants); the
    bookkeeping they change lives in `self._state` (`state.State`). Override one of these:

    - `_check_origin(what, runtime_id, epoch)`: ForeignRuntime, stale or unknown epoch (H1)
    - `_check_generation(request, slot)`: a request handle's generation against its slot (H1, H3)
    - `_check_extent_issued(extent, record)`: released/split refs are stale, page runs match (H1, R4)
    - `_check_not_busy(request, in_batch)`: close of a request in a prepared batch (RequestBusy)
    - `_check_execute_once(batch, record)`: executed or cancelled batches (O4)
    - `_check_execute_order(batch, record)`: an earlier prepared batch shares a request (OutOfOrder)
    - `_check_cancel_order(batch, record)`: a later prepared batch shares a request (BatchDependency)
    - `_check_demote_unmapped(record)`: demoting pages a live row maps (ExtentInUse)
    - `_require_free(tier, needed)`: OutOfPages before anything is allocated
    - `_take_phys(tier)`: allocation from a free list
    - `_free_phys(tier, phys)`: deferred free while a transfer touches the page (O3)
    - `_drop_holder(name)`: a page name loses a holder; at 0 its copies are freed (R3, R4)
    - `_release_ref(generation)`: an extent's reference count goes down; at 0 it ends (R3, R4)
    - `_retire_slot(slot)`: a closing slot's generation grows (H2)
    - `_wait_kv_ready(launched)`: compute waits for the restores it reads (O1)
    - `_wait_compute(stream)`: a backup's D2H waits for the compute event (O2)
    - `_wait_transfer_deps(stream, launched)`: a restore waits for the backup filling its source
    - `_rollback(saved)`: a failed call puts the saved state back (atomicity)
    """

    def __init__(
        self,
        *,
        runtime_id: str = "local",
        device: str = "cpu",
        page_size: int = 16,
        max_requests: int = 8,
        max_request_tokens: int = 512,
        l1_pages: int = 64,
        l2_pages: int = 256,
        runner: str = "tiny",
        config: DecoderConfig | None = None,
        seed: int = 0,
    ):
        if page_size < 1 or max_requests < 1 or l1_pages < 1 or l2_pages < 0 or max_request_tokens < page_size:
            raise ValueError("page_size, max_requests, l1_pages >= 1, l2_pages >= 0, max_request_tokens >= page_size")
        self.runtime_id = runtime_id
        self.page_size = page_size
        self.max_requests = max_requests
        self.max_request_tokens = max_request_tokens
        self.l1_pages = l1_pages
        self.l2_pages = l2_pages
        self.device = torch.device(device)
        config = config or DecoderConfig()
        self._runner = make_runner(runner, config, max_request_tokens, self.device, seed)
        self._memory = KVMemory(
            device=self.device,
            l1_pages=l1_pages,
            l2_pages=l2_pages,
            page_size=page_size,
            layers=config.layers,
            heads=config.heads,
            head_dim=config.head_dim,
            dtype=config.torch_dtype,
        )
        self._table = torch.zeros(max_requests, max_request_tokens, dtype=torch.int32, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # weights and pools were filled on the default stream
        self._compute: Stream = make_stream("compute", self.device)
        self._h2d: Stream = make_stream("h2d", self.device)
        self._d2h: Stream = make_stream("d2h", self.device)
        self._finalizer = weakref.finalize(self, _close_streams, (self._compute, self._h2d, self._d2h))
        self._launched: dict[int, Launched] = {}
        self._compute_event: Event | None = None
        self._delay = 0.0
        empty = (0,) * page_size
        believed = {Tier.L1: [empty] * l1_pages, Tier.L2: [empty] * l2_pages}
        self._state: State = fresh_state(0, [0] * max_requests, believed, 1)
        self._operation, self._committed, self._to_launch = "", True, []

    # ---------------------------------------------------------------------------------
    # Info, test knobs, reference compute
    # ---------------------------------------------------------------------------------

    @property
    def capabilities(self) -> frozenset[Capability]:
        caps = {Capability.ASYNC_TRANSFERS, Capability.INTROSPECTION, Capability.RESTART, Capability.DELAY_KNOB}
        if self.l2_pages:
            caps.add(Capability.L2)
        if self._runner.tagged:
            caps.add(Capability.TAGGED_COMPUTE)
        return frozenset(caps)

    def _info(self) -> RuntimeInfo:
        return RuntimeInfo(
            runtime_id=self.runtime_id,
            epoch=self._state.epoch,
            page_size=self.page_size,
            max_requests=self.max_requests,
            max_request_tokens=self.max_request_tokens,
            l1_pages=self.l1_pages,
            l2_pages=self.l2_pages,
            capabilities=self.capabilities,
            page_bytes=self._memory.page_bytes,
        )

    @operation
    def info(self) -> RuntimeInfo:
        """Identity, epoch, sizes, capabilities and the bytes of one KV page."""
        return self._info()

    def set_transfer_delay(self, seconds: float) -> None:
        """Test-only: hold the transfer stream `seconds` before every H2D and D2H copy (DELAY_KNOB)."""
        if seconds < 0:
            raise ValueError("the transfer delay cannot be negative")
        self._delay = float(seconds)

    def reference_next_token(self, token_ids: list[int]) -> int:
        """The tiny runner's next token for `token_ids`, recomputed without any cache (for D1)."""
        if self._runner.tagged:
            raise Unsupported("the tagging runner has no token model to recompute")
        return self._runner.reference(list(token_ids))

    def close(self) -> None:
        """Drain the streams and stop their workers; the runtime is unusable afterwards."""
        self._finalizer()

    # ---------------------------------------------------------------------------------
    # Request lifecycle
    # ---------------------------------------------------------------------------------

    @operation
    def open_request(self) -> RequestRuntimeHandle:
        """Take the lowest free slot, at its current generation, with an empty row."""
        for slot_id, slot in enumerate(self._state.slots):
            if not slot.live:
                slot.live = True
                slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0
                slot.produced = slot.appended = 0
                slot.last_output = None
                return RequestRuntimeHandle(self.runtime_id, self._state.epoch, slot_id, slot.generation)
        raise OutOfSlots(f"all {self.max_requests} request slots are live")

    @operation
    def close_request(self, request: RequestRuntimeHandle) -> None:
        """Retire the handle now; the row's pages go with their last holder (deferred if in flight)."""
        self._close(request, in_batch=None)

    # ---------------------------------------------------------------------------------
    # Two-phase batches
    # ---------------------------------------------------------------------------------

    @operation
    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        """Validate the plan, allocate and map pages, write ReqToToken, start the plan's restores."""
        st = self._state
        if not isinstance(plan, BatchPlan):
            raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
        if not plan.items:
            raise InvalidPlan("a plan needs at least one item")
        for item in plan.items:
            self._slot(item.request)
            for extent in item.attach:
                self._extent(extent)
        for intent in plan.intents:
            self._check_intent_handles(intent)
        slots = [item.request.slot_id for item in plan.items]
        if len(set(slots)) != len(slots):
            raise InvalidPlan("a request appears twice in the plan")
        restoring: set[int] = set()
        for intent in plan.intents:
            if isinstance(intent, Restore):
                restoring.update(self._restore_pages(intent.extent))
        start_tokens, start_pages, end_tokens = {}, {}, {}
        for item in plan.items:
            slot = st.slots[item.request.slot_id]
            if item.new_tokens < 1:
                raise InvalidPlan(f"slot {item.request.slot_id}: an item must compute at least one token")
            if item.attach and slot.reserved_tokens:
                raise InvalidPlan(f"slot {item.request.slot_id}: attach is only allowed on an empty row")
            if item.append_previous_output and slot.produced <= slot.appended:
                raise RequestBusy(f"slot {item.request.slot_id}: no previous output to append")
            attached = [p for extent in item.attach for p in st.extents[extent.generation].pages]
            for page in attached:
                if Tier.L1 not in st.pages[page].copies and page not in restoring:
                    raise NotResident(f"page {page} of an attached extent has no device copy and no restore")
            end = slot.reserved_tokens + len(attached) * self.page_size + item.new_tokens
            if end > self.max_request_tokens:
                raise RowFull(f"slot {item.request.slot_id}: {end} tokens > max_request_tokens {self.max_request_tokens}")
            start_tokens[item.request.slot_id] = slot.reserved_tokens
            start_pages[item.request.slot_id] = len(slot.pages)
            end_tokens[item.request.slot_id] = end
        need = len(restoring) + sum(
            -(-end_tokens[s] // self.page_size) - start_pages[s] - sum(e.page_count for e in item.attach)
            for s, item in zip(slots, plan.items)
        )
        self._require_free(Tier.L1, need)
        for intent in plan.intents:
            if isinstance(intent, Restore):
                self._start_transfer(TransferKind.RESTORE, intent.extent.generation, self._restore_pages(intent.extent))
        rows = []
        for item in plan.items:
            slot_id = item.request.slot_id
            slot = st.slots[slot_id]
            for extent in item.attach:
                for page in st.extents[extent.generation].pages:
                    st.pages[page].holders += 1
                    slot.pages.append(page)
            while len(slot.pages) * self.page_size < end_tokens[slot_id]:
                slot.pages.append(self._new_page())
            slot.reserved_tokens = end_tokens[slot_id]
            slot.produced += 1
            slot.appended += int(item.append_previous_output)
            mapped = slot.pages[start_pages[slot_id] :]
            rows.append((slot_id, start_pages[slot_id] * self.page_size, [st.pages[p].copies[Tier.L1].phys for p in mapped]))
        batch_id = st.next_batch
        st.batches[batch_id] = Batch(plan, "prepared", end_tokens, start_tokens, start_pages)
        st.next_batch += 1
        self._commit()
        self._write_req_to_token(rows)
        self._launch_started()
        return PreparedBatchHandle(self.runtime_id, st.epoch, batch_id)

    @operation
    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """Wait for the restores compute reads (O1), compute, apply the intents, return outputs."""
        st = self._state
        record = self._batch(batch)
        self._check_execute_once(batch, record)
        self._check_execute_order(batch, record)
        ready: list[int] = []
        items: list[ComputeItem] = []
        for item in record.plan.items:
            slot = st.slots[item.request.slot_id]
            end = record.end_tokens[item.request.slot_id]
            start = end - item.new_tokens
            ready += self._await_restores(slot.pages[: -(-end // self.page_size)])
            tags = []
            for position in range(start, end):
                page = st.pages[slot.pages[position // self.page_size]]
                offset = position % self.page_size
                page.versions[offset] = st.next_version
                pool = st.pools[Tier.L1]
                phys = page.copies[Tier.L1].phys
                pool.believed[phys] = pool.believed[phys][:offset] + (st.next_version,) + pool.believed[phys][offset + 1 :]
                tags.append(st.next_version)
                st.next_version += 1
            previous = (slot.last_output,) if item.append_previous_output else ()
            items.append(ComputeItem(item.request.slot_id, start, end, previous + tuple(item.input_ids), tuple(tags)))
            slot.num_tokens = end
        record.state = "executed"
        published, tickets = [], []
        for intent in record.plan.intents:
            if isinstance(intent, Restore):
                continue
            outcome = self._apply_intent(intent, batch_id=batch.batch_id)
            if isinstance(intent, Publish):
                published.append(outcome)
            elif isinstance(intent, Backup):
                tickets.append(outcome)
        kv_ready = [self._launched[t] for t in ready if t in self._launched]
        self._commit()
        tokens = self._run_compute(items, kv_ready)
        for item, token in zip(items, tokens):
            st.slots[item.slot].last_output = token
        results = tuple(
            ItemResult(plan_item.request, item.end, token) for plan_item, item, token in zip(record.plan.items, items, tokens)
        )
        return BatchCompletion(batch, results, tuple(published), tuple(tickets))

    @operation
    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        """Undo the batch's allocations and mappings; restores it started go on."""
        st = self._state
        record = self._batch(batch)
        if record.state == "executed":
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed; it cannot be cancelled")
        if record.state == "cancelled":
            raise NotPrepared(f"batch {batch.batch_id} was cancelled already")
        self._check_cancel_order(batch, record)
        for item in record.plan.items:
            slot = st.slots[item.request.slot_id]
            keep = record.start_pages[item.request.slot_id]
            for page in slot.pages[keep:]:
                self._drop_holder(page)
            del slot.pages[keep:]
            slot.reserved_tokens = record.start_tokens[item.request.slot_id]
            slot.produced -= 1
            slot.appended -= int(item.append_previous_output)
        record.state = "cancelled"

    # ---------------------------------------------------------------------------------
    # Extents
    # ---------------------------------------------------------------------------------

    @operation
    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        """Make full, computed pages of a row an extent with one reference."""
        return self._publish(Publish(request, first_page, page_count))

    @operation
    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        """Retire the extent's only ref; issue refs for its first `at_page` pages and the rest."""
        record = self._extent(extent)
        if record.refcount != 1:
            raise ExtentShared(f"extent {extent.generation} has {record.refcount} references")
        if not 0 < at_page < len(record.pages):
            raise InvalidPageRun(f"split point {at_page} is not inside 1..{len(record.pages) - 1}")
        del self._state.extents[extent.generation]
        return self._new_extent(record.pages[:at_page]), self._new_extent(record.pages[at_page:])

    @operation
    def retain(self, extent: CacheExtentRef) -> None:
        """Add a reference to a live extent."""
        self._extent(extent).refcount += 1

    @operation
    def release(self, extent: CacheExtentRef) -> None:
        """Drop a reference; with the last one the extent ends and its pages lose a holder."""
        self._apply_intent(Release(extent), batch_id=None)

    # ---------------------------------------------------------------------------------
    # Tier moves and completions
    # ---------------------------------------------------------------------------------

    @operation
    def submit(self, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
        """Apply standalone tier intents in order, atomically; a ticket per Backup and Restore."""
        for intent in intents:
            if not isinstance(intent, (Backup, Restore, Demote, Drop)):
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
            self._check_intent_handles(intent)
        tickets = []
        for intent in intents:
            if isinstance(intent, Restore):
                pages = self._restore_pages(intent.extent)
                self._require_free(Tier.L1, len(pages))
                tickets.append(self._start_transfer(TransferKind.RESTORE, intent.extent.generation, pages))
            else:
                outcome = self._apply_intent(intent, batch_id=None)
                if isinstance(intent, Backup):
                    tickets.append(outcome)
        self._commit()
        self._launch_started()
        return tuple(tickets)

    @operation
    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        """Retire the transfers whose events are done (dependencies first); report each once."""
        st = self._state
        done = {t for t in st.transfers if self._launched[t].event.query()}
        for t in done:
            self._launched[t].result.result()  # a copy that raised surfaces here
        progress = True
        while progress:
            progress = False
            for t in sorted(done & st.transfers.keys()):
                if not st.transfers[t].waits_for & st.transfers.keys():
                    self._retire(t)
                    progress = True
        return self._report()

    @operation
    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        """Block until every transfer has finished, retire them all, report as poll does."""
        st = self._state
        for t in sorted(st.transfers):
            self._launched[t].event.synchronize()
            self._launched[t].result.result()  # a copy that raised surfaces here
        while st.transfers:
            self._retire(next(t for t in sorted(st.transfers) if not st.transfers[t].waits_for & st.transfers.keys()))
        return self._report()

    def _report(self) -> tuple[TransferCompletion, ...]:
        """Hand over the unreported completions, ordered by transfer id (the timing is ours, the order is not)."""
        reported = tuple(sorted(self._state.unreported, key=lambda c: c.ticket.transfer_id))
        self._state.unreported = []
        return reported

    @operation
    def restart(self) -> RuntimeInfo:
        """Drain and discard transfers, forget everything, bump the epoch: every handle goes stale."""
        st = self._state
        for stream in (self._compute, self._h2d, self._d2h):
            stream.synchronize()
        generations = [slot.generation + int(slot.live) for slot in st.slots]
        believed = {tier: pool.believed for tier, pool in st.pools.items()}
        self._state = fresh_state(st.epoch + 1, generations, believed, st.next_version)
        self._commit()
        self._compute_event = None
        return self._info()

    # ---------------------------------------------------------------------------------
    # Introspection (test-only; never part of a scheduling step)
    # ---------------------------------------------------------------------------------

    def probe(self) -> AbstractState:
        """The abstract state; tags from the real KV bytes when the runner is tagged."""
        st = self._state
        tags = self._read_tags() if self._runner.tagged else {tier: pool.believed for tier, pool in st.pools.items()}
        empty = (0,) * self.page_size

        def copy_tags(page: Page, tier: Tier) -> tuple[int, ...]:
            return tuple(tags[tier][page.copies[tier].phys]) if tier in page.copies else empty

        pools = []
        for tier, pool in st.pools.items():
            mapped = tuple(sorted((c.phys, name) for name, page in st.pages.items() for t, c in page.copies.items() if t is tier))
            pools.append(PoolView(tier, pool.total, tuple(pool.free), mapped, tuple(sorted(pool.deferred))))
        return AbstractState(
            epoch=st.epoch,
            page_size=self.page_size,
            slots=tuple(
                SlotView(i, s.generation, s.live, tuple(s.pages), s.num_tokens, s.reserved_tokens) for i, s in enumerate(st.slots)
            ),
            pages=tuple(
                PageView(
                    name,
                    page.holders,
                    page.copies[Tier.L1].state if Tier.L1 in page.copies else CopyState.ABSENT,
                    page.copies[Tier.L2].state if Tier.L2 in page.copies else CopyState.ABSENT,
                    tuple(page.versions),
                    copy_tags(page, Tier.L1),
                    copy_tags(page, Tier.L2),
                )
                for name, page in sorted(st.pages.items())
            ),
            pools=tuple(pools),
            extents=tuple(ExtentView(g, e.pages, e.refcount) for g, e in sorted(st.extents.items())),
            batches=tuple(
                BatchView(
                    b,
                    rec.state,
                    tuple(sorted(rec.end_tokens)),
                    tuple(p for s in sorted(rec.end_tokens) for p in st.slots[s].pages) if rec.state == "prepared" else (),
                )
                for b, rec in sorted(st.batches.items())
            ),
            transfers=tuple(
                TransferView(t, tr.kind, tuple(p for p, _, _ in tr.pages), tuple(s for _, s, _ in tr.pages), tuple(d for _, _, d in tr.pages))
                for t, tr in sorted(st.transfers.items())
            ),
            boundary_calls=tuple(sorted(st.calls.items())),
        )

    def _read_tags(self) -> dict[Tier, list[list[int]]]:
        """Every physical page's tags, decoded from the bytes, read after the compute stream's work."""
        runner, memory = self._runner, self._memory
        result = self._compute.submit(
            lambda: {
                Tier.L1: runner.page_tags(memory.read_l1(list(range(self.l1_pages)))),
                Tier.L2: runner.page_tags(memory.read_l2(list(range(self.l2_pages)))),
            }
        )
        self._compute.record().synchronize()
        return {tier: tensor.tolist() for tier, tensor in result.result().items()}

    # ---------------------------------------------------------------------------------
    # Transactions
    # ---------------------------------------------------------------------------------

    def _commit(self) -> None:
        """Every precondition held: keep the bookkeeping, count the call (B1), forget retired events."""
        self._committed = True
        self._state.calls[self._operation] += 1
        self._launched = {t: launched for t, launched in self._launched.items() if t in self._state.transfers}

    def _rollback(self, saved: State) -> None:
        """A call failed before committing: its bookkeeping copy is thrown away."""
        self._state = saved

    # ---------------------------------------------------------------------------------
    # Handle checks: ForeignRuntime, then StaleHandle (epoch, generation), then UnknownHandle
    # ---------------------------------------------------------------------------------

    def _check_origin(self, what: str, runtime_id: str, epoch: int) -> None:
        if runtime_id != self.runtime_id:
            raise ForeignRuntime(f"{what} belongs to runtime {runtime_id!r}, not {self.runtime_id!r}")
        if epoch < self._state.epoch:
            raise StaleHandle(f"{what} is from epoch {epoch}; the runtime restarted into epoch {self._state.epoch}")
        if epoch > self._state.epoch:
            raise UnknownHandle(f"{what} names epoch {epoch}, which has not begun")

    def _check_generation(self, request: RequestRuntimeHandle, slot: Slot) -> None:
        if request.generation < slot.generation:
            raise StaleHandle(f"slot {request.slot_id} is at generation {slot.generation}, the handle has {request.generation}")
        if request.generation > slot.generation or not slot.live:
            raise UnknownHandle(f"slot {request.slot_id} generation {request.generation} was never opened")

    def _slot(self, request: RequestRuntimeHandle) -> Slot:
        if not isinstance(request, RequestRuntimeHandle):
            raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
        self._check_origin("request handle", request.runtime_id, request.epoch)
        if not 0 <= request.slot_id < len(self._state.slots):
            raise UnknownHandle(f"slot {request.slot_id} does not exist")
        slot = self._state.slots[request.slot_id]
        self._check_generation(request, slot)
        return slot

    def _check_extent_issued(self, extent: CacheExtentRef, record: Extent | None) -> None:
        if record is None:
            if 0 < extent.generation < self._state.next_extent:
                raise StaleHandle(f"extent {extent.generation} was released or split")
            raise UnknownHandle(f"extent {extent.generation} was never published")
        if pageruns.coalesce(record.pages) != tuple(extent.page_runs):
            raise UnknownHandle(f"extent {extent.generation}: the ref's page runs are not the ones issued")

    def _extent(self, extent: CacheExtentRef) -> Extent:
        if not isinstance(extent, CacheExtentRef):
            raise UnknownHandle(f"expected a CacheExtentRef, got {type(extent).__name__}")
        self._check_origin("extent ref", extent.runtime_id, extent.epoch)
        record = self._state.extents.get(extent.generation)
        self._check_extent_issued(extent, record)
        return record

    def _batch(self, batch: PreparedBatchHandle) -> Batch:
        if not isinstance(batch, PreparedBatchHandle):
            raise UnknownHandle(f"expected a PreparedBatchHandle, got {type(batch).__name__}")
        self._check_origin("batch handle", batch.runtime_id, batch.epoch)
        record = self._state.batches.get(batch.batch_id)
        if record is None:
            raise UnknownHandle(f"batch {batch.batch_id} was never prepared")
        return record

    def _check_intent_handles(self, intent: Intent) -> None:
        if isinstance(intent, (Publish, Close)):
            self._slot(intent.request)
        elif isinstance(intent, (Backup, Restore, Demote, Drop, Release)):
            self._extent(intent.extent)
            if not isinstance(intent, Release) and not self.l2_pages:
                raise NoL2("this runtime has no L2 tier")
        else:
            raise InvalidPlan(f"unknown intent {type(intent).__name__}")

    # ---------------------------------------------------------------------------------
    # Operation preconditions
    # ---------------------------------------------------------------------------------

    def _check_not_busy(self, request: RequestRuntimeHandle, in_batch: int | None) -> None:
        for b, rec in self._state.batches.items():
            if b != in_batch and rec.state == "prepared" and request.slot_id in rec.end_tokens:
                raise RequestBusy(f"request in slot {request.slot_id} is in prepared batch {b}")

    def _check_execute_once(self, batch: PreparedBatchHandle, record: Batch) -> None:
        if record.state == "executed":
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed already")
        if record.state == "cancelled":
            raise NotPrepared(f"batch {batch.batch_id} was cancelled")

    def _check_execute_order(self, batch: PreparedBatchHandle, record: Batch) -> None:
        for other_id, other in self._state.batches.items():
            if other_id < batch.batch_id and other.state == "prepared" and set(record.end_tokens) & set(other.end_tokens):
                raise OutOfOrder(f"batch {other_id} shares a request with batch {batch.batch_id} and has not executed")

    def _check_cancel_order(self, batch: PreparedBatchHandle, record: Batch) -> None:
        for other_id, other in self._state.batches.items():
            if other_id > batch.batch_id and other.state == "prepared" and set(record.end_tokens) & set(other.end_tokens):
                raise BatchDependency(f"batch {other_id} shares a request with batch {batch.batch_id}")

    def _check_demote_unmapped(self, record: Extent) -> None:
        held = {p for slot in self._state.slots if slot.live for p in slot.pages} & set(record.pages)
        if held:
            raise ExtentInUse(f"pages {sorted(held)} are mapped into live request rows")

    # ---------------------------------------------------------------------------------
    # Pages, holders and free lists
    # ---------------------------------------------------------------------------------

    def _require_free(self, tier: Tier, needed: int) -> None:
        free = len(self._state.pools[tier].free)
        if needed > free:
            raise OutOfPages(tier, needed, free)

    def _take_phys(self, tier: Tier) -> int:
        return self._state.pools[tier].free.pop(0)

    def _new_page(self) -> int:
        st = self._state
        name, st.next_page = st.next_page, st.next_page + 1
        st.pages[name] = Page(holders=1, versions=[0] * self.page_size, copies={Tier.L1: Copy(self._take_phys(Tier.L1), CopyState.VALID)})
        return name

    def _transfers_on(self, tier: Tier, phys: int) -> set[int]:
        """Transfers not yet retired that read or write physical page `phys` of `tier`."""
        found = set()
        for t, tr in self._state.transfers.items():
            src_tier, dst_tier = tr.tiers
            if any((src_tier is tier and src == phys) or (dst_tier is tier and dst == phys) for _, src, dst in tr.pages):
                found.add(t)
        return found

    def _free_phys(self, tier: Tier, phys: int) -> None:
        blocking = self._transfers_on(tier, phys)
        if blocking:
            self._state.pools[tier].deferred[phys] = blocking
        else:
            self._state.pools[tier].free.append(phys)

    def _drop_copy(self, name: int, tier: Tier) -> None:
        self._free_phys(tier, self._state.pages[name].copies.pop(tier).phys)

    def _drop_holder(self, name: int) -> None:
        page = self._state.pages[name]
        page.holders -= 1
        if page.holders == 0:
            for tier in list(page.copies):
                self._drop_copy(name, tier)
            del self._state.pages[name]

    def _release_ref(self, generation: int) -> None:
        record = self._state.extents[generation]
        record.refcount -= 1
        if record.refcount == 0:
            del self._state.extents[generation]
            for page in record.pages:
                self._drop_holder(page)

    def _retire_slot(self, slot: Slot) -> None:
        slot.live = False
        slot.generation += 1

    # ---------------------------------------------------------------------------------
    # Extents and intents
    # ---------------------------------------------------------------------------------

    def _new_extent(self, pages: tuple[int, ...]) -> CacheExtentRef:
        st = self._state
        generation, st.next_extent = st.next_extent, st.next_extent + 1
        st.extents[generation] = Extent(tuple(pages), 1)
        return CacheExtentRef(self.runtime_id, st.epoch, generation, pageruns.coalesce(pages))

    def _publish(self, intent: Publish) -> CacheExtentRef:
        slot = self._slot(intent.request)
        full = slot.num_tokens // self.page_size
        if intent.page_count < 1 or intent.first_page < 0 or intent.first_page + intent.page_count > full:
            raise InvalidPageRun(
                f"row pages [{intent.first_page}, {intent.first_page + intent.page_count}) are not inside the "
                f"{full} full pages written so far"
            )
        pages = tuple(slot.pages[intent.first_page : intent.first_page + intent.page_count])
        for page in pages:
            self._state.pages[page].holders += 1
        return self._new_extent(pages)

    def _close(self, request: RequestRuntimeHandle, in_batch: int | None) -> None:
        slot = self._slot(request)
        self._check_not_busy(request, in_batch)
        self._retire_slot(slot)
        for page in slot.pages:
            self._drop_holder(page)
        slot.pages, slot.num_tokens, slot.reserved_tokens = [], 0, 0

    def _apply_intent(self, intent: Intent, batch_id: int | None) -> CacheExtentRef | TransferTicket | None:
        """Apply one non-restore intent now; Backup returns its ticket, Publish its ref."""
        st = self._state
        if isinstance(intent, Publish):
            return self._publish(intent)
        if isinstance(intent, Close):
            return self._close(intent.request, in_batch=batch_id)
        self._check_intent_handles(intent)
        record = st.extents[intent.extent.generation]
        if isinstance(intent, Release):
            return self._release_ref(intent.extent.generation)
        if isinstance(intent, Backup):
            todo = [p for p in record.pages if Tier.L2 not in st.pages[p].copies]
            self._require_free(Tier.L2, len(todo))
            return self._start_transfer(TransferKind.BACKUP, intent.extent.generation, todo)
        if isinstance(intent, Demote):
            for page in record.pages:
                if Tier.L2 not in st.pages[page].copies:
                    raise NotBackedUp(f"page {page} has no host copy and no backup in flight")
            self._check_demote_unmapped(record)
            for page in record.pages:
                if Tier.L1 in st.pages[page].copies:
                    self._drop_copy(page, Tier.L1)
            return None
        if isinstance(intent, Drop):
            for page in record.pages:
                if Tier.L1 not in st.pages[page].copies:
                    raise WouldLoseData(f"page {page} has no device copy; dropping its host copy loses it")
            for page in record.pages:
                if Tier.L2 in st.pages[page].copies:
                    self._drop_copy(page, Tier.L2)
            return None
        raise InvalidPlan(f"unknown intent {type(intent).__name__}")

    # ---------------------------------------------------------------------------------
    # Transfers: bookkeeping
    # ---------------------------------------------------------------------------------

    def _restore_pages(self, extent: CacheExtentRef) -> list[int]:
        """Pages of the extent a restore must move; NotBackedUp if one has no host copy."""
        todo = []
        for page in self._state.extents[extent.generation].pages:
            copies = self._state.pages[page].copies
            if Tier.L1 in copies:
                continue
            if Tier.L2 not in copies:
                raise NotBackedUp(f"page {page} has neither a device nor a host copy")
            todo.append(page)
        return todo

    def _start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket:
        """Name the transfer, give each page a filling destination copy; the device work starts at commit."""
        st = self._state
        transfer_id, st.next_transfer = st.next_transfer, st.next_transfer + 1
        record = Transfer(kind, generation, [], set(), TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(pages)))
        src_tier, dst_tier = record.tiers
        for name in pages:
            page = st.pages[name]
            source = page.copies[src_tier]
            if source.state is CopyState.FILLING:
                record.waits_for |= self._transfers_on(src_tier, source.phys)
            destination = self._take_phys(dst_tier)
            page.copies[dst_tier] = Copy(destination, CopyState.FILLING)
            record.pages.append((name, source.phys, destination))
        st.transfers[transfer_id] = record
        if pages:
            self._to_launch.append(transfer_id)
        else:
            self._retire(transfer_id)
        return record.ticket

    def _retire(self, transfer_id: int) -> None:
        """The transfer's copies are valid; deferred frees it blocked run; its completion is queued."""
        st = self._state
        record = st.transfers.pop(transfer_id)
        src_tier, dst_tier = record.tiers
        for name, src, dst in record.pages:
            st.pools[dst_tier].believed[dst] = st.pools[src_tier].believed[src]
            page = st.pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if target is not None and target.phys == dst:
                target.state = CopyState.VALID
        for tier in (Tier.L1, Tier.L2):
            pool = st.pools[tier]
            for phys in sorted(pool.deferred):
                pool.deferred[phys].discard(transfer_id)
                if not pool.deferred[phys]:
                    del pool.deferred[phys]
                    pool.free.append(phys)
        st.unreported.append(TransferCompletion(record.ticket))

    def _await_restores(self, pages: list[int]) -> list[int]:
        """Retire, in dependency order, every transfer filling an L1 copy of `pages`; return their ids.

        The bookkeeping retires them now; the device work is ordered by `_wait_kv_ready`
        on the returned transfers before compute reads the pages (O1).
        """
        st = self._state
        retired = []
        while True:
            waiting = [t for t, tr in st.transfers.items() if tr.kind is TransferKind.RESTORE and any(p in pages for p, _, _ in tr.pages)]
            if not waiting:
                return retired
            chain = {min(waiting)}
            while chain:
                ready = [t for t in sorted(chain) if not st.transfers[t].waits_for & st.transfers.keys()]
                if ready:
                    self._retire(ready[0])
                    retired.append(ready[0])
                    break
                chain = {w for t in chain for w in st.transfers[t].waits_for if w in st.transfers}

    # ---------------------------------------------------------------------------------
    # Device work (after commit): ReqToToken, transfers, compute
    # ---------------------------------------------------------------------------------

    def _write_req_to_token(self, rows: list[tuple[int, int, list[int]]]) -> None:
        """Write each row's new token locations (`phys * page_size + offset`) on the compute stream.

        Compute reads the table in stream order after this, so no event is needed.
        """
        page_size, table, device = self.page_size, self._table, self.device

        def write() -> None:
            for slot_id, first_token, phys_pages in rows:
                if phys_pages:
                    locations = [phys * page_size + offset for phys in phys_pages for offset in range(page_size)]
                    table[slot_id, first_token : first_token + len(locations)] = to_device(locations, torch.int32, device)

        self._compute.submit(write)

    def _launch_started(self) -> None:
        """Issue the transfers this call started, in id order, each on its stream."""
        for transfer_id in self._to_launch:
            self._launch(transfer_id, self._state.transfers[transfer_id])
        self._to_launch = []

    def _launch(self, transfer_id: int, record: Transfer) -> None:
        stream = self._d2h if record.kind is TransferKind.BACKUP else self._h2d
        self._wait_transfer_deps(stream, [self._launched[w] for w in sorted(record.waits_for) if w in self._launched])
        if record.kind is TransferKind.BACKUP:
            self._wait_compute(stream)
        if self._delay:
            stream.sleep(self._delay)
        sources = [src for _, src, _ in record.pages]
        destinations = [dst for _, _, dst in record.pages]
        move = self._memory.backup if record.kind is TransferKind.BACKUP else self._memory.restore
        result = stream.submit(lambda: move(sources, destinations))
        self._launched[transfer_id] = Launched(stream.record(), result)

    def _run_compute(self, items: list[ComputeItem], kv_ready: list[Launched]) -> list[int]:
        """Run the batch on the compute stream after its restores; record the event backups wait on."""
        self._wait_kv_ready(kv_ready)
        runner, memory, table = self._runner, self._memory, self._table
        result = self._compute.submit(lambda: runner.forward(memory, table, items))
        self._compute_event = self._compute.record()
        self._launch_started()
        self._compute_event.synchronize()
        return runner.finish(result.result().tolist(), items)

    # ---------------------------------------------------------------------------------
    # Ordering steps (each one is what a mutant leaves out)
    # ---------------------------------------------------------------------------------

    def _wait_kv_ready(self, launched: list[Launched]) -> None:
        """O1: compute starts only after the H2D of every restored page it reads (KV_READY)."""
        for transfer in launched:
            self._compute.wait(transfer.event)

    def _wait_compute(self, stream: Stream) -> None:
        """O2: a D2H reads device pages only after the compute that wrote them."""
        if self._compute_event is not None:
            stream.wait(self._compute_event)

    def _wait_transfer_deps(self, stream: Stream, launched: list[Launched]) -> None:
        """A restore reads a host copy only after the backup filling it (scenario 1)."""
        for transfer in launched:
            stream.wait(transfer.event)


def _close_streams(streams: tuple[Stream, ...]) -> None:
    """Stop the streams after their queued work (at `close`, collection or interpreter exit)."""
    for stream in streams:
        stream.close()
