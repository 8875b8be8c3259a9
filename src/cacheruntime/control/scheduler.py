"""Scheduler: one `BatchPlan` per step, prepared one step before it executes.

Each step builds plan N+1 (decode items that append the previous output, prefill items
that attach cached prefixes, and every intent: `Restore` for L2 hits, `Publish`,
`Backup`, `Demote`, `Release`, `Close`), prepares it, and only then executes batch N, so
the restores of N+1 run under N's compute. A step crosses the boundary a fixed number of
times (`prepare_batch`, `execute_batch`, `poll_completions`): nothing here is per token
(B1). The counts are measured by `BoundaryCounter`, not assumed.

Page budget. A request is admitted only if the rows of all running requests, at their
final length, plus the pages locks pin, fit L1: then evicting every unlocked tree page
always makes room, so `OutOfPages` is a wait, never a deadlock. It is handled by a fixed
ladder: execute the batch ahead (its intents free pages), then apply the pending tree
intents at once and wait for the transfers that defer frees, then retry.

Failure (spec/protocol.md §4.5, §5.3). A batch whose compute fails raises `ComputeFailed`
naming it and every later prepared batch sharing a request; none of them had any effect,
so control undoes its own planning of them and retries their turns: a turn that was
prefilling goes back to the front of the queue (its row is closed and matched afresh), a
decoding turn plans the same item again (its row is as before the batch). A prepared batch
that reads a restore reported failed is cancelled and retried the same way rather than
executed to fail. Undone intents go back to the tree in the order they were taken, since
a later plan's `Backup` may count on the host pages an earlier plan's `Release` frees: so
when a batch fails, the batch prepared after it is cancelled and undone too (its turns
are not charged a retry), and so is a plan being prepared on the failed batch's outcome. A turn retried more than `MAX_TURN_RETRIES` times is abandoned: its row
is closed and its follow-ups never arrive. Failed transfers are the tree's to take in
(`TreeCore.transfers_done`).

A runtime whose machinery is gone raises `RuntimeFault` on every call until `restart`
(§4.15). The step it strikes is abandoned where it stands: control restarts the runtime and
rebuilds on the new epoch (an empty tree: the cache died with the epoch), and every
running turn is retried from its prompt, charged a retry like a failed batch. The tokens
a retried turn had produced were served and stay so; it computes them again, the same.

L3 (spec/protocol.md §9), on a runtime that claims it. Pages are named by content
(`pagekeys`), so a store another run filled serves this one. A tree node is persisted once
a persist can read it (resident: its backup landed; buffer_only: at insert, from the device
copy), in the next plan, or in the page ladder's submit, and is in flight until its persist
completes. On admission control asks `l3_exists` for the prompt's pages past the tree's
match and fetches the leading hits into the row (a `Fetch` in the plan); they are published
with the computed pages. The hint may be stale: a fetch that misses fails its batch, which is
retried like any failed batch, and the keys of a failed fetch are computed from then on.
Fetches (and buffer_only persists) stage through host pages: control keeps their count within
`staging_pages`, which resident mode keeps out of the tree's L2 (a row's worth), so that a
plan never meets a host pool that the tree filled.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cacheruntime.control.pagekeys import page_keys
from cacheruntime.control.tree import Acquired, Node, TreeCore, TreeIntent, WritePolicy
from cacheruntime.control.workload import RequestSpec, Source
from cacheruntime.protocol import (
    Backup,
    BatchCompletion,
    BatchItem,
    BatchPlan,
    Capability,
    Close,
    ComputeFailed,
    Demote,
    Fetch,
    Intent,
    NotResident,
    OutOfPages,
    Persist,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
    RuntimeFault,
    RuntimeInfo,
    RuntimeInterface,
    Tier,
    TransferCompletion,
    TransferKind,
)

#: Calls that belong to a scheduling step; each step makes a bounded number of them (B1).
STEP_CALLS = frozenset({"info", "prepare_batch", "execute_batch", "cancel_batch", "poll_completions", "wait_completions", "submit"})
#: Calls made per request (open) or per tree operation (split, release outside a plan).
TREE_AND_REQUEST_CALLS = frozenset({"open_request", "close_request", "publish", "split", "retain", "release", "l3_exists"})
#: The most step calls one step can make: 4 prepares (first try and three retries), one
#: execute for the batch ahead, two evict-now passes of one submit and one wait, one poll;
#: under faults one more poll (a prepare that met a restore failed since its plan was
#: built) and one cancel (the batch ahead reads a restore the poll reported failed).
MAX_STEP_CALLS = 12
#: How often one turn's items may fail (or be cancelled over a failed restore), in all,
#: before the turn is abandoned. Each retry recomputes at most one batch of the turn; at
#: the rates of independent faults a fourth failure of one turn is rare, and more likely
#: a fault that retrying does not cure: the job must still finish.
MAX_TURN_RETRIES = 3


class BoundaryCounter:
    """A runtime seen through a counter of every boundary call, by operation (B1)."""

    def __init__(self, runtime: RuntimeInterface):
        self._runtime = runtime
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._runtime, name)
        if name not in STEP_CALLS | TREE_AND_REQUEST_CALLS:
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted


class Unservable(ValueError):
    """A request that can never run on this runtime (row or L1 too small); raised on arrival."""


class SchedulerStuck(RuntimeError):
    """The page ladder ran out: a bug in the page budget, reported with the numbers."""


@dataclass
class Stats:
    """What the scheduler did, for the job's summary."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    computed_prompt_tokens: int = 0
    hit_tokens_l1: int = 0
    hit_tokens_l2: int = 0
    restored_pages: int = 0
    backed_up_pages: int = 0
    batches: int = 0
    steps: int = 0
    idle_steps_skipped: int = 0  # steps with nothing to do, jumped over to the next arrival
    out_of_pages: int = 0
    step_calls: Counter[int] = field(default_factory=Counter)  # calls in a step -> how many steps
    turns_served: int = 0  # turns that ran to their Close
    turns_abandoned: int = 0  # turns given up after MAX_TURN_RETRIES retries
    turns_never_started: int = 0  # follow-ups of abandoned turns (their prompt never existed)
    turns_retried: int = 0  # turns retried at least once
    retries: int = 0  # turn retries: a turn's items planned again after their batch failed
    compute_failures: int = 0  # ComputeFailed raised by execute_batch
    failed_batches: int = 0  # batches ComputeFailed named (the executed one and its dependents)
    cancelled_batches: int = 0  # prepared batches cancelled because they read a failed restore
    backups: int = 0  # backup completions that moved pages, landed or failed
    restores: int = 0  # restore completions that moved pages, landed or failed
    failed_backups: int = 0  # backup completions with `failure` set
    failed_restores: int = 0  # restore completions with `failure` set
    unresident_prepares: int = 0  # prepares refused (NotResident) over a restore failed since planning
    ladders_undone: int = 0  # plans given up for a step because backups failed under the page ladder
    runtime_faults: int = 0  # RuntimeFault met: the runtime restarted, control rebuilt on the new epoch
    recomputed_tokens: int = 0  # tokens computed again by turns retried after a restart (served once)
    hit_tokens_l3: int = 0  # prompt tokens fetched from L3 instead of computed
    fetched_pages: int = 0  # pages fetch completions brought in from L3
    persisted_pages: int = 0  # pages persist completions wrote to L3
    fetches: int = 0  # fetch completions, landed or failed
    persists: int = 0  # persist completions, landed or failed
    failed_fetches: int = 0  # fetch completions with `failure` set (MISS or STORE): their turns recompute
    failed_persists: int = 0  # persist completions with `failure` set


class _Running:
    """A request between admission and its Close: handle, tokens, lock and page counts."""

    __slots__ = ("spec", "handle", "tokens", "outputs", "planned", "reserved", "published", "lock", "row_pages", "matched", "tree_pages", "hits")

    def __init__(self, spec: RequestSpec, handle: RequestRuntimeHandle, matched: int, lock: Node | None, row_pages: int, hits: tuple[int, int, int, int]):
        self.spec = spec
        self.handle = handle
        self.tokens = list(spec.prompt)  # prompt and every output seen so far: the row's tokens, in order
        self.outputs: list[int] = []
        self.planned = 0  # outputs the batches planned so far will produce
        self.reserved = 0  # row length once those batches ran
        self.published = matched  # row pages already in the tree (attached) or asked to be (Publish)
        self.lock = lock
        self.row_pages = row_pages
        self.matched = matched
        self.tree_pages = 0  # own pages the tree adopted (then counted as tree pages, not private)
        self.hits = hits  # prompt tokens hit on L1, on L2, fetched from L3, computed: counted once the prefill executed

    @property
    def private_pages(self) -> int:
        """Pages the row will hold at its final length that no tree node accounts for."""
        return self.row_pages - self.matched - self.tree_pages


@dataclass
class _Batch:
    """A plan with what the scheduler must do when its completion comes back."""

    requests: list[_Running]
    items: list[BatchItem]
    item_intents: list[Intent]
    restores: list[Restore]
    tree_intents: tuple[TreeIntent, ...]
    publishes: list[tuple[_Running, int, int]]
    closes: list[_Running]
    acquired: list[Acquired]
    admitted: list[_Running] = field(default_factory=list)  # requests this batch prefills
    fetches: list[Fetch] = field(default_factory=list)  # L3 pages its prefills fetch instead of computing
    persists: list[tuple[Node, tuple[str, ...]]] = field(default_factory=list)  # tree nodes it persists to L3, with their keys
    handle: PreparedBatchHandle | None = None
    undone: bool = False  # it failed or was cancelled: it had no effect, its planning is undone

    @property
    def attached(self) -> set[int]:
        """Generations of the extents its items attach: the restores its compute reads."""
        return {extent.generation for item in self.items for extent in item.attach}

    @property
    def plan(self) -> BatchPlan:
        """The plan as it crosses: restores first (they start at prepare), then the rest in order."""
        persists = tuple(Persist(node.ref, keys) for node, keys in self.persists)
        return BatchPlan(tuple(self.items), (*self.restores, *self.fetches, *self.item_intents, *self.tree_intents, *persists))


class Scheduler:
    """Builds, prepares and executes batches over a runtime; see the module docstring."""

    def __init__(
        self,
        runtime: RuntimeInterface,
        source: Source,
        *,
        write_policy: WritePolicy = WritePolicy.WRITE_THROUGH,
        max_prefill_tokens: int = 256,
        headroom_pages: int = 0,
        on_token: Callable[[str, tuple[int, ...], int | None], None] | None = None,
        prefix_cache: bool = True,
        lookahead: bool = True,
    ):
        """`prefix_cache=False`: publish nothing, so every prompt is computed whole (the
        baseline a prefix cache is measured against). `lookahead=False`: execute each batch
        in the step that prepares it, so its restores start only right before its compute
        (one-phase); by default batch N+1 is prepared before batch N executes (two-phase)."""
        self.runtime = BoundaryCounter(runtime)
        self.info: RuntimeInfo = self.runtime.info()
        self.write_policy = write_policy
        self.tree = self._empty_tree()
        self.source = source
        self.max_prefill_tokens = max_prefill_tokens
        self.headroom_pages = headroom_pages
        self.on_token = on_token
        self.prefix_cache, self.lookahead = prefix_cache, lookahead
        self.waiting: deque[RequestSpec] = deque()
        self.running: list[_Running] = []
        self.ahead: _Batch | None = None  # prepared, not executed
        self.stats = Stats()
        self.retries: Counter[str] = Counter()  # request id -> retries so far, while the turn is live
        self.l3_known: set[str] = set()  # keys this run persisted or fetched: not persisted again
        self.l3_avoid: set[str] = set()  # keys of fetches whose batch failed: recomputed from then on
        self._reset_l3()

    def _empty_tree(self) -> TreeCore:
        has_l2 = Capability.L2 in self.info.capabilities
        l3 = Capability.L3 in self.info.capabilities
        # Module docstring, L3: resident mode keeps a row's worth of the host pool out of the tree, for fetch staging.
        self.staging_pages = (self.info.max_request_tokens // self.info.page_size if has_l2 else self.info.l2_pages) if l3 else 0
        l2 = self.info.l2_pages - self.staging_pages if has_l2 else 0
        return TreeCore(self.runtime, page_size=self.info.page_size, l2_pages=l2, write_policy=self.write_policy)

    def _reset_l3(self) -> None:
        """No L3 transfer of control's in flight or queued (a new run, or a new epoch)."""
        self.persist_queue: list[Node] = []  # nodes with a readable copy, waiting for a plan (in flight: not evicted)
        self.persisting: dict[int, tuple[Node, tuple[str, ...]]] = {}  # extent generation -> node, keys, applied or planned
        self.staging_used = 0  # host pages control's fetches (and buffer_only persists) hold until their completion

    # -- the loop -----------------------------------------------------------------------

    def busy(self) -> bool:
        """Whether any request is waiting, running, in a batch, or still to arrive."""
        return bool(self.ahead or self.running or self.waiting or not self.source.exhausted())

    def run(self, on_step: Callable[[Scheduler], None] | None = None) -> Stats:
        """Step until the workload is served, then wait for the last transfers."""
        while self.busy():
            self._skip_idle_steps()
            self.step()
            if on_step is not None:
                on_step(self)
        try:
            self._account(self.runtime.wait_completions())
        except RuntimeFault:
            self._recover()  # every turn was served: only the cache is lost
        return self.stats

    def _skip_idle_steps(self) -> None:
        """With nothing running, waiting or prepared, go straight to the step of the next arrival:
        a trace whose next request arrives at step 10**8 (or 1e300) is served without stepping through
        every empty step in between."""
        arrival = self.source.next_arrival()
        if arrival is not None and arrival > self.stats.steps and not (self.ahead or self.running or self.waiting):
            self.stats.idle_steps_skipped += arrival - self.stats.steps
            self.stats.steps = arrival

    def step(self) -> None:
        """Plan and prepare batch N+1, execute batch N, poll transfers (B1: a fixed few calls)."""
        before = sum(n for op, n in self.runtime.calls.items() if op in STEP_CALLS)
        try:
            self._step()
        except RuntimeFault:
            self._recover()
        self.stats.steps += 1
        after = sum(n for op, n in self.runtime.calls.items() if op in STEP_CALLS)
        self.stats.step_calls[after - before] += 1

    def _step(self) -> None:
        for spec in self.source.arrivals(self.stats.steps):
            self._check_servable(spec)
            self.waiting.append(spec)
        batch = self._build()
        if batch is not None:
            handle = self._prepare(batch)
            if handle is None:
                batch = None
            else:
                batch.handle = handle
                for acquired in batch.acquired:
                    self.tree.unpin(acquired)
        if self.ahead is not None and self._execute_ahead(later=batch) and batch is not None and batch.undone:
            batch = None
        self.ahead = batch
        if not self.lookahead and self.ahead is not None:
            self._execute_ahead()
        failed_restores = self._account(self.runtime.poll_completions())
        if self.ahead is not None and failed_restores & self.ahead.attached:
            self._cancel_ahead()

    def _recover(self) -> None:
        """RuntimeFault: restart the runtime and rebuild control on its new epoch (module docstring)."""
        self.stats.runtime_faults += 1
        self.info = self.runtime.restart()
        self.tree = self._empty_tree()
        self._reset_l3()
        self.ahead = None
        requeue = []
        for r in self.running:
            if r.outputs:  # its prefill was counted as served: the retry's is a recomputation
                hit_l1, hit_l2, hit_l3, computed = r.hits
                self.stats.requests -= 1
                self.stats.prompt_tokens -= len(r.spec.prompt)
                self.stats.computed_prompt_tokens -= computed
                self.stats.hit_tokens_l1 -= hit_l1
                self.stats.hit_tokens_l2 -= hit_l2
                self.stats.hit_tokens_l3 -= hit_l3
                self.stats.generated_tokens -= len(r.outputs)
                self.stats.recomputed_tokens += len(r.spec.prompt) + len(r.outputs)
            if self._charge_retry(r) > MAX_TURN_RETRIES:
                self._abandon(r)
            else:
                requeue.append(r.spec)
        self.running = []
        self._requeue(requeue)

    def _charge_retry(self, r: _Running) -> int:
        """The turn was hit by a fault and will be retried: count it; its retries so far."""
        retries = self.retries[r.spec.request_id] + 1
        self.retries[r.spec.request_id] = retries
        self.stats.retries += 1
        self.stats.turns_retried += retries == 1
        return retries

    def _requeue(self, specs: list[RequestSpec]) -> None:
        """Turns to prefill again go back to the front of the queue, in arrival order."""
        self.waiting.extendleft(reversed(sorted(specs, key=lambda spec: spec.arrival)))

    # -- planning -------------------------------------------------------------------------

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.info.page_size)

    def _check_servable(self, spec: RequestSpec) -> None:
        length = len(spec.prompt) + spec.max_new_tokens - 1
        if length > self.info.max_request_tokens:
            raise Unservable(f"request {spec.request_id}: {length} tokens exceed max_request_tokens {self.info.max_request_tokens}")
        if self._pages(length) > self.info.l1_pages:
            raise Unservable(f"request {spec.request_id}: {self._pages(length)} pages exceed L1's {self.info.l1_pages}")

    def _build(self) -> _Batch | None:
        batch = _Batch([], [], [], [], (), [], [], [])
        for r in self.running:
            if 0 < r.planned < r.spec.max_new_tokens:
                batch.requests.append(r)
                batch.items.append(BatchItem(r.handle, append_previous_output=True))
                r.planned += 1
                r.reserved += 1
                if r.planned == r.spec.max_new_tokens:
                    self._finish(batch, r)
        self._admit(batch)
        if not batch.items:
            return None
        self._take_persists(batch)
        committed = self.tree.l1_pages() + sum(r.private_pages for r in self.running) + self.headroom_pages
        self.tree.evict(committed - self.info.l1_pages)
        batch.tree_intents = self.tree.take_intents()
        return batch

    def _admit(self, batch: _Batch) -> None:
        """Prefill waiting requests in arrival order while slots, prefill tokens and pages allow."""
        prefill_tokens = 0
        ps = self.info.page_size
        while self.waiting and len(self.running) < self.info.max_requests:
            spec = self.waiting[0]
            match = self.tree.match_prefix(spec.prompt)
            fetch = self._l3_hits(spec.prompt, match.pages)
            compute = len(spec.prompt) - (match.pages + len(fetch)) * ps
            if prefill_tokens and prefill_tokens + compute > self.max_prefill_tokens:
                return
            row_pages = self._pages(len(spec.prompt) + spec.max_new_tokens - 1)
            committed = sum(r.private_pages for r in self.running) + row_pages - match.pages + self.tree.locked_pages() + self.tree.unlocked_pages(match)
            if committed > self.info.l1_pages:
                return
            acquired = self.tree.acquire(match)
            handle = self.runtime.open_request()
            self.waiting.popleft()  # after the call: a RuntimeFault leaves the turn waiting
            hits = (match.l1_pages * ps, match.l2_pages * ps, len(fetch) * ps, compute)
            r = _Running(spec, handle, match.pages, acquired.node if acquired.attach else None, row_pages, hits)
            self.running.append(r)
            batch.admitted.append(r)
            batch.acquired.append(acquired)
            batch.restores.extend(acquired.restores)
            batch.requests.append(r)
            batch.items.append(BatchItem(handle, spec.prompt[(match.pages + len(fetch)) * ps :], acquired.attach))
            if fetch:
                batch.fetches.append(Fetch(handle, fetch))
                self.staging_used += len(fetch)
            r.planned, r.reserved = 1, len(spec.prompt)
            prefill_tokens += compute
            if spec.max_new_tokens == 1:
                self._finish(batch, r)
            else:
                self._publish(batch, r)

    # -- L3 (spec/protocol.md §9) ----------------------------------------------------------

    def _l3_hits(self, prompt: tuple[int, ...], matched: int) -> tuple[str, ...]:
        """Keys of the prompt's pages after the tree's match that L3 holds, leading ones only
        (a hint: the fetch may miss). The last prompt token is always computed, and the fetch
        must find staging pages free."""
        if not self.staging_pages or not self.prefix_cache:
            return ()
        keys = page_keys(prompt[: len(prompt) - 1], self.info.page_size)[matched:]
        keys = keys[: self.staging_pages - self.staging_used]
        if not keys:
            return ()
        hits = 0
        for key, present in zip(keys, self.runtime.l3_exists(keys), strict=True):
            if not present or key in self.l3_avoid:
                break
            hits += 1
        return keys[:hits]

    def _queue_persist(self, node: Node) -> None:
        """`node` has a copy a persist can read (host copy landed, or device copy in buffer_only):
        queue it unless L3 has its keys already. Queued, it stays evictable (`_take_persists`
        checks it again); taken into a plan, it is in flight until the persist completes."""
        if node.ref.generation in self.persisting or node in self.persist_queue:
            return
        tokens = tuple(t for n in node.path() for t in n.key)
        keys = page_keys(tokens, self.info.page_size)[-node.pages :]
        if set(keys) <= self.l3_known:
            return
        self.persist_queue.append(node)

    def _persist_staging(self, node: Node) -> int:
        """Host pages a persist of `node` stages through: its pages in buffer_only, none in resident."""
        return 0 if Capability.L2 in self.info.capabilities else node.pages

    def _take_persists(self, batch: _Batch) -> None:
        """Put the queued persists whose staging fits into the plan (applied at its execute); a
        node evicted, split or no longer holding the copy the persist reads since it was queued is dropped."""
        waiting = []
        resident = Capability.L2 in self.info.capabilities
        for node in self.persist_queue:
            if self.tree.by_generation.get(node.ref.generation) is not node or not (node.l2 if resident else node.l1 and not node.demoting):
                continue
            staging = self._persist_staging(node)
            if self.staging_used + staging > self.staging_pages:
                waiting.append(node)
                continue
            self.staging_used += staging
            tokens = tuple(t for n in node.path() for t in n.key)
            keys = page_keys(tokens, self.info.page_size)[-node.pages :]
            self.persisting[node.ref.generation] = (node, keys)
            node.in_flight += 1
            batch.persists.append((node, keys))
        self.persist_queue = waiting

    def _return_l3(self, batch: _Batch, *, started: bool, retried: bool) -> None:
        """Undo the batch's L3 planning: its persists queue again (never applied); its fetches
        free their staging unless they started (then their completion does), and when the batch
        failed their keys are recomputed from now on (a MISS or STORE: §9.4)."""
        for node, _ in batch.persists:
            del self.persisting[node.ref.generation]
            node.in_flight -= 1
            self.staging_used -= self._persist_staging(node)
        self.persist_queue[:0] = [node for node, _ in batch.persists]
        for fetch in batch.fetches:
            if not started:
                self.staging_used -= len(fetch.keys)
            if retried:
                self.l3_avoid.update(fetch.keys)

    def _publish(self, batch: _Batch, r: _Running) -> None:
        """Publish the row's full pages that the tree does not have yet (after this batch's compute)."""
        full = r.reserved // self.info.page_size
        if full > r.published and self.prefix_cache:
            batch.item_intents.append(Publish(r.handle, r.published, full - r.published))
            batch.publishes.append((r, r.published, full - r.published))
            r.published = full

    def _finish(self, batch: _Batch, r: _Running) -> None:
        self._publish(batch, r)
        batch.item_intents.append(Close(r.handle))
        batch.closes.append(r)

    # -- preparing and executing ----------------------------------------------------------

    def _prepare(self, batch: _Batch) -> PreparedBatchHandle | None:
        """prepare_batch, with the OutOfPages ladder: run the batch ahead, then evict now and wait.

        None when the batch is given up and its planning undone: the batch ahead it was
        planned after failed, or it attaches an extent whose restore failed after it was
        planned (NotResident; the tree has it host-only again once it took in that failure),
        or the ladder ran out because backups under it failed (their nodes stayed on L1).
        """
        ladder = ["execute ahead"] if self.ahead is not None else []
        ladder += ["evict now", "evict now"]  # the second pass takes what the first one's wait unblocked
        failed_backups = self.stats.failed_backups
        while True:
            try:
                handle: PreparedBatchHandle = self.runtime.prepare_batch(batch.plan)
                return handle
            except NotResident:
                failed_restores = self._account(self.runtime.poll_completions())
                if not self._restores_failed_since_planning(batch, failed_restores):
                    raise
                self.stats.unresident_prepares += 1
                self._undo([batch], started=False, retried=False)
                return None
            except OutOfPages as error:
                if error.tier is not Tier.L1:
                    raise
                self.stats.out_of_pages += 1
                if not ladder and self.stats.failed_backups > failed_backups:
                    # A failed write-back backup put its demoted node back on L1: give the plan
                    # up for this step; the next one evicts again (each backup fails with the
                    # fault's rate, so the retries end; at a rate of 1 they do not).
                    self.stats.ladders_undone += 1
                    self._undo([batch], started=False, retried=False)
                    return None
                if not ladder:
                    raise SchedulerStuck(
                        f"L1 still short after evicting everything unlocked: needs {error.needed}, has {error.free}; "
                        f"running rows {sum(r.row_pages for r in self.running)} pages, locked tree pages {self.tree.locked_pages()}"
                    ) from error
                if ladder.pop(0) == "execute ahead":
                    if self._execute_ahead(unprepared=batch):
                        return None
                else:
                    self._evict_now(batch, error.needed - error.free)

    def _restores_failed_since_planning(self, batch: _Batch, failed_restores: set[int]) -> bool:
        """Whether the batch attaches a node that is host-only now although it planned no restore of it."""
        restored = {restore.extent.generation for restore in batch.restores}
        return bool(failed_restores & batch.attached) or any(
            not node.l1 for acquired in batch.acquired for node in acquired.pinned if node.ref.generation not in restored
        )

    def _execute_ahead(self, *, later: _Batch | None = None, unprepared: _Batch | None = None) -> bool:
        """Execute the batch ahead. Whether it failed (ComputeFailed): then it is undone, and
        so are the batch prepared `later` (cancelled unless the failure named it too) and the
        plan being prepared (`unprepared`), newest first (module docstring: Failure)."""
        batch, self.ahead = self.ahead, None
        assert batch is not None and batch.handle is not None, "called only with a prepared batch ahead"
        try:
            completion = self.runtime.execute_batch(batch.handle)
        except ComputeFailed as failure:
            named = set(failure.batches)
            failed = [b for b in (later, batch) if b is not None and b.handle is not None and b.handle.batch_id in named]  # newest first
            if len(failed) != len(named):
                raise AssertionError(f"ComputeFailed names batches {sorted(named)}; control has prepared only {batch.handle.batch_id} and later") from failure
            self.stats.compute_failures += 1
            self.stats.failed_batches += len(failed)
            if unprepared is not None:
                self._undo([unprepared], started=False, retried=False)
            if later is not None and all(later is not b for b in failed):
                assert later.handle is not None, "a later batch is prepared"
                self.runtime.cancel_batch(later.handle)
                self.stats.cancelled_batches += 1
                self._undo([later], started=True, retried=False)
            self._undo(failed, started=True, retried=True)
            return True
        self.stats.batches += 1
        self._complete(batch, completion)
        return False

    def _cancel_ahead(self) -> None:
        """The batch ahead reads a restore reported failed: cancel it rather than execute it to fail."""
        batch, self.ahead = self.ahead, None
        assert batch is not None and batch.handle is not None, "called only with a prepared batch ahead"
        self.runtime.cancel_batch(batch.handle)
        self.stats.cancelled_batches += 1
        self._undo([batch], started=True, retried=True)

    def _undo(self, batches: list[_Batch], *, started: bool, retried: bool) -> None:
        """Undo control's planning of `batches`, none of which had any effect; newest first,
        and newer than any undone later (each returns its intents ahead of the newer ones').

        `started`: they were prepared, so their restores started and go on; else they never
        reached the runtime. `retried`: their turns were hit by the fault and are charged a
        retry (abandoned past MAX_TURN_RETRIES). Decode items are planned again; a
        prefilling turn's row is closed and the turn goes back to the front of the queue.
        """
        touched: list[_Running] = []
        prefilling: set[int] = set()
        for batch in batches:
            batch.undone = True
            self.tree.return_intents(batch.tree_intents)
            self._return_l3(batch, started=started, retried=retried)
            if not started:
                for acquired in batch.acquired:
                    self.tree.withdraw(acquired)
            for r, first, _ in batch.publishes:
                r.published = min(r.published, first)  # batches may come newest first or not
            prefilling |= {id(r) for r in batch.admitted}
            for r in batch.requests:
                r.planned -= 1
                r.reserved -= 1
                if id(r) not in {id(t) for t in touched}:
                    touched.append(r)
        requeue = []
        try:
            for r in touched:
                retries = self._charge_retry(r) if retried else self.retries[r.spec.request_id]
                if id(r) in prefilling or retries > MAX_TURN_RETRIES:
                    if r.lock is not None:
                        self.tree.unlock(r.lock)
                    self.runtime.close_request(r.handle)  # first: a RuntimeFault leaves the turn running, for _recover
                    self.running.remove(r)
                    if retries > MAX_TURN_RETRIES:
                        self._abandon(r)
                    else:
                        requeue.append(r.spec)
        finally:
            self._requeue(requeue)

    def _abandon(self, r: _Running) -> None:
        """Give the turn up: it is not served, and its follow-ups never arrive."""
        del self.retries[r.spec.request_id]
        self.stats.turns_abandoned += 1
        self.stats.turns_never_started += self.source.abandoned(r.spec)

    def _evict_now(self, batch: _Batch, short: int) -> None:
        """Apply the batch's tree intents and more evictions standalone, then wait for deferred frees."""
        self.tree.evict(short)
        now = batch.tree_intents + self.tree.take_intents()
        batch.tree_intents = ()
        # Releases first (they only free; a backup may need the host pages one frees), then
        # every tier intent in one atomic submit: a Demote crosses with the Backup it needs.
        for intent in now:
            if isinstance(intent, Release):
                self.runtime.release(intent.extent)
        # The batch's persists go with them: they hold their nodes in flight until they land.
        flushed = _Batch([], [], [], [], (), [], [], [], persists=batch.persists)
        batch.persists = []
        tier = (*(intent for intent in now if isinstance(intent, (Backup, Demote))), *flushed.plan.intents)
        if tier:
            self.runtime.submit(tier)
        self.tree.intents_applied(now)
        self._account(self.runtime.wait_completions())

    def _complete(self, batch: _Batch, completion: BatchCompletion) -> None:
        """Take in a completion: outputs, published extents into the tree, locks, closes."""
        ps = self.info.page_size
        for r, result in zip(batch.requests, completion.items, strict=True):
            if result.num_tokens != len(r.tokens):
                raise AssertionError(f"{r.spec.request_id}: runtime row has {result.num_tokens} tokens, control expects {len(r.tokens)}")
            if self.on_token is not None:
                self.on_token(r.spec.request_id, tuple(r.tokens), result.next_token)
            token = result.next_token
            assert token is not None, "rows grow by sampled tokens: the runtime must compute (the model and LocalGPURuntime do)"
            if not r.outputs:  # the prefill executed: the turn's prompt is served
                hit_l1, hit_l2, hit_l3, computed = r.hits
                self.stats.requests += 1
                self.stats.prompt_tokens += len(r.spec.prompt)
                self.stats.computed_prompt_tokens += computed
                self.stats.hit_tokens_l1 += hit_l1
                self.stats.hit_tokens_l2 += hit_l2
                self.stats.hit_tokens_l3 += hit_l3
            r.tokens.append(token)
            r.outputs.append(token)
            self.stats.generated_tokens += 1
        for fetch in batch.fetches:  # the batch ran, so its fetches landed: L3 has those keys
            self.l3_known.update(fetch.keys)
        closing = {id(r) for r in batch.closes}
        for (r, first, count), ref in zip(batch.publishes, completion.published, strict=True):
            inserted = self.tree.insert(tuple(r.tokens[: (first + count) * ps]), first, ref)
            r.tree_pages += inserted.adopted_pages
            if inserted.adopted_pages and self.staging_pages and Capability.L2 not in self.info.capabilities:
                self._queue_persist(inserted.node)  # buffer_only: the persist reads the device copy
            if id(r) not in closing and inserted.adopted_pages:
                self.tree.lock(inserted.node)
                if r.lock is not None:
                    self.tree.unlock(r.lock)
                r.lock = inserted.node
        for r in batch.closes:
            if r.lock is not None:
                self.tree.unlock(r.lock)
            self.running.remove(r)
            self.retries.pop(r.spec.request_id, None)
            self.stats.turns_served += 1
            self.source.finished(r.spec, tuple(r.outputs))
        self.tree.intents_applied(batch.tree_intents)

    def _account(self, completions: tuple[TransferCompletion, ...]) -> set[int]:
        """Take in transfer completions; the extent generations whose restore failed."""
        failed_restores = self.tree.transfers_done(completions)
        for done in completions:
            if done.ticket.kind in (TransferKind.PERSIST, TransferKind.FETCH):
                self._account_l3(done)
                continue
            if done.ticket.kind is TransferKind.BACKUP and done.failure is None and self.staging_pages:
                node = self.tree.by_generation.get(done.ticket.extent_generation)
                if node is not None:
                    self._queue_persist(node)
            restore = done.ticket.kind is TransferKind.RESTORE
            if done.ticket.page_count:
                self.stats.restores += restore
                self.stats.backups += not restore
            if done.failure is not None:
                self.stats.failed_restores += restore
                self.stats.failed_backups += not restore
            elif restore:
                self.stats.restored_pages += done.ticket.page_count
            else:
                self.stats.backed_up_pages += done.ticket.page_count
        return failed_restores

    def _account_l3(self, done: TransferCompletion) -> None:
        """Take in a persist's or fetch's completion: counts, staging, and the keys L3 now has."""
        if done.ticket.kind is TransferKind.FETCH:
            self.staging_used -= done.ticket.page_count
            self.stats.fetches += 1
            self.stats.failed_fetches += done.failure is not None
            self.stats.fetched_pages += done.ticket.page_count if done.failure is None else 0
            return
        node, keys = self.persisting.pop(done.ticket.extent_generation)
        self.staging_used -= self._persist_staging(node)
        self.stats.persists += 1
        if done.failure is not None:
            self.stats.failed_persists += 1
        else:
            self.stats.persisted_pages += len(keys)
            self.l3_known.update(keys)
