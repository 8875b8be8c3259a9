"""SGLang 0.5.23's real cache classes presented as a cacheruntime `RuntimeInterface`.

Factory: `conformance.adapters.sglang.adapter:make_runtime` (run from the repository
root, under `.venv-sglang/bin/python`; see notes.md). The adapter is a *translator*:
every protocol call becomes the SGLang calls a scheduler makes for it, and a check
happens only where SGLang makes it, so the conformance suite measures SGLang, not the
adapter. notes.md has the table operation -> SGLang methods reached, as recorded by
`tests/sglang/test_calls_reached.py` (which spies on SGLang's methods, so it cannot drift),
and the list of what has no SGLang counterpart.

The mapping, in short:

- request: a scheduler `Req` as the cache classes see it (a shell holding SGLang's own
  `ReqKvInfo`), given a row by `ReqToTokenPool.alloc([req])` and released by
  `ReqToTokenPool.free(req)`, which refuses a request that holds no row (a stale or
  double close) with SGLang's AssertionError, before anything changes. The handle names
  SGLang's pair (row, `req_generation[row]`), which makes it unique, and resolves through
  it; its slot and generation are the adapter's name for the pair, numbered as the
  contract numbers slots (the lowest name not live, one generation more than the name's
  last handle), since SGLang pops the highest free row and counts generations per row.
- pages: the adapter names device pages of `PagedTokenToKVPoolAllocator` (and host pages of
  the host pool) in the contract's order; SGLang has no page names.
- extent: an entry of SGLang's `RadixCache`. `publish` inserts the pages as
  `_insert_cache` does (the computed tokens' key cut by `RadixKey.page_aligned`, the row's
  `req_to_token` slice as the value; `RadixCache.insert`, under a namespace of its own:
  `RadixKey.extra_key`, so two extents over equal tokens are not merged) and takes a lock on
  the entry for the reference (`inc_lock_ref`, whose receipt the reference keeps);
  `retain` takes another lock, `release` drops one (`dec_lock_ref`), and
  an entry whose lock count reaches zero is evicted as `RadixCache.evict` evicts a leaf
  (`free_segment` of its pages, `_delete_leaf`). `attach` is the scheduler's prefix
  reuse: `match_prefix` of the entry's key and `inc_lock_ref` for the request, dropped at
  close. `split` is the tree's own node split (`match_prefix` of the first part's key).
  A release of a reference the adapter already released or split reaches the tree and the
  allocator unchanged: SGLang's tree entries carry no generation.
- batch: no batch layer in SGLang's cache classes: `prepare_batch` is the plan's load-backs
  and one `allocator.alloc` of the batch's new pages, admitted together on the allocator's
  free pages first (the scheduler's budget check), and `ReqToTokenPool.write` of each row.
- tier moves: `HiCacheController.write` (Backup), `load` + `start_loading` (Restore),
  `allocator.free` (Demote), `evict_host` (Drop), with `io_backend="direct"`; on CPU the
  copy runs inside the call; completions are SGLang's acks. On a unified tree with a host
  tier the tree owns them (its HiCache, `init_hicache`): Backup its `BackupKV` action, Demote
  `tree_core.demote`, Restore `load_back`, completions its per-step `check_hicache_events`;
  Drop has no per-entry counterpart there (`Unsupported`).

Capabilities claimed: `INTROSPECTION` (legacy tree only; probe.py: `probe()` read off SGLang's
allocator, rows, radix tree and host pool) and `L2` (when `l2_pages > 0`).

Errors: SGLang signals exhaustion by returning None (`alloc`, `write`, `load`); the adapter
translates exactly those into `OutOfSlots` / `OutOfPages`. Any SGLang exception (an
AssertionError, an IndexError) propagates unchanged. A protocol value the adapter cannot
translate into SGLang's arguments (a request handle, batch id or extent generation it never
issued, a ref with other page runs, an extent whose tree entry is gone, a Restore of a page
with no host copy) is `UnknownHandle`/`StaleHandle`/`NotBackedUp`, resolved for the whole
call before its first SGLang call, so such a refusal changes nothing.
"""

from __future__ import annotations

import functools
from array import array
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from cacheruntime import pageruns
from cacheruntime.protocol import (
    AbstractState,
    Backup,
    BatchCompletion,
    BatchPlan,
    BatchState,
    CacheExtentRef,
    Capability,
    Close,
    Demote,
    Drop,
    ForeignRuntime,
    InvalidPlan,
    ItemResult,
    NotBackedUp,
    NotResident,
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
from cacheruntime.recording import BOUNDARY_OPERATIONS

from .stack import build_stack

if TYPE_CHECKING:  # torch is imported where it is used: the adapter module loads without it
    import torch


@dataclass
class _Request:
    """One request as the scheduler holds it: SGLang's Req shell, its row and what it locked."""

    req: object  # SimpleNamespace(kv=ReqKvInfo()): what ReqToTokenPool.alloc/free read
    row: int
    pages: list[int] = field(default_factory=list)  # page names, in token order
    num_tokens: int = 0
    reserved: int = 0
    locks: list[object] = field(default_factory=list)  # tree nodes locked for this request (attach)
    receipts: list[object] = field(default_factory=list)  # each lock's receipt (unified trees; None on the legacy tree), parallel to locks


@dataclass
class _Page:
    device: int | None = None  # allocator page id
    host: int | None = None  # host pool page id


@dataclass
class _Extent:
    """A published extent: its page names and the tree entry that holds them."""

    pages: tuple[int, ...]
    node: object  # radix_cache.TreeNode
    key: object  # the RadixKey from the root down to the entry's end (match_prefix of it ends at the entry)
    refs: int = 1
    offset: int = 0  # pages of `key` above the entry (the first parts split off before it)
    receipts: list[object] = field(default_factory=list)  # the receipts of the locks its references hold (unified trees)


@dataclass
class _Batch:
    plan: BatchPlan
    ends: dict[int, int]
    starts: dict[int, tuple[int, int, int]]  # row -> (reserved tokens, page count, lock count) before
    slots: tuple[int, ...] = ()  # the slot names of its items, sorted (probe)
    state: BatchState = BatchState.PREPARED  # what probe() shows; no call checks it (SGLang has no batch identity)


class SGLangRuntime:
    """A `RuntimeInterface` over ReqToTokenPool, the paged allocator, RadixCache and HiCacheController."""

    def __init__(
        self,
        *,
        runtime_id: str = "sglang",
        page_size: int = 4,
        max_requests: int = 4,
        max_request_tokens: int = 64,
        l1_pages: int = 16,
        l2_pages: int = 32,
        vocab_size: int = 1 << 20,
        tree: str = "radix",
        write_policy: str = "write_through",
        sglang_checks: bool | str = True,
    ):
        # SGLang's cache classes never see a vocabulary (token ids reach only the model), so
        # `vocab_size` is the size of the model these pools would serve, stated as the
        # protocol asks; the adapter checks no token id against it.
        self.vocab_size = vocab_size
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
            tree=tree,
            write_policy=write_policy,
        )
        # A request handle names one use of a row: SGLang's own name for it is the pair
        # (row, req_generation[row]) (memory_pool.py: "readers detect row reuse by equality
        # with a generation they stored"), unique while req_generation stays monotonic. The
        # handle resolves through that pair to the Req of the use; no check is made on it.
        self.names: dict[RequestRuntimeHandle, tuple[int, int]] = {}  # every handle issued -> (row, req_generation)
        self.uses: dict[tuple[int, int], _Request] = {}  # (row, req_generation) -> the Req of that use
        self.live_slots: dict[int, RequestRuntimeHandle] = {}
        self.pages: dict[int, _Page] = {}
        self.extents: dict[int, _Extent] = {}  # live extents
        self.entries: dict[int, _Extent] = {}  # every extent issued: a released one still names its tree entry
        self.batches: dict[int, _Batch] = {}
        self.next_page = 0
        self.next_extent = 1
        self.next_batch = 0
        self.next_transfer = 0
        self.write_tickets: list[TransferTicket] = []  # parallel to ack_write_queue
        self.load_tickets: list[TransferTicket] = []  # parallel to ack_load_queue
        self.done: list[TransferCompletion] = []
        # The unified tree's HiCache (tree_hicache): each ticket's copy, by the tree node whose
        # write-through or load-back ack finishes it (UnifiedRadixCache.ongoing_write_through /
        # ongoing_load_back), in submission order.
        self.tree_tickets: list[tuple[str, object, TransferTicket]] = []
        # For probe() only, where SGLang has no counterpart (probe.py): the last handle of
        # each slot name, the batches finished in order, the version tags compute's
        # stand-in wrote (spec/protocol.md §1: one per token, from 1, items in plan order)
        # and the boundary calls that returned.
        self.slot_history: dict[int, RequestRuntimeHandle] = {}
        self.finished: list[int] = []
        self.versions: dict[int, list[int]] = {}
        self.next_version = 1
        self.calls: Counter = Counter()
        self._depth = 0
        self._probed: AbstractState | None = None  # SGLang's objects change only inside a boundary call
        # SGLang's scheduler-side invariant checks (checks.py), run after each boundary call:
        # by default those the adapter's use of SGLang satisfies on this tree (checks.RUN),
        # "all" adds the pool-conservation checks its overlapping extents fail, False none.
        from .checks import Checks, selected

        groups = selected(sglang_checks, tree, l2=bool(l2_pages))
        self.checks = Checks(self, groups) if groups else None

    # -- info --------------------------------------------------------------------------

    def info(self) -> RuntimeInfo:
        # probe() reads RadixCache's nodes; the Rust TreeCore exposes no node or lock count
        # (node_by_id raises NotImplementedError in 0.5.23): not claimed on the unified trees.
        caps = ({Capability.INTROSPECTION} if not self.sg.unified else set()) | ({Capability.L2} if self.l2_pages else set())
        return RuntimeInfo(
            self.runtime_id,
            0,
            self.page_size,
            self.max_requests,
            self.max_request_tokens,
            self.l1_pages,
            self.l2_pages,
            frozenset(caps),
            vocab_size=self.vocab_size,
        )

    # -- translation -----------------------------------------------------------------------

    def _own(self, what: str, ref) -> None:
        # Handles, extent refs and batch handles are values only the adapter issues (runtime
        # id, epoch 0: SGLang has neither); one from elsewhere names nothing in its tables.
        if ref.runtime_id != self.runtime_id:
            raise ForeignRuntime(f"{what} belongs to runtime {ref.runtime_id!r}, not {self.runtime_id!r}")
        if ref.epoch != 0:
            raise (StaleHandle if ref.epoch < 0 else UnknownHandle)(f"{what} has epoch {ref.epoch}; the adapter has only epoch 0")

    def _request(self, handle: RequestRuntimeHandle) -> _Request:
        """The Req of the row use a handle names (live or finished); a handle never issued names none."""
        self._own("request handle", handle)
        use = self.names.get(handle)
        if use is None:
            raise UnknownHandle(f"request handle {handle} was never issued: no SGLang Req stands for it")
        return self.uses[use]

    def _entry(self, ref: CacheExtentRef) -> _Extent:
        """The tree entry an extent ref was issued for, live or not (a lookup, no check)."""
        self._own("extent ref", ref)
        record = self.entries.get(ref.generation)
        if record is None:
            raise UnknownHandle(f"extent generation {ref.generation} was never issued")
        if tuple(ref.page_runs) != pageruns.coalesce(record.pages):
            raise UnknownHandle(f"extent generation {ref.generation}: page runs {ref.page_runs} were not issued with it")
        return record

    def _extent(self, ref: CacheExtentRef) -> _Extent:
        """A live extent: one whose tree entry the adapter can still turn into token indices."""
        record = self._entry(ref)
        if ref.generation not in self.extents:
            raise StaleHandle(f"extent generation {ref.generation} was released or split: its tree entry names no pages now")
        return record

    def _batch(self, handle: PreparedBatchHandle) -> _Batch:
        self._own("batch handle", handle)
        record = self.batches.get(handle.batch_id)
        if record is None:
            raise UnknownHandle(f"batch id {handle.batch_id} is not in the adapter's batch table")
        return record

    def _indices(self, page_ids) -> torch.Tensor:
        import torch

        ps = self.page_size
        return (torch.tensor(list(page_ids), dtype=torch.int64)[:, None] * ps + torch.arange(ps)).reshape(-1)

    def _device_indices(self, names) -> torch.Tensor:
        return self._indices(self.pages[n].device for n in names)

    def _host_indices(self, names) -> torch.Tensor:
        return self._indices(self.pages[n].host for n in names)

    def _page_ids(self, indices) -> list[int]:
        return (indices[:: self.page_size] // self.page_size).tolist()

    def _key(self, generation: int, tokens) -> object:
        """The radix key of an extent: its tokens (page name n stands as tokens n*ps .. n*ps+ps-1), in a namespace of its own, cut page-aligned as _insert_cache cuts it."""
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(token_ids=array("q", tokens), extra_key=f"cacheruntime-extent-{generation}").page_aligned(self.page_size)

    def _write_row(self, record: _Request) -> None:
        names = [p for p in record.pages if self.pages[p].device is not None]
        if names:
            idx = self._device_indices(names)
            pool = self.sg.req_to_token_pool
            pool.write((record.row, slice(0, len(idx))), idx.to(pool.req_to_token.dtype))

    def _named_elsewhere(self, exclude=None, rows: bool = True) -> set[int]:
        """Device pages SGLang's own state still names: tree entries (but `exclude`) and, with `rows`, live requests' rows."""
        tree: Any = self.sg.tree
        pool, ps = self.sg.req_to_token_pool, self.page_size
        named: set[int] = set()
        if self.sg.unified:  # every device value the tree holds (exclude is never a live node here)
            assert exclude is None, "the unified trees evict through SGLang's walk (_evict_unified)"
            named.update((tree.all_values_flatten()[::ps] // ps).tolist())
        stack = [] if self.sg.unified else list(tree.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not exclude and node.value is not None:
                named.update((node.value[::ps] // ps).tolist())
        for record in self.uses.values() if rows else ():
            if record.req.kv.holds_kv and record.req.kv.kv_allocated_len:
                named.update((pool.req_to_token[record.row, : record.req.kv.kv_allocated_len : ps] // ps).tolist())
        return named

    # -- eviction: RadixCache.evict's loop body, on the entries whose last lock went ----------

    def _evict_unlocked(self, node) -> None:
        """Evict `node` and then each parent left an unlocked leaf, as RadixCache.evict does.

        SGLang's tree never holds a page in two entries; protocol extents may overlap, so
        the free leaves out pages another entry or a live row still names (adapter
        limitation, notes.md).
        """
        tree = self.sg.tree
        if self.sg.unified:
            self._evict_unified()
            return
        while node is not tree.root_node and node.lock_ref <= 0 and not node.children:
            parent = node.parent
            if node.value is not None:
                keep = self._named_elsewhere(exclude=node)
                ps = self.page_size
                mask = [int(i) // ps not in keep for i in node.value]
                import torch

                freed = node.value[torch.tensor(mask, dtype=torch.bool)]
                self.sg.allocator.free_segment(freed, start_pos=0)
                gone = set(self._page_ids(freed))
                for page in self.pages.values():
                    if page.device in gone:
                        page.device = None
            tree._delete_leaf(node)
            self._drop_host_copies(node)
            node = parent

    def _evict_unified(self) -> None:
        """UnifiedRadixCache._evict_components' loop for the FULL component, on every leaf it picks.

        SGLang's own walk (`evict_device_start`/`evict_device_next_node`/`evict_device_leaf`)
        chooses the victims; the entries are evicted as soon as their last lock goes, so
        those are the entries whose last lock just went. Its device frees reach SGLang's free
        path (`FreeComponentDeviceSlot`), less the pages another entry or a live row still
        names, as for the legacy tree (adapter limitation, notes.md). With the tree's HiCache,
        `evict_device_leaf` demotes a backed-up entry (write-through and write-back) and, under
        write-back, hands an unbacked one back for the deferred backup-then-demote.
        """
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        tree: Any = self.sg.tree  # UnifiedRadixCache
        core, full = tree.tree_core, ComponentType.FULL
        quota = tree.evictable_size()
        if quota <= 0:
            return
        tracker = {full: 0}
        core.evict_device_start(full, quota)
        try:
            while True:
                node_id, progressed = tree._evict_device_next_node(full, tracker)
                if node_id is None:
                    if not progressed:
                        break
                    continue
                result = core.evict_device_leaf(node_id, tree.is_write_back)
                self._apply_tree_result(result, tracker)
                if result.backup_kv is not None:
                    # Write-back (HiCache on the unified tree): _evict_components' deferred
                    # demote, run the D->H backup, demote only on success.
                    if tree._execute_and_commit_kv_backup(result.backup_kv, write_back=True) > 0:
                        tree.writing_check(write_back=True)
                        self._apply_tree_result(core.demote(node_id), tracker)
                    else:
                        self._apply_tree_result(core.drop_subtree_no_host(node_id), tracker)
        finally:
            core.evict_device_end(full)

    def _apply_tree_result(self, result, tracker) -> None:
        """UnifiedRadixCache._apply_eviction_result for a TreeCore step, its device frees less the pages still named elsewhere.

        The free reaches SGLang's free path (`FreeComponentDeviceSlot`); the pages another
        entry or a live row still names are left out (adapter limitation, notes.md).
        """
        import torch

        from sglang.srt.mem_cache.unified_cache.cache_action import FreeComponentDeviceSlot
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        tree: Any = self.sg.tree
        ps, full = self.page_size, ComponentType.FULL
        frees = result.device_frees.pop(full, [])
        keep = self._named_elsewhere() if frees else set()
        kept = []
        for value in frees:
            mask = torch.tensor([int(i) // ps not in keep for i in value], dtype=torch.bool)
            kept.append(value[mask])
        tree._apply_eviction_result(result)
        if kept:
            tree._apply_cache_action(FreeComponentDeviceSlot(kept, component_type=full))
        tree._accumulate_tracker(tracker, result.tracker)
        gone = {p for v in kept for p in self._page_ids(v)} if kept else set()
        for page in self.pages.values():
            if page.device in gone:
                page.device = None

    def _lock(self, node) -> object:
        """Lock `node`; the receipt UnifiedRadixCache.dec_lock_ref takes back (None on the legacy tree), for the lock's holder to keep."""
        tree: Any = self.sg.tree
        receipt = tree.inc_lock_ref(node)
        return receipt.to_dec_params() if self.sg.unified else None

    def _drop_host_copies(self, node) -> None:
        """Host copies of the evicted entry's pages that no live extent names go too (HiRadixCache evicts the node's host value)."""
        names = {n for e in self.entries.values() if e.node == node for n in e.pages}
        live = {n for e in self.extents.values() if e.node != node for n in e.pages}
        live |= {n for h in self.live_slots.values() for n in self._request(h).pages}  # a live row keeps its page, host copy included
        gone = [n for n in sorted(names - live) if n in self.pages and self.pages[n].host is not None]
        if gone and self.sg.controller is not None:
            self.sg.controller.evict_host(self._host_indices(gone))
            for n in gone:
                self.pages[n].host = None

    def _unlock(self, node, receipt) -> None:
        """Unlock `node` with its holder's receipt, as the scheduler's `unlock(TreeLock)` does.

        A holder keeps a lock's receipt from its `_lock` until it gives the lock back, once
        (the scheduler sets `req.lock = None`). A holder with no lock left (a stale ref's)
        has no receipt: on the unified trees it passes the empty one, `DecLockRefParams()`,
        which SGLang's receipt check rejects ("the unified tree rejects such a receipt",
        base_prefix_cache.py); the legacy tree takes no receipt.
        """
        tree: Any = self.sg.tree
        if self.sg.unified:
            from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams

            tree.dec_lock_ref(node, receipt if receipt is not None else DecLockRefParams())
        else:
            tree.dec_lock_ref(node)
        self._evict_unlocked(node)

    # -- requests ------------------------------------------------------------------------

    def open_request(self) -> RequestRuntimeHandle:
        from sglang.srt.managers.schedule_batch import ReqKvInfo

        req = SimpleNamespace(kv=ReqKvInfo(), rid=f"cacheruntime-{len(self.names)}", beam_group=None)  # rid, beam_group: what the invariant checker reads
        rows = self.sg.req_to_token_pool.alloc([req])
        if rows is None:
            raise OutOfSlots(f"ReqToTokenPool has no free row (size {self.max_requests})")
        (row,) = rows
        # The handle's (slot, generation) is the adapter's name for the row use, numbered as
        # the contract numbers slots: the lowest name not live, and one generation more than
        # the name's last handle (which was closed, or the name would be live). SGLang pops
        # the highest free row and counts generations per row (report F6), so a name cannot
        # carry the row's generation without repeating: R(s0,g2) could stand for two uses.
        # The use itself is SGLang's pair (row, req_generation[row]), which the handle
        # resolves through (names, uses): a handle is unique because SGLang's pair is.
        slot = min(s for s in range(self.max_requests) if s not in self.live_slots)
        last = self.slot_history.get(slot)
        handle = RequestRuntimeHandle(self.runtime_id, 0, slot, 0 if last is None else last.generation + 1)
        use = (row, int(self.sg.req_to_token_pool.req_generation[row]))
        self.names[handle] = use
        self.uses[use] = _Request(req, row)
        self.live_slots[slot] = handle
        self.slot_history[slot] = handle
        return handle

    def close_request(self, request: RequestRuntimeHandle) -> None:
        record = self._request(request)
        # ReqToTokenPool.free asserts the Req holds a row before it changes anything (as
        # release_kv_cache asserts first): a stale or double close stops here.
        self.sg.req_to_token_pool.free(record.req)
        if self.live_slots.get(request.slot_id) == request:
            del self.live_slots[request.slot_id]
        # release_kv_cache: free the row's own KV (not what the tree holds), then unlock.
        own = [n for n in record.pages if self.pages[n].device is not None]
        tree_named = self._named_elsewhere() if own else set()
        free = [n for n in own if self.pages[n].device not in tree_named]
        if free:
            self.sg.allocator.free(self._device_indices(free))
            for n in free:
                self.pages[n].device = None
        record.req.kv.kv_allocated_len = 0
        # Host copies belong to tree entries in HiRadixCache; one the row kept after its
        # extent was released goes with the row, as the entry's eviction would have taken it.
        extent_named = {n for e in self.extents.values() for n in e.pages}
        hosted = [n for n in record.pages if self.pages[n].host is not None and n not in extent_named]
        if hosted and self.sg.controller is not None:
            self.sg.controller.evict_host(self._host_indices(hosted))
            for n in hosted:
                self.pages[n].host = None
        locks, receipts, record.locks, record.receipts = record.locks, record.receipts, [], []
        for node, receipt in zip(locks, receipts, strict=True):
            self._unlock(node, receipt)

    # -- batches -------------------------------------------------------------------------

    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        if not isinstance(plan, BatchPlan):
            raise InvalidPlan(f"expected a BatchPlan, got {type(plan).__name__}")
        ps = self.page_size
        # Translate every value of the plan first (no SGLang call yet).
        records = [self._request(item.request) for item in plan.items]
        for item in plan.items:
            for extent in item.attach:
                self._extent(extent)
        for intent in plan.intents:
            if isinstance(intent, (Publish, Close)):
                self._request(intent.request)
            elif isinstance(intent, Release):
                self._entry(intent.extent)
            else:
                self._extent(intent.extent)
        self._plan_restores([i for i in plan.intents if isinstance(i, Restore)])
        restored = {n for i in plan.intents if isinstance(i, Restore) for n in self._extent(i.extent).pages}
        for item in plan.items:
            for extent in item.attach:
                away = [n for n in self._extent(extent).pages if self.pages[n].device is None and n not in restored]
                if away:  # HiRadixCache's scheduler would load it back first: that load is the plan's Restore
                    raise NotResident(f"extent {extent.generation}: pages {away} have no device copy and the plan restores none")
        ends, starts, need = {}, {}, 0
        for item, record in zip(plan.items, records, strict=True):
            attached = sum(len(self._extent(e).pages) for e in item.attach)
            end = record.reserved + attached * ps + item.new_tokens
            starts[record.row] = (record.reserved, len(record.pages), len(record.locks))
            ends[record.row] = end
            need += -(-end // ps) - len(record.pages) - attached
        # The scheduler admits a batch only if its load-backs and new pages fit together
        # (PrefillAdder's token budget, before any allocation); the load and the alloc are
        # two allocator calls, so the budget is read before the first.
        loads = len({n for i in plan.intents if isinstance(i, Restore) for n in self._extent(i.extent).pages if self.pages[n].device is None})
        available = self.sg.allocator.available_size() // ps
        if loads + max(need, 0) > available:
            raise OutOfPages(Tier.L1, loads + max(need, 0), available)
        for intent in plan.intents:
            if isinstance(intent, Restore):
                self._restore(intent.extent)
        indices = self.sg.allocator.alloc(need * ps) if need > 0 else None
        if need > 0 and indices is None:
            raise OutOfPages(Tier.L1, need, self.sg.allocator.available_size() // ps)
        fresh = self._page_ids(indices) if need > 0 else []
        for item, record in zip(plan.items, records, strict=True):
            for extent in item.attach:  # the scheduler's prefix reuse: match, then lock for the request
                from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

                entry = self._extent(extent)
                node = self.sg.tree.match_prefix(MatchPrefixParams(key=entry.key)).last_device_node
                record.receipts.append(self._lock(node))
                record.locks.append(node)
                record.pages.extend(entry.pages)
            while len(record.pages) * ps < ends[record.row]:
                name, self.next_page = self.next_page, self.next_page + 1
                self.pages[name] = _Page(device=fresh.pop(0))
                record.pages.append(name)
            record.reserved = ends[record.row]
            record.req.kv.kv_allocated_len = len(record.pages) * ps
            self._write_row(record)
        batch_id, self.next_batch = self.next_batch, self.next_batch + 1
        self.batches[batch_id] = _Batch(plan, ends, starts, tuple(sorted({item.request.slot_id for item in plan.items})))
        return PreparedBatchHandle(self.runtime_id, 0, batch_id)

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        record = self._batch(batch)  # no state check: SGLang has no batch identity
        self._collect(block=True)  # compute waits for the loads (SGLang: layer_done_counter)
        results = []
        for item in record.plan.items:
            request = self._request(item.request)
            end = record.ends[request.row]
            for position in range(end - item.new_tokens, end):  # compute's stand-in: a version tag per token written
                if position // self.page_size >= len(request.pages):
                    break  # a cancelled batch executed (no batch identity, V7): its pages went with the cancel
                name = request.pages[position // self.page_size]
                self.versions.setdefault(name, [0] * self.page_size)[position % self.page_size] = self.next_version
                self.next_version += 1
            request.num_tokens = end
            results.append(ItemResult(item.request, request.num_tokens, None))
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
        self._finish(batch.batch_id, BatchState.EXECUTED)
        return BatchCompletion(batch, tuple(results), tuple(published), tuple(tickets))

    def _finish(self, batch_id: int, state: BatchState) -> None:
        self.batches[batch_id].state = state
        self.finished.append(batch_id)

    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        record = self._batch(batch)  # no state check: SGLang has no batch identity
        for item in record.plan.items:
            request = self._request(item.request)
            reserved, keep, locks = record.starts[request.row]
            attached = {n for node in request.locks[locks:] for e in self.entries.values() if e.node == node for n in e.pages}
            mine = [n for n in request.pages[keep:] if n not in attached and self.pages[n].device is not None]
            if mine:
                self.sg.allocator.free(self._device_indices(mine))
                for n in mine:
                    self.pages[n].device = None
            del request.pages[keep:]
            request.reserved = reserved
            request.req.kv.kv_allocated_len = len(request.pages) * self.page_size
            undone = list(zip(request.locks[locks:], request.receipts[locks:], strict=True))
            request.locks, request.receipts = request.locks[:locks], request.receipts[:locks]
            for node, receipt in undone:
                self._unlock(node, receipt)
        self._finish(batch.batch_id, BatchState.CANCELLED)

    # -- extents ---------------------------------------------------------------------------

    def _issue(self, record: _Extent) -> CacheExtentRef:
        generation, self.next_extent = self.next_extent, self.next_extent + 1
        self.extents[generation] = self.entries[generation] = record
        return CacheExtentRef(self.runtime_id, 0, generation, pageruns.coalesce(record.pages))

    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        import torch

        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        record = self._request(request)
        ps = self.page_size
        # The scheduler's insert path, RadixCache._insert_cache (radix_cache.py:450-483): the
        # request's computed tokens (checkpoint's `fill_ids[:owned_kv_len]`; here those of the
        # pages asked for), the key cut by RadixKey.page_aligned, the value the row's slice of
        # req_to_token as long as the key. Python's slice clamps, as _insert_cache's row slice
        # does, so an out-of-range or partly computed range is inserted short (report F9).
        positions = range(record.num_tokens)[first_page * ps : (first_page + page_count) * ps]
        generation = self.next_extent
        key = self._key(generation, [record.pages[q // ps] * ps + q % ps for q in positions])
        pool = self.sg.req_to_token_pool
        value = pool.req_to_token[record.row, positions.start : positions.start + len(key)].to(dtype=torch.int64, copy=True)
        pages = tuple(record.pages[q // ps] for q in positions[: len(key) : ps])
        node = self.sg.tree.insert(InsertParams(key=key, value=value)).last_device_node
        receipt = self._lock(node)  # the extent's reference keeps the entry from eviction
        if self.sg.tree_hicache:  # the insert's write-through backup is queued: the scheduler submits it after the batch (scheduler.py:5106)
            self.sg.tree.flush_pending_backups()
        return self._issue(_Extent(pages, node, key, receipts=[receipt]))

    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        record = self._extent(extent)
        tree = self.sg.tree
        head_key = record.key[: (record.offset + at_page) * self.page_size]
        head = tree.match_prefix(MatchPrefixParams(key=head_key)).last_device_node  # splits the entry at at_page
        receipt = self._lock(head)  # the first part's own reference; the rest keeps the whole one's lock
        del self.extents[extent.generation]
        rest, record.receipts = record.receipts, []  # the whole one's lock (its receipt) passes to the rest
        return (
            self._issue(_Extent(record.pages[:at_page], head, head_key, offset=record.offset, receipts=[receipt])),
            self._issue(_Extent(record.pages[at_page:], record.node, record.key, offset=record.offset + at_page, receipts=rest)),
        )

    def retain(self, extent: CacheExtentRef) -> None:
        record = self._entry(extent)  # SGLang's lock has no generation: a stale ref locks the entry too
        record.receipts.append(self._lock(record.node))  # the ref's holder keeps the lock's receipt
        if extent.generation in self.extents:
            record.refs += 1

    def release(self, extent: CacheExtentRef) -> None:
        """Drop one of the ref's locks with its receipt; a stale ref reaches the tree's entry (and the allocator) unchanged.

        A receipt goes when its lock is given back, so a ref whose locks are all given back
        (released to zero, or split: its lock passed to the rest) has none left, and its
        release passes the empty receipt, as a scheduler holder whose `TreeLock` is gone
        would have nothing else to pass (`_unlock`).
        """
        record = self._entry(extent)
        if extent.generation in self.extents:
            record.refs -= 1
            if record.refs == 0:
                del self.extents[extent.generation]
        self._unlock(record.node, record.receipts.pop() if record.receipts else None)

    # -- tier moves --------------------------------------------------------------------------

    def _ticket(self, kind: TransferKind, extent: CacheExtentRef, count: int) -> TransferTicket:
        tid, self.next_transfer = self.next_transfer, self.next_transfer + 1
        return TransferTicket(self.runtime_id, 0, tid, kind, extent.generation, count)

    def _plan_restores(self, intents) -> None:
        """Every Restore must name host pages for `controller.load`: one that cannot is refused before any SGLang call.

        Run over the intents in order, with the device/host presence each earlier Demote
        and Drop of the same call leaves (translation only: SGLang is not called). With the
        unified tree's HiCache the tree holds the host indices (`load_back`): nothing to translate.
        """
        if self.sg.tree_hicache:
            return
        device = {n: p.device is not None for n, p in self.pages.items()}
        host = {n: p.host is not None for n, p in self.pages.items()}
        for intent in intents:
            names = self._extent(intent.extent).pages
            if isinstance(intent, Backup):
                host.update({n: True for n in names if device[n]})
            elif isinstance(intent, Demote):
                device.update(dict.fromkeys(names, False))
            elif isinstance(intent, Drop):
                host.update(dict.fromkeys(names, False))
            elif isinstance(intent, Restore):
                missing = [n for n in names if not device[n] and not host[n]]
                if missing:
                    raise NotBackedUp(f"Restore of extent {intent.extent.generation}: pages {missing} have no host copy to load")
                device.update(dict.fromkeys(names, True))

    def _restore(self, extent: CacheExtentRef) -> TransferTicket:
        if self.sg.tree_hicache:
            return self._restore_tree(extent)
        record = self._extent(extent)
        names = [n for n in record.pages if self.pages[n].device is None]
        ticket = self._ticket(TransferKind.RESTORE, extent, len(names))
        if not names:
            self.done.append(TransferCompletion(ticket))
            return ticket
        device = self.sg.controller.load(self._host_indices(names))
        if device is None:
            raise OutOfPages(Tier.L1, len(names), self.sg.allocator.available_size() // self.page_size)
        for name, page_id in zip(names, self._page_ids(device), strict=True):
            self.pages[name].device = page_id
        record.node.value = self._device_indices(record.pages)  # HiRadixCache.load_back sets the node's device value
        self.sg.controller.start_loading()
        self.load_tickets.append(ticket)
        return ticket

    def submit(self, intents) -> tuple[TransferTicket, ...]:
        for intent in intents:  # translate every ref before the first SGLang call
            if not isinstance(intent, (Backup, Restore, Demote, Drop)):
                raise InvalidPlan(f"submit takes tier intents only, got {type(intent).__name__}")
            self._extent(intent.extent)
            if self.sg.controller is None:  # no host pool, no controller: nothing to translate a tier move into
                from cacheruntime.protocol import NoL2

                raise NoL2("this SGLang stack was built without a host pool")
        if self.sg.tree_hicache:
            return self._submit_tree(intents)
        self._plan_restores(intents)
        tickets = []
        for intent in intents:
            record = self._extent(intent.extent)
            if isinstance(intent, Backup):
                names = [n for n in record.pages if self.pages[n].host is None and self.pages[n].device is not None]
                ticket = self._ticket(TransferKind.BACKUP, intent.extent, len(names))
                if names:
                    host = self.sg.controller.write(self._device_indices(names))
                    if host is None:
                        raise OutOfPages(Tier.L2, len(names), self.sg.host_pool.available_size() // self.page_size)
                    for name, page_id in zip(names, self._page_ids(host), strict=True):
                        self.pages[name].host = page_id
                    self.write_tickets.append(ticket)
                else:
                    self.done.append(TransferCompletion(ticket))
                tickets.append(ticket)
            elif isinstance(intent, Restore):
                tickets.append(self._restore(intent.extent))
            elif isinstance(intent, Demote):
                names = [n for n in record.pages if self.pages[n].device is not None]
                # HiRadixCache._evict_backuped frees the node's own device value; SGLang's tree
                # never holds a page in two entries, so a page another entry still names (two
                # publishes of it, an adapter limitation as for eviction) is left to that entry.
                # A page a live row holds is freed all the same: the allocator has no in-use check (V6).
                keep = self._named_elsewhere(exclude=record.node, rows=False) if names else set()
                freed = [n for n in names if self.pages[n].device not in keep]
                if freed:
                    self.sg.allocator.free(self._device_indices(freed))
                for name in names:
                    self.pages[name].device = None
                record.node.value = None  # HiRadixCache._evict_backuped: the node keeps its host value only
            elif isinstance(intent, Drop):
                names = [n for n in record.pages if self.pages[n].host is not None]
                if names:
                    self.sg.controller.evict_host(self._host_indices(names))
                for name in names:
                    self.pages[name].host = None
        return tuple(tickets)

    # -- tier moves on the unified tree's HiCache (tree_hicache) ----------------------------------

    def _submit_tree(self, intents) -> tuple[TransferTicket, ...]:
        """Tier moves as the unified tree makes them: its backup action, its demote, its load-back.

        SGLang's unified tree has no per-entry host drop (`evict_host(num_tokens)` picks LRU
        host leaves; the TreeCores' host-leaf eviction is private), so a `Drop` is refused
        before any SGLang call (`Unsupported`, notes.md).
        """
        for intent in intents:
            if isinstance(intent, Drop):
                raise Unsupported("Drop: 0.5.23's unified tree has no per-entry host drop (evict_host(num_tokens) evicts the least recently used host leaves)")
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        tree: Any = self.sg.tree
        tickets = []
        for intent in intents:
            record = self._extent(intent.extent)
            if isinstance(intent, Backup):
                tickets.append(self._backup_tree(intent.extent, record))
            elif isinstance(intent, Restore):
                tickets.append(self._restore_tree(intent.extent))
            else:  # Demote: the TreeCore's demote, its frees through the cache (UnifiedRadixCache._demote)
                self._apply_tree_result(tree.tree_core.demote(record.node), {ComponentType.FULL: 0})
                for name in record.pages:
                    self.pages[name].device = None
        return tuple(tickets)

    def _backup_tree(self, extent: CacheExtentRef, record: _Extent) -> TransferTicket:
        """The BackupKV action the tree builds for the entry (the insert's write-through shape), then the scheduler's flush."""
        tree: Any = self.sg.tree
        if tree.is_backuped(record.node):
            ticket = self._ticket(TransferKind.BACKUP, extent, 0)
            self.done.append(TransferCompletion(ticket))
            return ticket
        ticket = self._ticket(TransferKind.BACKUP, extent, len(record.pages))
        tree._apply_cache_action(tree.tree_core.build_backup_kv_action(record.node))
        tree.flush_pending_backups()
        if not tree.is_backuped(record.node):  # _execute_kv_backup found no host room after evict_host: nothing committed
            raise OutOfPages(Tier.L2, len(record.pages), self.sg.host_pool.available_size() // self.page_size)
        self.tree_tickets.append(("write", record.node, ticket))
        return ticket

    def _restore_tree(self, extent: CacheExtentRef) -> TransferTicket:
        """UnifiedRadixCache.load_back of the entry, then the scheduler's start of the loads; the pages' device copies from the tree's path."""
        tree: Any = self.sg.tree
        record = self._extent(extent)
        if not tree.tree_core.is_full_device_evicted(record.node):
            ticket = self._ticket(TransferKind.RESTORE, extent, 0)
            self.done.append(TransferCompletion(ticket))
            return ticket
        ticket = self._ticket(TransferKind.RESTORE, extent, len(record.pages))
        if not tree.load_back(record.node):
            raise OutOfPages(Tier.L1, len(record.pages), self.sg.allocator.available_size() // self.page_size)
        tree.ready_to_load_host_cache()
        device = tree.path_device_indices(record.node)[record.offset * self.page_size :]
        for name, page_id in zip(record.pages, self._page_ids(device), strict=True):
            self.pages[name].device = page_id
        self.tree_tickets.append(("load", record.node, ticket))
        return ticket

    def _collect_tree(self, block: bool) -> None:
        """The scheduler's per-step poll (`check_hicache_events`: flush, writing_check, loading_check); a ticket is done when its ack was consumed.

        On CPU every copy has finished when its call returns, so blocking and polling see the
        same acks. Entries whose last lock went with a backup's or a load's ack are then
        evicted as after any unlock.
        """
        tree: Any = self.sg.tree
        if block:
            tree.flush_pending_backups()
            tree.writing_check(write_back=True)
        tree.check_hicache_events()
        pending = {"write": tree.ongoing_write_through, "load": tree.ongoing_load_back}
        kept = []
        for kind, node, ticket in self.tree_tickets:
            if node in pending[kind]:
                kept.append((kind, node, ticket))
            else:
                self.done.append(TransferCompletion(ticket))
        self.tree_tickets = kept
        self._evict_unified()

    # -- completions ---------------------------------------------------------------------------

    def _collect(self, block: bool) -> None:
        """Consume SGLang's finished acks in order, as HiRadixCache.writing_check/loading_check do."""
        ctl = self.sg.controller
        if ctl is None:
            return
        if self.sg.tree_hicache:
            self._collect_tree(block)
            return
        for acks, tickets in ((ctl.ack_write_queue, self.write_tickets), (ctl.ack_load_queue, self.load_tickets)):
            while acks and tickets:
                ack = acks[0]
                if block:
                    ack.finish_event.synchronize()
                elif not ack.finish_event.query():
                    break
                acks.pop(0)
                self.done.append(TransferCompletion(tickets.pop(0)))

    def _report(self) -> tuple[TransferCompletion, ...]:
        """The collected completions in transfer-id order, as the protocol reports them.

        SGLang acks writes and loads on two queues; merging them by id is translation (the
        contract's report order), not a check SGLang lacks.
        """
        done, self.done = tuple(sorted(self.done, key=lambda c: c.ticket.transfer_id)), []
        return done

    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        self._collect(block=False)
        return self._report()

    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        self._collect(block=True)
        return self._report()

    def restart(self) -> RuntimeInfo:
        raise Unsupported("SGLang's cache classes have no restart epoch (RESTART is not claimed)")

    # -- introspection (test-only) ---------------------------------------------------------

    def probe(self) -> AbstractState:
        """The abstract state, read off SGLang's allocator, request rows, radix tree and host pool (probe.py); cached until the next boundary call."""
        if self._probed is None:
            from .probe import abstract_state

            self._probed = abstract_state(self)
        return self._probed


def _boundary(method):
    """Count a boundary call that returned (B1), not the operations the adapter runs inside another (a plan's intents)."""

    @functools.wraps(method)
    def counted(self, *args, **kwargs):
        self._depth += 1
        self._probed = None
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._depth -= 1
            self._probed = None
        if self._depth == 0:
            self.calls[method.__name__] += 1
            if self.sg.tree_hicache:  # the scheduler's per-step HiCache poll, after each step (check_hicache_events)
                self._collect_tree(block=False)
                self._probed = None
            if self.checks is not None:
                self.checks.run()  # SGLang's own checks, where its scheduler runs them (checks.py)
        return result

    return counted


for _operation in BOUNDARY_OPERATIONS:
    setattr(SGLangRuntime, _operation, _boundary(getattr(SGLangRuntime, _operation)))


def make_runtime(**options) -> SGLangRuntime:
    """The conformance factory: `--runtime conformance.adapters.sglang.adapter:make_runtime`."""
    return SGLangRuntime(**options)
