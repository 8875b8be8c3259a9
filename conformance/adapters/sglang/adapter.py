"""SGLang 0.5.23's real cache classes presented as a cacheruntime `RuntimeInterface`.

Factory: `conformance.adapters.sglang.adapter:make_runtime` (run from the repository
root, under `.venv-sglang/bin/python`; see notes.md). The adapter is a *translator*: every
call becomes the SGLang calls a scheduler makes, and it adds no check SGLang lacks, so
the conformance suite measures SGLang, not the adapter.

How the protocol maps onto SGLang (and what cannot be checked):

| protocol | SGLang 0.5.23 | notes |
|---|---|---|
| slot, `slot_id` | a `ReqToTokenPool` row (row 0 is SGLang's padding row); the slot id is a *name* the adapter gives the row: the lowest name not live, as the contract numbers slots | SGLang hands out the highest free row (LIFO tail pop); rows are physical, so the adapter names them as it names pages |
| handle `generation` | `ReqToTokenPool.req_generation[row] - 1`: SGLang bumps when it hands a row out (first use 1), the contract when it closes (first use 0) | H2 holds. SGLang's row operations (`free_rows`, `write`) take a bare row index, never a generation: a stale handle cannot be rejected (H1), so the adapter forwards it |
| handle `epoch`, `runtime_id` | none | no restart epoch and no runtime identity: not checkable; RESTART is not claimed |
| page name | the adapter's counter, in the contract's order; maps to a `PagedTokenToKVPoolAllocator` page id and/or a host-pool page | SGLang has no logical page names: a tree node or a row holds raw token indices (the representation leak the design brief names) |
| page holders (R3) | none in SGLang: the allocator has no reference counts; sharing is the radix tree's `lock_ref` | the adapter counts holders only to decide *when* to call `allocator.free`, as the scheduler's `cache_finished_req`/tree eviction decide; it never refuses a call because of them |
| extent (publish/split/retain/release) | no runtime-side object: in SGLang the prefix tree (control side) owns the token indices | the adapter's extent table is bookkeeping only: a generation not in it (never issued, released, split) is `UnknownHandle` (a lookup miss, see below); a ref whose extent is still live is forwarded whatever its `page_runs`, epoch or runtime id |
| prepare/execute/cancel | no two-phase batch in SGLang's cache layer; `alloc` of the batch's pages at prepare (one `alloc` for the whole batch, as `alloc_extend` does), row writes via `req_to_token` | an id not in the adapter's batch table is `UnknownHandle` (lookup miss); no `AlreadyExecuted`/`OutOfOrder`/`NotPrepared`: SGLang has no batch identity or state (O4 not checkable on SGLang itself) |
| Backup / Restore | `HiCacheController.write(device_indices)` / `load(host_indices)` + `start_loading()`, `io_backend="direct"` | on CPU the copy runs inside the call; completions are SGLang's acks (`ack_write_queue`, `ack_load_queue`), reported at poll as `writing_check`/`loading_check` do |
| Demote / Drop | `allocator.free(device_indices)` / `controller.evict_host(host_indices)` | no `NotBackedUp`/`ExtentInUse`/`WouldLoseData` checks: SGLang keeps those in the HiRadixCache, not in the runtime classes |
| compute | none (no model on CPU): `next_token` is None | TAGGED_COMPUTE not claimed, so D1 is not checked through compute |

Capabilities claimed: `L2` only (when `l2_pages > 0`). Not `ASYNC_TRANSFERS` (on CPU every
copy has finished when the call returns), not `INTROSPECTION` (holders, names and
extents are the adapter's, not SGLang's state), not `RESTART`, `TAGGED_COMPUTE`,
`DELAY_KNOB`.

Errors: SGLang signals exhaustion by returning None (`alloc_rows`, `alloc`, `write`,
`load`); the adapter translates exactly those into `OutOfSlots` / `OutOfPages`. Any other
SGLang exception (an AssertionError, an IndexError) propagates unchanged.

Unknown batch ids and extent generations: batches and extents are the adapter's *own*
bookkeeping (SGLang has no batch or extent identity; the `_batch`/`_extent` tables exist
only to turn a protocol value into the token indices SGLang takes). A lookup that misses
in those tables (keyed by the whole value as issued: runtime id, epoch 0, extent
generation *and* page runs; the contract's order of handle errors) is a value the adapter
cannot translate, so it raises `UnknownHandle`
instead of leaking a `KeyError`: that is translation, not a check SGLang lacks. Every
lookup of a plan is resolved before the first SGLang call, so a miss changes nothing.
The adapter never refuses a call on SGLang's own state (rows, generations, pages,
locks, frees, acks). The one refinement: a generation the adapter's own counter issued
but whose entry is gone (released or split) is `StaleHandle`, as the contract words it,
since that too is read off the adapter's table alone. A stale or double row free, a double release through a live
second reference, a batch executed twice or a cancelled one are all forwarded to SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cacheruntime import pageruns
from cacheruntime.protocol import (
    Backup,
    BatchCompletion,
    BatchPlan,
    CacheExtentRef,
    Capability,
    Close,
    Demote,
    Drop,
    ForeignRuntime,
    InvalidPlan,
    ItemResult,
    OutOfPages,
    OutOfSlots,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
    RuntimeInfo,
    StaleHandle,
    Tier,
    TransferCompletion,
    TransferKind,
    TransferTicket,
    UnknownHandle,
    Unsupported,
)

from .stack import build_stack

if TYPE_CHECKING:  # torch is imported where it is used: the adapter module loads without it
    import torch


@dataclass
class _Row:
    pages: list[int] = field(default_factory=list)  # page names, in token order
    num_tokens: int = 0
    reserved: int = 0


@dataclass
class _Page:
    holders: int
    device: int | None = None  # allocator page id
    host: int | None = None  # host pool page id


@dataclass
class _Extent:
    pages: tuple[int, ...]
    refcount: int = 1


@dataclass
class _Batch:
    plan: BatchPlan
    ends: dict[int, int]
    starts: dict[int, tuple[int, int]]  # row -> (reserved tokens, page count) before
    state: str = "prepared"


class SGLangRuntime:
    """A `RuntimeInterface` over ReqToTokenPool, the paged allocator, the KV pools and HiCacheController."""

    def __init__(
        self,
        *,
        runtime_id: str = "sglang",
        page_size: int = 4,
        max_requests: int = 4,
        max_request_tokens: int = 64,
        l1_pages: int = 16,
        l2_pages: int = 32,
    ):
        self.runtime_id = runtime_id
        self.page_size = page_size
        self.max_requests = max_requests
        self.max_request_tokens = max_request_tokens
        self.l1_pages = l1_pages
        self.l2_pages = l2_pages
        self.sg = build_stack(
            page_size=page_size,
            max_requests=max_requests,
            max_request_tokens=max_request_tokens,
            l1_pages=l1_pages,
            l2_pages=l2_pages,
            paged=True,
        )
        self.rows: dict[int, _Row] = {}
        self.slot_row: dict[int, int] = {}  # protocol slot name -> ReqToTokenPool row (kept after close)
        self.live_slots: set[int] = set()
        self.pages: dict[int, _Page] = {}
        self.extents: dict[int, _Extent] = {}
        self.batches: dict[int, _Batch] = {}
        self.produced: dict[int, int] = {}
        self.next_page = 0
        self.next_extent = 1
        self.next_batch = 0
        self.next_transfer = 0
        self.write_tickets: list[tuple[TransferTicket, list[int]]] = []  # parallel to ack_write_queue
        self.load_tickets: list[tuple[TransferTicket, list[int]]] = []  # parallel to ack_load_queue
        self.done: list[TransferCompletion] = []

    # -- info --------------------------------------------------------------------------

    def info(self) -> RuntimeInfo:
        caps = {Capability.L2} if self.l2_pages else set()
        return RuntimeInfo(
            self.runtime_id,
            0,
            self.page_size,
            self.max_requests,
            self.max_request_tokens,
            self.l1_pages,
            self.l2_pages,
            frozenset(caps),
        )

    # -- helpers: translation only ---------------------------------------------------------

    def _row(self, request: RequestRuntimeHandle) -> int:
        # Name -> physical row only; no generation/epoch check: SGLang's row API has none.
        return self.slot_row.get(request.slot_id, request.slot_id + 1)

    def _own(self, what: str, ref) -> None:
        # Extent refs and batch handles are values only the adapter issues (runtime id "sglang",
        # epoch 0: SGLang has neither); one from elsewhere names nothing in its tables.
        if ref.runtime_id != self.runtime_id:
            raise ForeignRuntime(f"{what} belongs to runtime {ref.runtime_id!r}, not {self.runtime_id!r}")
        if ref.epoch != 0:
            raise (StaleHandle if ref.epoch < 0 else UnknownHandle)(f"{what} has epoch {ref.epoch}; the adapter has only epoch 0")

    def _extent(self, ref: CacheExtentRef) -> _Extent:
        # Lookup in the adapter's own table (SGLang has no extent identity): a miss is untranslatable.
        self._own("extent ref", ref)
        # The key is the ref as issued (generation and page runs): a ref with other page runs
        # names no entry of the table.
        record = self.extents.get(ref.generation)
        if record is None:
            if 0 < ref.generation < self.next_extent:  # the adapter issued it, then released or split it
                raise StaleHandle(f"extent generation {ref.generation} was released or split")
            raise UnknownHandle(f"extent generation {ref.generation} is not in the adapter's extent table")
        if tuple(ref.page_runs) != pageruns.coalesce(record.pages):
            raise UnknownHandle(f"extent generation {ref.generation}: page runs {ref.page_runs} were not issued with it")
        return record

    def _batch(self, handle: PreparedBatchHandle) -> _Batch:
        # Lookup in the adapter's own table (SGLang has no batch identity); no state check.
        self._own("batch handle", handle)
        record = self.batches.get(handle.batch_id)
        if record is None:
            raise UnknownHandle(f"batch id {handle.batch_id} is not in the adapter's batch table")
        return record

    def _device_indices(self, names) -> torch.Tensor:
        import torch

        ps = self.page_size
        ids = [self.pages[n].device for n in names]
        return (torch.tensor(ids, dtype=torch.int64)[:, None] * ps + torch.arange(ps)).reshape(-1)

    def _host_indices(self, names):
        import torch

        ps = self.page_size
        ids = [self.pages[n].host for n in names]
        return (torch.tensor(ids, dtype=torch.int64)[:, None] * ps + torch.arange(ps)).reshape(-1)

    def _page_ids(self, indices) -> list[int]:
        return (indices[:: self.page_size] // self.page_size).tolist()

    def _write_row(self, row: int, state: _Row) -> None:
        if state.pages:
            idx = self._device_indices([p for p in state.pages if self.pages[p].device is not None])
            self.sg.req_to_token_pool.write((row, slice(0, len(idx))), idx.to(self.sg.req_to_token_pool.req_to_token.dtype))

    def _drop_holder(self, name: int) -> None:
        page = self.pages[name]
        page.holders -= 1
        if page.holders == 0:
            if page.device is not None:
                self.sg.allocator.free(self._device_indices([name]))
            if page.host is not None and self.sg.controller is not None:
                self.sg.controller.evict_host(self._host_indices([name]))
            del self.pages[name]

    # -- requests ------------------------------------------------------------------------

    def open_request(self) -> RequestRuntimeHandle:
        rows = self.sg.req_to_token_pool.alloc_rows(1)
        if rows is None:
            raise OutOfSlots(f"ReqToTokenPool has no free row (size {self.max_requests})")
        (row,) = rows
        self.rows[row] = _Row()
        self.produced[row] = 0
        slot = min(s for s in range(self.max_requests) if s not in self.live_slots)
        self.live_slots.add(slot)
        self.slot_row[slot] = row
        # SGLang bumps req_generation when it hands a row out (first use: 1); the contract
        # bumps at close (first use: 0). Same sequence, shifted by one.
        generation = int(self.sg.req_to_token_pool.req_generation[row]) - 1
        return RequestRuntimeHandle(self.runtime_id, 0, slot, generation)

    def close_request(self, request: RequestRuntimeHandle) -> None:
        row = self._row(request)
        self.live_slots.discard(request.slot_id)
        state = self.rows.pop(row, _Row())
        for name in state.pages:
            if name in self.pages:
                self._drop_holder(name)
        self.sg.req_to_token_pool.free_rows([row])

    # -- batches -------------------------------------------------------------------------

    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        if not isinstance(plan, BatchPlan):
            raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
        ps = self.page_size
        # Translate every extent ref of the plan first (adapter bookkeeping, no SGLang state).
        for item in plan.items:
            for extent in item.attach:
                self._extent(extent)
        for intent in plan.intents:
            if not isinstance(intent, (Publish, Close)):
                self._extent(intent.extent)
        for intent in plan.intents:
            if isinstance(intent, Restore):
                self._restore(intent.extent)
        ends, starts, need = {}, {}, 0
        for item in plan.items:
            row = self._row(item.request)
            state = self.rows.setdefault(row, _Row())
            attached = sum(len(self._extent(e).pages) for e in item.attach)
            end = state.reserved + attached * ps + item.new_tokens
            starts[row] = (state.reserved, len(state.pages))
            ends[row] = end
            need += -(-end // ps) - len(state.pages) - attached
        indices = self.sg.allocator.alloc(need * ps) if need > 0 else None
        if need > 0 and indices is None:
            raise OutOfPages(Tier.L1, need, self.sg.allocator.available_size() // ps)
        fresh = self._page_ids(indices) if need > 0 else []
        for item in plan.items:
            row = self._row(item.request)
            state = self.rows[row]
            for extent in item.attach:
                for name in self._extent(extent).pages:
                    self.pages[name].holders += 1
                    state.pages.append(name)
            while len(state.pages) * ps < ends[row]:
                name, self.next_page = self.next_page, self.next_page + 1
                self.pages[name] = _Page(holders=1, device=fresh.pop(0))
                state.pages.append(name)
            state.reserved = ends[row]
            self._write_row(row, state)
        batch_id, self.next_batch = self.next_batch, self.next_batch + 1
        self.batches[batch_id] = _Batch(plan, ends, starts)
        return PreparedBatchHandle(self.runtime_id, 0, batch_id)

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        record = self._batch(batch)  # no state check: SGLang has no batch identity
        self.wait_completions_into_done()  # compute waits for the loads (SGLang: layer_done_counter)
        results = []
        for item in record.plan.items:
            row = self._row(item.request)
            state = self.rows.setdefault(row, _Row())
            state.num_tokens = record.ends[row]
            self.produced[row] = self.produced.get(row, 0) + 1
            results.append(ItemResult(item.request, state.num_tokens, None))
        record.state = "executed"
        published, tickets = [], []
        for intent in record.plan.intents:
            if isinstance(intent, Restore):
                continue
            if isinstance(intent, Publish):
                published.append(self.publish(intent.request, intent.first_page, intent.page_count))
            elif isinstance(intent, Close):
                self.close_request(intent.request)
            elif isinstance(intent, Release):
                self.release(intent.extent)
            else:
                tickets.extend(self.submit((intent,)))
        return BatchCompletion(batch, tuple(results), tuple(published), tuple(tickets))

    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        record = self._batch(batch)
        for row, (reserved, keep) in record.starts.items():
            state = self.rows.get(row)
            if state is None:
                continue
            for name in state.pages[keep:]:
                self._drop_holder(name)
            del state.pages[keep:]
            state.reserved = reserved
        record.state = "cancelled"

    # -- extents ---------------------------------------------------------------------------

    def _new_extent(self, pages) -> CacheExtentRef:
        generation, self.next_extent = self.next_extent, self.next_extent + 1
        self.extents[generation] = _Extent(tuple(pages))
        return CacheExtentRef(self.runtime_id, 0, generation, pageruns.coalesce(tuple(pages)))

    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        state = self.rows.get(self._row(request), _Row())
        pages = tuple(state.pages[first_page : first_page + page_count])
        for name in pages:
            self.pages[name].holders += 1
        return self._new_extent(pages)

    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        record = self._extent(extent)
        del self.extents[extent.generation]
        return self._new_extent(record.pages[:at_page]), self._new_extent(record.pages[at_page:])

    def retain(self, extent: CacheExtentRef) -> None:
        self._extent(extent).refcount += 1

    def release(self, extent: CacheExtentRef) -> None:
        record = self._extent(extent)
        record.refcount -= 1
        if record.refcount == 0:
            del self.extents[extent.generation]
            for name in record.pages:
                self._drop_holder(name)

    # -- tier moves --------------------------------------------------------------------------

    def _ticket(self, kind: TransferKind, extent: CacheExtentRef, count: int) -> TransferTicket:
        tid, self.next_transfer = self.next_transfer, self.next_transfer + 1
        return TransferTicket(self.runtime_id, 0, tid, kind, extent.generation, count)

    def _restore(self, extent: CacheExtentRef) -> TransferTicket:
        names = [n for n in self._extent(extent).pages if self.pages[n].device is None]
        ticket = self._ticket(TransferKind.RESTORE, extent, len(names))
        if not names:
            self.done.append(TransferCompletion(ticket))
            return ticket
        device = self.sg.controller.load(self._host_indices(names))
        if device is None:
            raise OutOfPages(Tier.L1, len(names), self.sg.allocator.available_size() // self.page_size)
        for name, page_id in zip(names, self._page_ids(device)):
            self.pages[name].device = page_id
        self.sg.controller.start_loading()
        self.load_tickets.append((ticket, names))
        return ticket

    def submit(self, intents) -> tuple[TransferTicket, ...]:
        if self.sg.controller is None:
            from cacheruntime.protocol import NoL2

            raise NoL2("this SGLang stack was built without a host pool")
        for intent in intents:  # translate every ref before the first SGLang call
            if not isinstance(intent, (Backup, Restore, Demote, Drop)):
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
            self._extent(intent.extent)
        tickets = []
        for intent in intents:
            record = self._extent(intent.extent)
            if isinstance(intent, Backup):
                names = [n for n in record.pages if self.pages[n].host is None]
                ticket = self._ticket(TransferKind.BACKUP, intent.extent, len(names))
                if names:
                    host = self.sg.controller.write(self._device_indices(names))
                    if host is None:
                        raise OutOfPages(Tier.L2, len(names), self.sg.host_pool.available_size() // self.page_size)
                    for name, page_id in zip(names, self._page_ids(host)):
                        self.pages[name].host = page_id
                    self.write_tickets.append((ticket, names))
                else:
                    self.done.append(TransferCompletion(ticket))
                tickets.append(ticket)
            elif isinstance(intent, Restore):
                tickets.append(self._restore(intent.extent))
            elif isinstance(intent, Demote):
                names = [n for n in record.pages if self.pages[n].device is not None]
                if names:
                    self.sg.allocator.free(self._device_indices(names))
                for name in names:
                    self.pages[name].device = None
            elif isinstance(intent, Drop):
                names = [n for n in record.pages if self.pages[n].host is not None]
                if names:
                    self.sg.controller.evict_host(self._host_indices(names))
                for name in names:
                    self.pages[name].host = None
            else:
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
        return tuple(tickets)

    # -- completions ---------------------------------------------------------------------------

    def _collect(self, block: bool) -> None:
        """Consume SGLang's finished acks in order, as HiRadixCache.writing_check/loading_check do."""
        ctl = self.sg.controller
        if ctl is None:
            return
        for acks, tickets in ((ctl.ack_write_queue, self.write_tickets), (ctl.ack_load_queue, self.load_tickets)):
            while acks and tickets:
                ack = acks[0]
                if block:
                    ack.finish_event.synchronize()
                elif not ack.finish_event.query():
                    break
                acks.pop(0)
                ticket, _ = tickets.pop(0)
                self.done.append(TransferCompletion(ticket))

    def wait_completions_into_done(self) -> None:
        self._collect(block=True)

    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        self._collect(block=False)
        done, self.done = tuple(self.done), []
        return done

    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        self._collect(block=True)
        done, self.done = tuple(self.done), []
        return done

    def restart(self) -> RuntimeInfo:
        raise Unsupported("SGLang's cache classes have no restart epoch (RESTART is not claimed)")


def make_runtime(**options) -> SGLangRuntime:
    """The conformance factory: `--runtime conformance.adapters.sglang.adapter:make_runtime`."""
    return SGLangRuntime(**options)
