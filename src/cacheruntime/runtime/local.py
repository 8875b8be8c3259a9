"""`LocalGPURuntime`: the contract of `spec/protocol.md` on real KV memory, in the caller's process.

The runtime owns request slots with generations, the ReqToToken table (a device int32
tensor `[max_requests, max_request_tokens]` of token locations that attention reads), the
page allocator with its device and host free lists, the page-name table (logical page ->
device and/or host physical page), the KV pools (`pools.KVMemory`), a compute, an H2D and a
D2H stream with events (`streams`), and a model runner (`runner`). Control only ever gets
the frozen values of `cacheruntime.protocol` (B2).

Every call checks its preconditions in the reference model's check order before it
changes its bookkeeping (`state.State`), and commits before it touches the device (write
ReqToToken, start transfers, run compute). Where a later check can still fail after an
earlier change (the intents of `submit` and `execute_batch` apply in order, each checked
against the state the previous ones left), every change is first written to the call's
undo journal, which a failure replays backwards. A raised `CacheRuntimeError` therefore
leaves the runtime exactly as it was, and a call costs what it touches: nothing is copied
wholesale, and executed or cancelled batches leave only a compact outcome.

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
import operator
import weakref
from array import array
from collections import deque
from itertools import repeat
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import torch

from cacheruntime import pageruns
from cacheruntime.protocol import (
    AbstractState,
    AlreadyExecuted,
    Backup,
    BatchCompletion,
    BatchDependency,
    BatchItem,
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
from cacheruntime.runtime.runner import ComputeBatch, DecoderConfig, make_runner
from cacheruntime.runtime.state import Batch, Copy, Extent, Page, Slot, State, Transfer, fresh_state
from cacheruntime.runtime.streams import Event, Result, Stream, make_stream, to_device


#: Where `execute_batch` issues the D2H throttle's piece: launched right after the batch's
#: compute, so that it runs under it ("under_compute"); after the compute's event, so that it
#: starts when the compute ends ("after_compute"); or once the batch's outputs are on the
#: host ("after_outputs"). Only the timing differs; `bench.itlvariants` measures them. The
#: default is "under_compute": on an H200 its write-back cost the decode step 0.5-1.8%
#: against 3.5-4.9% after compute and 4.7-7.3% after the outputs (two runs each, same call;
#: docs/benchmarks.md). Under compute, the piece is issued while the host waits for the
#: outputs anyway and is copied before they are read; after compute, the output read can
#: queue behind it on the copy engine; after the outputs, its issue adds to the step.
D2H_ISSUE_POINTS = ("under_compute", "after_compute", "after_outputs")


@attrs.frozen
class Launched:
    """A transfer issued to its stream: the event after its copy, and the copy's result."""

    event: Event
    result: Result


def operation(method: Callable | None = None, *, journal: bool = True) -> Callable:
    """Run a boundary call with an undo journal; keep its changes only if the call succeeds.

    The method commits (`self._commit()`) once every precondition held and before it
    touches the device; a method without device work is committed on return. An error
    before the commit replays the journal backwards (`_rollback`), so nothing changed.
    `journal=False` is for the hot calls whose every check precedes their first change
    (`prepare_batch`, `poll_completions`, `info`): they skip the journal's cost, and a
    failure finds nothing to undo.
    """
    if method is None:
        return functools.partial(operation, journal=journal)
    name = method.__name__

    @functools.wraps(method)
    def call(self: LocalGPURuntime, *args: Any, **kwargs: Any) -> Any:
        log: list[Callable[[], None]] = []
        self._operation, self._committed, self._to_launch, self._journal = name, False, [], log if journal else None
        try:
            result = method(self, *args, **kwargs)
        except BaseException:
            if not self._committed:
                self._rollback(log)
            raise
        finally:
            self._journal = None
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
    - `_take_phys(tier, count)`: allocation from a free list
    - `_free_phys(tier, phys)`: deferred free while a transfer touches the page (O3)
    - `_drop_holder(name)`: a page name loses a holder; at 0 its copies are freed (R3, R4)
    - `_release_ref(generation)`: an extent's reference count goes down; at 0 it ends (R3, R4)
    - `_retire_slot(slot)`: a closing slot's generation grows (H2)
    - `_wait_kv_ready(launched)`: compute waits for the restores it reads (O1)
    - `_wait_compute(stream)`: a backup's D2H waits for the compute event (O2)
    - `_wait_transfer_deps(stream, launched)`: a restore waits for the backup filling its source
    - `_rollback(saved)`: a failed call undoes its journal `saved` (atomicity)
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
        d2h_bytes_per_batch: int | None = 32 << 20,
        d2h_issue: str = "under_compute",
    ):
        if d2h_bytes_per_batch is not None and d2h_bytes_per_batch < 1:
            raise ValueError("d2h_bytes_per_batch must be positive (or None: no throttle)")
        if d2h_issue not in D2H_ISSUE_POINTS:
            raise ValueError(f"d2h_issue must be one of {', '.join(D2H_ISSUE_POINTS)}, not {d2h_issue!r}")
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
        # Rows padded to whole pages, so that a page's token locations are one row of
        # `_table_pages`: mapping a page is one indexed store of page_size locations.
        row_pages = -(-max_request_tokens // page_size)
        self._table = torch.zeros(max_requests, row_pages * page_size, dtype=torch.int32, device=self.device)
        self._table_pages = self._table.view(max_requests, row_pages, page_size)
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # weights and pools were filled on the default stream
        self._compute: Stream = make_stream("compute", self.device)
        self._h2d: Stream = make_stream("h2d", self.device)
        self._d2h: Stream = make_stream("d2h", self.device)
        self._finalizer = weakref.finalize(self, _close_streams, (self._compute, self._h2d, self._d2h))
        self._launched: dict[int, Launched] = {}
        # The D2H throttle: backups are queued in pieces of at most `d2h_bytes_per_batch`
        # and issued one piece per `execute_batch` (where `d2h_issue` says), per `submit`, and per
        # `poll_completions` when no batch ran since the last one; `wait_completions`, a
        # restore reading a backup's host copy and `restart` issue what they need at once.
        # Only when the D2H runs changes; what is reported, and in which order, does not.
        self._d2h_piece_pages = None if d2h_bytes_per_batch is None else max(1, d2h_bytes_per_batch // self._memory.page_bytes)
        self._d2h_queue: deque[_Piece] = deque()
        self._d2h_queued: set[int] = set()  # transfers with pieces still queued
        self._d2h_results: dict[int, list[Result]] = {}  # their issued pieces' results
        # Where in `execute_batch` the throttle issues its piece (`D2H_ISSUE_POINTS`).
        self._d2h_issue = d2h_issue
        self._executed_since_pump = False
        self._compute_event: Event | None = None
        self._delay = {TransferKind.BACKUP: 0.0, TransferKind.RESTORE: 0.0}
        believed = {Tier.L1: [0] * (l1_pages * page_size), Tier.L2: [0] * (l2_pages * page_size)}
        self._state: State = fresh_state(0, [0] * max_requests, believed, page_size, 1)
        self._operation, self._committed, self._to_launch = "", True, []
        self._journal: list[Callable[[], None]] | None = None
        # Validated item handles of the last plan whose items only compute their inputs and
        # are immutable (a tuple of items with tuples of input ids): (items tuple, state,
        # `_slot_changes` then, slot ids, slot records, slot id set, lengths, requests,
        # whether every item has one input id).
        # A plan with the same items tuple, prepared while no slot opened or closed and the
        # epoch did not change, has the same handles in the same slots, so the checks would
        # give the same answer (control keeps one tuple for a running decode set).
        self._slot_changes = 0  # grows whenever a slot's generation or liveness changes
        self._validated: tuple | None = None
        self._no_versions = array("q", [0] * page_size)  # a new page's versions (copied)
        # Finished batches' sorted slot tuples, interned and keyed by slot set: a reused plan's
        # batches share one frozenset, whose hash is cached, so a step neither sorts nor hashes its slots.
        self._slot_sets: dict[frozenset[int], tuple[int, ...]] = {}

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

    @operation(journal=False)
    def info(self) -> RuntimeInfo:
        """Identity, epoch, sizes, capabilities and the bytes of one KV page."""
        return self._info()

    def set_transfer_delay(self, seconds: float, kind: TransferKind | None = None) -> None:
        """Test-only: hold the transfer stream `seconds` before every copy of `kind` (both if None).

        Different delays per direction make a missing dependency between transfers a sure
        race: with backups slower than restores, a restore that does not wait for the
        backup filling its host copy reads it before the D2H lands (DELAY_KNOB).
        """
        if seconds < 0:
            raise ValueError("the transfer delay cannot be negative")
        for k in (TransferKind.BACKUP, TransferKind.RESTORE) if kind is None else (kind,):
            self._delay[k] = float(seconds)

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
                self._slot_changes += 1
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

    @operation(journal=False)
    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        """Validate the plan, allocate and map pages, write ReqToToken, start the plan's restores.

        Every check runs before the first change, so a failure has nothing to undo. The
        checks run in the reference model's order: every handle (items, then intents),
        duplicate requests, restores, then per item its tokens, attach, append and row size.
        """
        st = self._state
        if not isinstance(plan, BatchPlan):
            raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
        items = plan.items
        if not items:
            raise InvalidPlan("a plan needs at least one item")
        all_slots = st.slots
        intents = plan.intents
        known = self._validated
        if known is not None and known[0] is items and known[1] is st and known[2] == self._slot_changes:
            slots, rows, slot_set, lengths, requests, single_inputs = known[3:]
            special = False
            for intent in intents:
                self._check_intent_handles(intent)
        else:
            slots, rows, special = self._check_item_handles(items, all_slots)
            for intent in intents:
                self._check_intent_handles(intent)
            slot_set = frozenset(slots)
            if len(slot_set) != len(slots):
                raise InvalidPlan("a request appears twice in the plan")
            lengths = [len(item.input_ids) for item in items]
            requests = [item.request for item in items]
            single_inputs = lengths.count(1) == len(lengths)
            if not special and type(items) is tuple and all(type(item.input_ids) is tuple for item in items):
                # only an immutable plan: a list of items (or of input ids) could change in place
                self._validated = (items, st, self._slot_changes, slots, rows, slot_set, lengths, requests, single_inputs)
        restoring: set[int] = set()
        for intent in intents:
            if isinstance(intent, Restore):
                restoring.update(self._restore_pages(intent.extent))
        ps, max_tokens, pages, extents = self.page_size, self.max_request_tokens, st.pages, st.extents
        l1 = Tier.L1
        start_tokens = [slot.reserved_tokens for slot in rows]
        ends = list(map(operator.add, start_tokens, lengths))
        # A decode step's offset of each item's new token in its page, and how many are 0
        # (the rows that need a new page); None for other plans.
        offsets: list[int] | None = None
        opened = 0
        if not special and (single_inputs or min(lengths) >= 1) and max(ends) <= max_tokens:
            # Items that only compute their inputs (decode and plain prefill): every check
            # of `_check_items` passes, and each item starts where its row's reservation
            # ends. A row holds exactly the pages its reservation covers, so the pages
            # needed are the pages the new reservations cover less those held: for one
            # token each, one page per row whose reservation fills whole pages.
            starts = start_tokens
            one_token = single_inputs
            if one_token:
                offsets = [start % ps for start in start_tokens]
                opened = offsets.count(0)
                need = len(restoring) + opened
            else:
                need = len(restoring) + _pages_covering(ends, ps) - _pages_covering(start_tokens, ps)
        else:
            starts, ends, need, one_token = self._check_items(slots, rows, items, start_tokens, restoring)
        self._require_free(l1, need)
        # Every precondition held: from here on nothing fails.
        for intent in intents:
            if isinstance(intent, Restore):
                self._start_transfer(TransferKind.RESTORE, intent.extent.generation, self._restore_pages(intent.extent))
        map_slots: list[int] = []
        map_index: list[int] = []
        map_phys: list[int] = []
        if offsets is not None:
            # A decode step: every reservation grows by one token, and only the rows whose
            # new token opens a page (offset 0, found by `list.index` in C) get one, in
            # plan order, so the allocator hands out the same pages as item by item.
            for slot, end in zip(rows, ends):
                slot.reserved_tokens = end
                slot.produced += 1
            if opened:
                names, map_phys = self._new_pages(opened)
                position = -1
                for name in names:
                    position = offsets.index(0, position + 1)
                    row = rows[position].pages
                    map_slots.append(slots[position])
                    map_index.append(len(row))
                    row.append(name)
        else:
            for slot_id, slot, item, end in zip(slots, rows, items, ends):
                slot.reserved_tokens = end
                slot.produced += 1
                if special and item.append_previous_output:
                    slot.appended += 1
                row = slot.pages
                if end <= len(row) * ps:  # the row's pages hold the new tokens: nothing to map
                    continue
                if special and item.attach:
                    first = len(row)
                    for extent in item.attach:
                        for page in extents[extent.generation].pages:
                            pages[page].holders += 1
                            row.append(page)
                    for index in range(first, len(row)):
                        map_slots.append(slot_id)
                        map_index.append(index)
                        map_phys.append(pages[row[index]].copies[l1].phys)
                grow = -(-end // ps) - len(row)
                if grow > 0:
                    names, phys = self._new_pages(grow)
                    map_slots += [slot_id] * grow
                    map_index += range(len(row), len(row) + grow)
                    map_phys += phys
                    row += names
        batch_id = st.next_batch
        st.batches[batch_id] = Batch(plan, "prepared", slot_set, slots, starts, ends, start_tokens, requests, rows, one_token)
        st.next_batch += 1
        self._commit()
        self._write_req_to_token(map_slots, map_index, map_phys)
        self._launch_started()
        return PreparedBatchHandle(self.runtime_id, st.epoch, batch_id)

    def _check_items(
        self, slots: list[int], rows: list[Slot], items: tuple[BatchItem, ...], start_tokens: list[int], restoring: set[int]
    ) -> tuple[list[int], list[int], int, bool]:
        """Per item, in plan order: its tokens, attach, append and row size. (starts, ends, L1 pages needed, one token each)."""
        ps, max_tokens, pages, extents, l1 = self.page_size, self.max_request_tokens, self._state.pages, self._state.extents, Tier.L1
        starts: list[int] = []
        ends: list[int] = []
        need = len(restoring)
        one_token = True
        for slot_id, slot, item, reserved in zip(slots, rows, items, start_tokens):
            row_pages = len(slot.pages)
            append = item.append_previous_output
            new_tokens = len(item.input_ids) + 1 if append else len(item.input_ids)
            if new_tokens != 1:
                if new_tokens < 1:
                    raise InvalidPlan(f"slot {slot_id}: an item must compute at least one token")
                one_token = False
            end = reserved + new_tokens
            if item.attach:
                if reserved:
                    raise InvalidPlan(f"slot {slot_id}: attach is only allowed on an empty row")
                if append and slot.produced <= slot.appended:
                    raise RequestBusy(f"slot {slot_id}: no previous output to append")
                attached = referenced = 0
                for extent in item.attach:
                    extent_pages = extents[extent.generation].pages
                    for page in extent_pages:
                        if l1 not in pages[page].copies and page not in restoring:
                            raise NotResident(f"page {page} of an attached extent has no device copy and no restore")
                    attached += len(extent_pages)
                    referenced += extent.page_count
                end += attached * ps
                need -= referenced
            elif append and slot.produced <= slot.appended:
                raise RequestBusy(f"slot {slot_id}: no previous output to append")
            if end > max_tokens:
                raise RowFull(f"slot {slot_id}: {end} tokens > max_request_tokens {max_tokens}")
            starts.append(end - new_tokens)
            ends.append(end)
            need += -(-end // ps) - row_pages
        return starts, ends, need, one_token

    @operation
    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """Wait for the restores compute reads (O1), compute, apply the intents, return outputs."""
        st = self._state
        record = self._batch(batch)
        self._check_execute_once(batch, record)
        self._check_execute_order(batch, record)
        plan = record.plan
        intents = plan.intents
        # The intents below can still fail after the items changed the state: journal then.
        undo = self._journal if any(not isinstance(intent, Restore) for intent in intents) else None
        ps, pages = self.page_size, st.pages
        l1 = Tier.L1
        believed = st.pools[l1].believed
        # Pages that in-flight restores fill, indexed once: an item waits only if its row has one.
        restoring = self._restoring_pages()
        version = st.next_version
        ready: list[int] = []
        slots, starts, ends = record.slots, record.starts, record.ends
        rows = record.rows
        if restoring:
            for slot, end in zip(rows, ends):
                read = slot.pages[: -(-end // ps)]
                if not restoring.isdisjoint(read):
                    ready += self._await_restores(set(read))
                    restoring = self._restoring_pages()
        if record.one_token and undo is None:  # decode steps: one token per item, nothing to journal
            first_tags: range | list[int] = range(version, version + len(rows))
            for slot, start, end, tag in zip(rows, starts, ends, first_tags):
                page = pages[slot.pages[start // ps]]
                offset = start % ps
                page.versions[offset] = tag
                believed[page.copies[l1].phys * ps + offset] = tag
                slot.num_tokens = end
            version += len(rows)
        else:
            first_tags = []
            for slot, start, end in zip(rows, starts, ends):
                row = slot.pages
                position = start
                first_tags.append(version)
                while position < end:
                    index, offset = divmod(position, ps)
                    count = min(ps - offset, end - position)
                    page = pages[row[index]]
                    at = page.copies[l1].phys * ps + offset
                    new = range(version, version + count)
                    if undo is not None:
                        undo.append(functools.partial(_restore_tags, page.versions, offset, page.versions[offset : offset + count], believed, at, believed[at : at + count]))
                    page.versions[offset : offset + count] = array("q", new)
                    believed[at : at + count] = new
                    position += count
                    version += count
                if undo is not None:
                    undo.append(functools.partial(setattr, slot, "num_tokens", slot.num_tokens))
                slot.num_tokens = end
        items = ComputeBatch(slots, starts, ends, first_tags, plan.items, rows)
        if undo is not None:
            undo.append(functools.partial(setattr, st, "next_version", st.next_version))
        st.next_version = version
        self._finish_batch(batch.batch_id, "executed")
        published, tickets = [], []
        if undo is not None:
            last = max(i for i, intent in enumerate(intents) if not isinstance(intent, Restore))
            for i, intent in enumerate(intents):
                if isinstance(intent, Restore):
                    continue
                if i == last:
                    self._journal = None  # the last intent checks before it changes anything
                outcome = self._apply_intent(intent, batch_id=batch.batch_id)
                if isinstance(intent, Publish):
                    published.append(outcome)
                elif isinstance(intent, Backup):
                    tickets.append(outcome)
        launched = self._launched
        kv_ready = [launched[t] for t in ready if t in launched]
        self._commit()
        tokens = self._run_compute(items, kv_ready)
        for slot, token in zip(rows, tokens):
            slot.last_output = token
        results = _item_results(record.requests, record.ends, tokens)
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
        for slot_id, item, reserved in zip(record.slots, record.plan.items, record.start_tokens):
            slot = st.slots[slot_id]
            keep = -(-reserved // self.page_size)  # the pages the row held: those its reservation covered
            for page in slot.pages[keep:]:
                self._drop_holder(page)
            del slot.pages[keep:]
            slot.reserved_tokens = reserved
            slot.produced -= 1
            slot.appended -= int(item.append_previous_output)
        self._finish_batch(batch.batch_id, "cancelled")

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
        for number, intent in enumerate(intents, 1):
            if number == len(intents):
                self._journal = None  # the last intent checks before it changes anything
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
        if self._d2h_queue:
            self._pump_d2h(pieces=1)
            self._executed_since_pump = False
        return tuple(tickets)

    @operation(journal=False)
    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        """Retire the transfers whose events are done (dependencies first); report each once."""
        st = self._state
        if self._d2h_queue and not self._executed_since_pump:
            self._pump_d2h(pieces=1)  # no batch ran since the last poll: the D2H still moves on
        self._executed_since_pump = False
        launched = self._launched
        done = {t for t in st.transfers if t in launched and launched[t].event.query()}
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
        """Block until every transfer has finished, retire them all, report as poll does.

        The retire bookkeeping (per page: its tags and its copy made valid) runs before the
        host blocks on the copies' events, so on CUDA it overlaps the copies' tail instead
        of following it. It is journaled: if blocking fails (a CUDA copy error surfaces at
        the event, or the wait is interrupted), the retires are undone and every transfer
        is still in flight. The completions are handed over only once every event is done.
        """
        st = self._state
        self._pump_d2h()  # everything queued, now (device work: not undone)
        pending = [self._launched[t] for t in sorted(st.transfers)]
        for launched in pending:
            launched.result.result()  # a copy that raised at launch (or, on CPU, while it ran) surfaces here
        while st.transfers:
            self._retire(next(t for t in sorted(st.transfers) if not st.transfers[t].waits_for & st.transfers.keys()))
        for launched in pending:
            launched.event.synchronize()
        return self._report()

    def _report(self) -> tuple[TransferCompletion, ...]:
        """Hand over the unreported completions, ordered by transfer id (the timing is ours, the order is not)."""
        st = self._state
        if not st.unreported:
            return ()
        reported = tuple(sorted(st.unreported, key=lambda c: c.ticket.transfer_id))
        self._undo(functools.partial(setattr, st, "unreported", st.unreported))
        st.unreported = []
        return reported

    @operation
    def restart(self) -> RuntimeInfo:
        """Drain and discard transfers, forget everything, bump the epoch: every handle goes stale."""
        st = self._state
        self._pump_d2h()
        for stream in (self._compute, self._h2d, self._d2h):
            stream.synchronize()
        generations = [slot.generation + int(slot.live) for slot in st.slots]
        believed = {tier: pool.believed for tier, pool in st.pools.items()}
        self._state = fresh_state(st.epoch + 1, generations, believed, self.page_size, st.next_version)
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
        ps = self.page_size
        empty = (0,) * ps

        def copy_tags(page: Page, tier: Tier) -> tuple[int, ...]:
            if tier not in page.copies:
                return empty
            phys = page.copies[tier].phys
            return tuple(tags[tier][phys * ps : (phys + 1) * ps])

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
                sorted(
                    [BatchView(b, state, slots, ()) for b, (state, slots) in st.finished.items()]
                    + [
                        BatchView(b, rec.state, tuple(sorted(rec.slot_set)), tuple(p for s in sorted(rec.slot_set) for p in st.slots[s].pages))
                        for b, rec in st.batches.items()
                    ],
                    key=lambda view: view.batch_id,
                )
            ),
            transfers=tuple(
                TransferView(t, tr.kind, tuple(p for p, _, _ in tr.pages), tuple(s for _, s, _ in tr.pages), tuple(d for _, _, d in tr.pages))
                for t, tr in sorted(st.transfers.items())
            ),
            boundary_calls=tuple(sorted(st.calls.items())),
        )

    def _read_tags(self) -> dict[Tier, list[int]]:
        """Every physical page's tags, decoded from the bytes, read after the compute stream's work (flat, as `Pool.believed`)."""
        runner, memory = self._runner, self._memory
        result = self._compute.submit(
            lambda: {
                Tier.L1: runner.page_tags(memory.read_l1(list(range(self.l1_pages)))),
                Tier.L2: runner.page_tags(memory.read_l2(list(range(self.l2_pages)))),
            }
        )
        self._compute.record().synchronize()
        return {tier: tensor.flatten().tolist() for tier, tensor in result.result().items()}

    # ---------------------------------------------------------------------------------
    # Transactions
    # ---------------------------------------------------------------------------------

    def _commit(self) -> None:
        """Every precondition held: keep the bookkeeping, count the call (B1), forget retired events."""
        self._committed = True
        self._journal = None  # nothing after the commit is undone
        self._state.calls[self._operation] += 1
        if self._launched:
            transfers = self._state.transfers
            self._launched = {t: launched for t, launched in self._launched.items() if t in transfers}

    def _rollback(self, saved: list[Callable[[], None]]) -> None:
        """A call failed before committing: undo its journal `saved`, newest change first."""
        for undo in reversed(saved):
            undo()
        saved.clear()
        self._to_launch = []

    def _undo(self, fn: Callable[[], None]) -> None:
        """Journal `fn`, which reverts the change about to be made (only before the commit).

        Loops over pages test `self._journal` themselves and journal one entry per loop
        (or none outside a transaction), so that a call costs no closure per page.
        """
        if self._journal is not None:
            self._journal.append(fn)

    def _finish_batch(self, batch_id: int, state: str) -> None:
        """The batch is executed or cancelled: keep only its outcome (state and slots)."""
        st = self._state
        record = st.batches.pop(batch_id)
        slot_set = record.slot_set
        slots = self._slot_sets.get(slot_set)
        if slots is None:
            if len(self._slot_sets) >= _INTERNED_SLOT_SETS:
                self._slot_sets.clear()  # only the sharing of older tuples is lost
            slots = self._slot_sets[slot_set] = tuple(sorted(slot_set))
        st.finished[batch_id] = (state, slots)
        self._undo(functools.partial(_unfinish, st, batch_id, record))

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

    def _check_item_handles(self, items: tuple[BatchItem, ...], all_slots: list[Slot]) -> tuple[list[int], list[Slot], bool]:
        """`_slot` of every item's request (and `_extent` of its attached refs), in plan order.

        Returns the slot ids, their records, and whether any item attaches or appends. The
        same guards as `_slot`, called the same way, with two savings: `_check_origin`
        depends only on the handle's runtime id and epoch and on the runtime's epoch, which
        no check changes, so it runs again only when a handle names another pair than the
        one it last accepted (every handle of a step normally names the same one); and
        `_check_generation` runs only for a handle whose generation is not its live slot's
        current one (the only handles it can refuse).
        """
        check_origin, check_generation, extent_of = self._check_origin, self._check_generation, self._extent
        count = len(all_slots)
        accepted_id: Any = None
        accepted_epoch: Any = None
        slots, rows = [], []
        special = False
        for item in items:
            request = item.request
            if type(request) is not RequestRuntimeHandle and not isinstance(request, RequestRuntimeHandle):
                raise UnknownHandle(f"expected a RequestRuntimeHandle, got {type(request).__name__}")
            runtime_id, epoch, slot_id = request.runtime_id, request.epoch, request.slot_id
            if epoch != accepted_epoch or runtime_id != accepted_id or accepted_id is None:
                check_origin("request handle", runtime_id, epoch)
                accepted_id, accepted_epoch = runtime_id, epoch
            if not 0 <= slot_id < count:
                raise UnknownHandle(f"slot {slot_id} does not exist")
            slot = all_slots[slot_id]
            if request.generation != slot.generation or not slot.live:
                check_generation(request, slot)
            if item.attach:
                special = True
                for extent in item.attach:
                    extent_of(extent)
            elif item.append_previous_output:
                special = True
            slots.append(slot_id)
            rows.append(slot)
        return slots, rows, special

    def _check_extent_issued(self, extent: CacheExtentRef, record: Extent | None) -> None:
        if record is None:
            if 0 < extent.generation < self._state.next_extent:
                raise StaleHandle(f"extent {extent.generation} was released or split")
            raise UnknownHandle(f"extent {extent.generation} was never published")
        if record.runs != extent.page_runs and record.runs != tuple(extent.page_runs):
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
        st = self._state
        record = st.batches.get(batch.batch_id)
        if record is None:
            finished = st.finished.get(batch.batch_id)
            if finished is None:
                raise UnknownHandle(f"batch {batch.batch_id} was never prepared")
            state, slots = finished
            return Batch(None, state, frozenset(slots))
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
            if b != in_batch and rec.state == "prepared" and request.slot_id in rec.slot_set:
                raise RequestBusy(f"request in slot {request.slot_id} is in prepared batch {b}")

    def _check_execute_once(self, batch: PreparedBatchHandle, record: Batch) -> None:
        if record.state == "executed":
            raise AlreadyExecuted(f"batch {batch.batch_id} was executed already")
        if record.state == "cancelled":
            raise NotPrepared(f"batch {batch.batch_id} was cancelled")

    def _check_execute_order(self, batch: PreparedBatchHandle, record: Batch) -> None:
        for other_id, other in self._state.batches.items():
            if other_id < batch.batch_id and other.state == "prepared" and not record.slot_set.isdisjoint(other.slot_set):
                raise OutOfOrder(f"batch {other_id} shares a request with batch {batch.batch_id} and has not executed")

    def _check_cancel_order(self, batch: PreparedBatchHandle, record: Batch) -> None:
        for other_id, other in self._state.batches.items():
            if other_id > batch.batch_id and other.state == "prepared" and not record.slot_set.isdisjoint(other.slot_set):
                raise BatchDependency(f"batch {other_id} shares a request with batch {batch.batch_id}")

    def _check_demote_unmapped(self, record: Extent) -> None:
        mine = set(record.pages)
        held = {p for slot in self._state.slots if slot.live and not mine.isdisjoint(slot.pages) for p in slot.pages} & mine
        if held:
            raise ExtentInUse(f"pages {sorted(held)} are mapped into live request rows")

    # ---------------------------------------------------------------------------------
    # Pages, holders and free lists
    # ---------------------------------------------------------------------------------

    def _require_free(self, tier: Tier, needed: int) -> None:
        free = len(self._state.pools[tier].free)
        if needed > free:
            raise OutOfPages(tier, needed, free)

    def _take_phys(self, tier: Tier, count: int) -> list[int]:
        """The first `count` physical pages of `tier`'s free list, taken off it (the caller checked there are enough)."""
        free = self._state.pools[tier].free
        taken = [free.popleft() for _ in range(count)]
        if self._journal is not None:
            self._journal.append(functools.partial(free.extendleft, taken[::-1]))
        return taken

    def _new_pages(self, count: int) -> tuple[range, list[int]]:
        """`count` new page names, each with one holder and a valid device copy: (names, their device pages).

        The device pages come off the free list in one take, in the order the names are
        given, so a step that opens many pages pays one allocator call.
        """
        st = self._state
        first = st.next_page
        phys = self._take_phys(Tier.L1, count)
        names = range(first, first + count)
        st.next_page = first + count
        pages, no_versions, l1 = st.pages, self._no_versions, Tier.L1
        for name, location in zip(names, phys):
            pages[name] = Page(1, no_versions[:], {l1: _new_copy(Copy, (location, False))})
        self._undo(functools.partial(_forget_pages, st, names))
        return names, phys

    def _transfers_on(self, tier: Tier, phys: int) -> set[int]:
        """Transfers not yet retired that read or write physical page `phys` of `tier`."""
        transfers = self._state.transfers
        if not transfers:
            return set()
        key = _touch_key(tier, phys)
        return {t for t, tr in transfers.items() if key in tr.touched}

    def _free_phys(self, tier: Tier, phys: int) -> None:
        pool = self._state.pools[tier]
        blocking = self._transfers_on(tier, phys)
        journal = self._journal
        if blocking:
            pool.deferred[phys] = blocking
            if journal is not None:
                journal.append(functools.partial(pool.deferred.pop, phys))
        else:
            pool.free.append(phys)
            if journal is not None:
                journal.append(pool.free.pop)

    def _drop_copy(self, name: int, tier: Tier) -> None:
        copies = self._state.pages[name].copies
        copy = copies.pop(tier)
        if self._journal is not None:
            self._journal.append(functools.partial(copies.__setitem__, tier, copy))
        self._free_phys(tier, copy.phys)

    def _drop_holder(self, name: int) -> None:
        pages = self._state.pages
        page = pages[name]
        page.holders -= 1
        self._undo(functools.partial(_add_holder, page))
        if page.holders == 0:
            for tier in list(page.copies):
                self._drop_copy(name, tier)
            del pages[name]
            self._undo(functools.partial(pages.__setitem__, name, page))

    def _release_ref(self, generation: int) -> None:
        extents = self._state.extents
        record = extents[generation]
        record.refcount -= 1
        self._undo(functools.partial(setattr, record, "refcount", record.refcount + 1))
        if record.refcount == 0:
            del extents[generation]
            self._undo(functools.partial(extents.__setitem__, generation, record))
            for page in record.pages:
                self._drop_holder(page)

    def _retire_slot(self, slot: Slot) -> None:
        self._undo(functools.partial(_set_fields, slot, live=slot.live, generation=slot.generation))
        slot.live = False
        slot.generation += 1

    # ---------------------------------------------------------------------------------
    # Extents and intents
    # ---------------------------------------------------------------------------------

    def _new_extent(self, pages: tuple[int, ...]) -> CacheExtentRef:
        st = self._state
        generation, st.next_extent = st.next_extent, st.next_extent + 1
        runs = pageruns.coalesce(pages)
        st.extents[generation] = Extent(tuple(pages), 1, runs)
        self._undo(functools.partial(_forget_extent, st, generation))
        return CacheExtentRef(self.runtime_id, st.epoch, generation, runs)

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
            record = self._state.pages[page]
            record.holders += 1
            self._undo(functools.partial(_drop_holder_count, record))
        return self._new_extent(pages)

    def _close(self, request: RequestRuntimeHandle, in_batch: int | None) -> None:
        slot = self._slot(request)
        self._check_not_busy(request, in_batch)
        self._retire_slot(slot)
        self._slot_changes += 1
        for page in slot.pages:
            self._drop_holder(page)
        self._undo(functools.partial(_set_fields, slot, pages=slot.pages, num_tokens=slot.num_tokens, reserved_tokens=slot.reserved_tokens))
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
        pages, l1, l2 = self._state.pages, Tier.L1, Tier.L2
        todo = []
        for page in self._state.extents[extent.generation].pages:
            copies = pages[page].copies
            if l1 in copies:
                continue
            if l2 not in copies:
                raise NotBackedUp(f"page {page} has neither a device nor a host copy")
            todo.append(page)
        return todo

    def _start_transfer(self, kind: TransferKind, generation: int, pages: list[int]) -> TransferTicket:
        """Name the transfer, give each page a filling destination copy; the device work starts at commit."""
        st = self._state
        transfer_id, st.next_transfer = st.next_transfer, st.next_transfer + 1
        self._undo(functools.partial(setattr, st, "next_transfer", transfer_id))
        record = Transfer(kind, generation, [], set(), TransferTicket(self.runtime_id, st.epoch, transfer_id, kind, generation, len(pages)))
        src_tier, dst_tier = record.tiers
        all_pages, moved = st.pages, record.pages
        given: list[dict] = []  # the copies dicts that got a destination copy, for the undo
        for name, destination in zip(pages, self._take_phys(dst_tier, len(pages))):
            copies = all_pages[name].copies
            source = copies[src_tier]
            if source.filling:
                record.waits_for |= self._transfers_on(src_tier, source.phys)
            copies[dst_tier] = _new_copy(Copy, (destination, True))
            given.append(copies)
            moved.append((name, source.phys, destination))
        if self._journal is not None:
            self._journal.append(functools.partial(_forget_copies, given, dst_tier))
        record.touched = _touch_keys(src_tier, [src for _, src, _ in moved]) | _touch_keys(dst_tier, [dst for _, _, dst in moved])
        st.transfers[transfer_id] = record
        self._undo(functools.partial(st.transfers.pop, transfer_id))
        if pages:
            self._to_launch.append(transfer_id)
        else:
            self._retire(transfer_id)
        return record.ticket

    def _retire(self, transfer_id: int) -> None:
        """The transfer's copies are valid; deferred frees it blocked run; its completion is queued."""
        st = self._state
        undo = self._undo
        record = st.transfers.pop(transfer_id)
        undo(functools.partial(st.transfers.__setitem__, transfer_id, record))
        src_tier, dst_tier = record.tiers
        believed_src, believed_dst, ps = st.pools[src_tier].believed, st.pools[dst_tier].believed, self.page_size
        journal, all_pages = self._journal, st.pages
        if journal is not None:
            old_tags = [(dst * ps, believed_dst[dst * ps : (dst + 1) * ps]) for _, _, dst in record.pages]
            journal.append(functools.partial(_unretire, believed_dst, old_tags, []))
            made_valid = journal[-1].args[2]
        for name, src, dst in record.pages:
            believed_dst[dst * ps : (dst + 1) * ps] = believed_src[src * ps : (src + 1) * ps]
            page = all_pages.get(name)
            target = page.copies.get(dst_tier) if page else None
            if target is not None and target.phys == dst:
                if journal is not None:
                    made_valid.append((page.copies, dst_tier, target))
                page.copies[dst_tier] = _new_copy(Copy, (dst, False))
        for tier in (Tier.L1, Tier.L2):
            pool = st.pools[tier]
            if not pool.deferred:
                continue
            for phys in sorted(pool.deferred):
                waiting = pool.deferred[phys]
                if transfer_id not in waiting:
                    continue
                waiting.discard(transfer_id)
                undo(functools.partial(waiting.add, transfer_id))
                if not waiting:
                    del pool.deferred[phys]
                    pool.free.append(phys)
                    undo(functools.partial(_unfree_deferred, pool, phys, waiting))
        st.unreported.append(TransferCompletion(record.ticket))
        undo(st.unreported.pop)

    def _restoring_pages(self) -> set[int]:
        """Page names that restores not yet retired fill (empty, and cheap, when none is in flight)."""
        transfers = self._state.transfers
        if not transfers:
            return set()
        restore = TransferKind.RESTORE
        return {p for tr in transfers.values() if tr.kind is restore for p, _, _ in tr.pages}

    def _await_restores(self, pages: set[int]) -> list[int]:
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

    def _write_req_to_token(self, slots: list[int], page_index: list[int], phys: list[int]) -> None:
        """Map row page `page_index[i]` of slot `slots[i]` to physical page `phys[i]` in ReqToToken.

        One indexed store on the compute stream writes every mapped page's `page_size`
        token locations (`phys * page_size + offset`); the index reaches the device in one
        pinned, non-blocking copy. Compute reads the table in stream order after this, so
        no event is needed.
        """
        if not slots:
            return
        table, offsets, page_size, device = self._table_pages, self._page_offsets, self.page_size, self.device

        def write() -> None:
            index = to_device([slots, page_index, phys], torch.int64, device)
            table[index[0], index[1]] = (index[2, :, None] * page_size + offsets).to(torch.int32)

        self._compute.submit(write)

    def _launch_started(self) -> None:
        """Issue the transfers this call started, in id order, each on its stream."""
        for transfer_id in self._to_launch:
            self._launch(transfer_id, self._state.transfers[transfer_id])
        self._to_launch = []

    def _launch(self, transfer_id: int, record: Transfer) -> None:
        backup = record.kind is TransferKind.BACKUP
        stream = self._d2h if backup else self._h2d
        if self._d2h_queued and not record.waits_for.isdisjoint(self._d2h_queued):
            self._pump_d2h(until=max(record.waits_for & self._d2h_queued))  # a restore reads a queued backup's host copy
        deps = [self._launched[w] for w in sorted(record.waits_for) if w in self._launched]
        sources = [src for _, src, _ in record.pages]
        destinations = [dst for _, _, dst in record.pages]
        if backup and self._d2h_piece_pages is not None:
            size, count = self._d2h_piece_pages, len(sources)
            for first in range(0, count, size):
                last = first + size >= count
                self._d2h_queue.append(_Piece(transfer_id, sources[first : first + size], destinations[first : first + size], deps if first == 0 else None, last))
            self._d2h_queued.add(transfer_id)
            self._d2h_results[transfer_id] = []
            return
        self._wait_transfer_deps(stream, deps)
        if backup:
            self._wait_compute(stream)
        delay = self._delay[TransferKind.BACKUP if backup else TransferKind.RESTORE]
        if delay:
            stream.sleep(delay)
        move = self._memory.backup if backup else self._memory.restore
        result = stream.submit(lambda: move(sources, destinations))
        self._launched[transfer_id] = Launched(stream.record(), result)

    def _pump_d2h(self, pieces: int | None = None, until: int | None = None) -> None:
        """Issue queued backup pieces in order: `pieces` of them, through transfer `until`, or all."""
        queue, stream, move = self._d2h_queue, self._d2h, self._memory.backup
        while queue and (pieces is None or pieces > 0):
            piece = queue.popleft()
            if pieces is None:  # draining: the rest of this backup goes as one copy, not piece by piece
                while queue and queue[0].transfer == piece.transfer:
                    more = queue.popleft()
                    piece = piece._replace(sources=piece.sources + more.sources, destinations=piece.destinations + more.destinations, last=more.last)
            if piece.deps is not None:
                self._wait_transfer_deps(stream, piece.deps)
            self._wait_compute(stream)  # O2: after the latest compute recorded, hence after the one that wrote the pages
            if piece.deps is not None and self._delay[TransferKind.BACKUP]:
                stream.sleep(self._delay[TransferKind.BACKUP])
            results = self._d2h_results[piece.transfer]
            results.append(stream.submit(functools.partial(move, piece.sources, piece.destinations)))
            if piece.last:
                del self._d2h_results[piece.transfer]
                self._d2h_queued.discard(piece.transfer)
                self._launched[piece.transfer] = Launched(stream.record(), _Results(results))
                if until is not None and piece.transfer >= until:
                    return
            if pieces is not None:
                pieces -= 1

    def _run_compute(self, items: ComputeBatch, kv_ready: list[Launched]) -> list[int]:
        """Run the batch on the compute stream after its restores; record the event backups wait on."""
        self._wait_kv_ready(kv_ready)
        runner, memory, table = self._runner, self._memory, self._table
        result = self._compute.submit(lambda: runner.forward(memory, table, items))
        issue = self._d2h_issue
        if issue == "under_compute" and self._d2h_queue:
            # Every queued piece belongs to a backup started before this batch, so the
            # compute event its D2H waits for (O2) is still the previous batch's: the copy
            # runs under this compute.
            self._pump_d2h(pieces=1)
        self._compute_event = self._compute.record()
        self._launch_started()
        if issue == "after_compute" and self._d2h_queue:
            self._pump_d2h(pieces=1)  # waits for this batch's compute event
        self._executed_since_pump = True
        # Read the outputs in the compute stream's order: that one wait covers the batch.
        # On CPU the forward's own result is that point (its worker ran it in order).
        if self.device.type == "cuda":
            outputs = self._compute.submit(lambda: result.result().tolist()).result()
        else:
            outputs = result.result().tolist()
        if issue == "after_outputs" and self._d2h_queue:
            self._pump_d2h(pieces=1)  # the copy engine is free of this batch's output read
        return runner.finish(outputs, items)

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


def _pages_covering(tokens: list[int], page_size: int) -> int:
    """Sum over `tokens` of the pages each length covers, ceil(t / page_size)."""
    return sum(-(-t // page_size) for t in tokens)


_new_object = object.__new__
_new_copy = tuple.__new__  # `Copy(phys, filling)` without the NamedTuple's Python `__new__`
_set_request = ItemResult.__dict__["request"].__set__
_set_num_tokens = ItemResult.__dict__["num_tokens"].__set__
_set_next_token = ItemResult.__dict__["next_token"].__set__
#: At most this many slot sets keep an interned tuple: a server whose decode sets keep
#: changing would otherwise grow the table without end.
_INTERNED_SLOT_SETS = 1024
_exhaust = deque(maxlen=0).extend  # runs an iterator to its end in C, keeping nothing


def _item_results(requests: list[RequestRuntimeHandle], ends: list[int], tokens: list[int]) -> tuple[ItemResult, ...]:
    """`ItemResult(request, end, token)` for each item, built field by field through the slots.

    The values are the same frozen `ItemResult`s; building them column-wise skips the attrs
    `__init__` per item, which was a third of `execute_batch`'s per-item cost at B=256.
    """
    results = tuple(map(_new_object, repeat(ItemResult, len(requests))))
    for set_field, values in ((_set_request, requests), (_set_num_tokens, ends), (_set_next_token, tokens)):
        _exhaust(map(set_field, results, values))
    return results


class _Piece(NamedTuple):
    """A queued piece of a backup: its pages, the launches it waits for (first piece), whether last."""

    transfer: int
    sources: list[int]
    destinations: list[int]
    deps: list[Launched] | None
    last: bool


class _Results:
    """The results of a backup's pieces: `result()` surfaces the first error of any."""

    def __init__(self, results: list[Result]):
        self._results = results

    def result(self) -> None:
        for result in self._results:
            result.result()


def _close_streams(streams: tuple[Stream, ...]) -> None:
    """Stop the streams after their queued work (at `close`, collection or interpreter exit)."""
    for stream in streams:
        stream.close()


# -------------------------------------------------------------------------------------
# Undo steps (journal entries; module functions so that journaling one costs a partial)
# -------------------------------------------------------------------------------------


def _touch_key(tier: Tier, phys: int) -> int:
    """`(tier, phys)` as one int, so that a transfer's touched pages are a set of ints."""
    return 2 * phys + (tier is Tier.L2)


def _touch_keys(tier: Tier, phys: list[int]) -> set[int]:
    """`_touch_key(tier, p)` of every `p` in `phys`, in one comprehension (a transfer moves hundreds)."""
    bit = int(tier is Tier.L2)
    return {2 * p + bit for p in phys}


def _set_fields(record: Any, **values: Any) -> None:
    for name, value in values.items():
        setattr(record, name, value)


def _add_holder(page: Page) -> None:
    page.holders += 1


def _drop_holder_count(page: Page) -> None:
    page.holders -= 1


def _forget_pages(state: State, names: range) -> None:
    for name in names:
        del state.pages[name]
    state.next_page = names.start


def _forget_extent(state: State, generation: int) -> None:
    del state.extents[generation]
    state.next_extent = generation


def _unfree_deferred(pool: Any, phys: int, waiting: set[int]) -> None:
    pool.free.pop()
    pool.deferred[phys] = waiting


def _unfinish(state: State, batch_id: int, record: Batch) -> None:
    del state.finished[batch_id]
    state.batches[batch_id] = record


def _forget_copies(given: list[dict], tier: Tier) -> None:
    for copies in reversed(given):
        copies.pop(tier)


def _unretire(believed: list[int], tags: list[tuple[int, list[int]]], made_valid: list[tuple[dict, Tier, Copy]]) -> None:
    for copies, tier, filling in reversed(made_valid):
        copies[tier] = filling
    for at, old in reversed(tags):
        believed[at : at + len(old)] = old


def _restore_tags(versions: array, offset: int, old_versions: list[int], believed: list[int], at: int, old_tags: list[int]) -> None:
    versions[offset : offset + len(old_versions)] = old_versions
    believed[at : at + len(old_tags)] = old_tags
