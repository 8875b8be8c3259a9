"""`LocalGPURuntime`: the contract of `spec/protocol.md` on real KV memory, in the caller's process.

A thin facade over two parts (docs/architecture.md): the `ledger` (no torch: the
bookkeeping, section by section as in the model, with the call's transaction) and the
`device_layer` (KV memory, ReqToToken, streams and events, the runner, the D2H throttle,
the ordering points O1/O2); what it does about faults is `runtime/faults.py`.

Every call begins a transaction, checks its arguments and preconditions in the model's
order and changes the ledger, commits, and only then touches the device (writes
ReqToToken, issues transfers); `execute_batch` computes before it commits, so that a
runner that raises fails the batch (`ComputeFailed`) instead of committing it. Any other
raised `CacheRuntimeError` leaves the runtime exactly as it was. Control only ever gets
the frozen values of `cacheruntime.protocol` (B2).

The parts are the seams where runtimes differ: the contract's freedoms (`numbering`,
`free_order`, `reporting`, the copy path `memory_class`, the `runner`) are constructor
options, and a mutant is a `ledger_class`, `ordering_class` or `transaction_class` that
overrides one public method.
"""

from __future__ import annotations

from cacheruntime.protocol import (
    AbstractState,
    BatchCompletion,
    BatchPlan,
    CacheExtentRef,
    Capability,
    OutOfSlots,
    Persist,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    RuntimeInfo,
    TierIntent,
    TransferCompletion,
    TransferKind,
    TransferTicket,
    Unsupported,
)
from cacheruntime.runtime.device.deadstreams import StreamDead
from cacheruntime.runtime.device.layer import DeviceLayer, ReadsFailed
from cacheruntime.runtime.device.memory import KVMemory
from cacheruntime.runtime.device.ordering import Ordering
from cacheruntime.runtime.device.runner import ComputeBatch, DecoderConfig, Runner
from cacheruntime.runtime.device.throttle import D2H_ISSUE_POINTS
from cacheruntime.runtime.faults import FaultHandling
from cacheruntime.runtime.l3calls import L3Calls, L3Spec, l3_options
from cacheruntime.runtime.ledger import FreeOrder, Ledger, Numbering, Reporting
from cacheruntime.runtime.ledger.batches import item_results
from cacheruntime.runtime.ledger.choices import MODEL_NUMBERING
from cacheruntime.runtime.ledger.transaction import operation

__all__ = ["D2H_ISSUE_POINTS", "LocalGPURuntime"]


class LocalGPURuntime(L3Calls, FaultHandling):
    """A GPU cache runtime in the caller's process, on torch, for `device="cpu"` or `"cuda"`."""

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
        runner: str | Runner = "tiny",
        config: DecoderConfig | None = None,
        seed: int = 0,
        d2h_bytes_per_batch: int | None = 32 << 20,
        d2h_issue: str = "under_compute",
        numbering: Numbering = MODEL_NUMBERING,
        free_order: FreeOrder | str = FreeOrder.FIFO,
        reporting: Reporting | str = Reporting.EAGER,
        memory_class: type[KVMemory] = KVMemory,
        ledger_class: type[Ledger] = Ledger,
        ordering_class: type[Ordering] = Ordering,
        streams: str = "threads",
        schedule_seed: int = 0,
        host_mode: str = "resident",  # or "buffer_only": host pages only stage between L1 and L3 (§9.1)
        l3: L3Spec = None,  # an L3 store (the L3 capability), or its spec: "file:DIR"
    ):
        host_mode, store = l3_options(host_mode, l3, l2_pages)
        if d2h_bytes_per_batch is not None and d2h_bytes_per_batch < 1:
            raise ValueError("d2h_bytes_per_batch must be positive (or None: no throttle)")
        if page_size < 1 or max_requests < 1 or l1_pages < 1 or l2_pages < 0 or max_request_tokens < page_size:
            raise ValueError("page_size, max_requests, l1_pages >= 1, l2_pages >= 0, max_request_tokens >= page_size")
        self.runtime_id = runtime_id
        self.page_size = page_size
        self.max_requests = max_requests
        self.max_request_tokens = max_request_tokens
        self.l1_pages = l1_pages
        self.l2_pages = l2_pages
        self.device_layer = DeviceLayer(
            device=device,
            page_size=page_size,
            max_requests=max_requests,
            max_request_tokens=max_request_tokens,
            l1_pages=l1_pages,
            l2_pages=l2_pages,
            runner=runner,
            config=config or DecoderConfig(),
            seed=seed,
            d2h_bytes_per_batch=d2h_bytes_per_batch,
            d2h_issue=d2h_issue,
            memory_class=memory_class,
            ordering_class=ordering_class,
            streams=streams,
            schedule_seed=schedule_seed,
            store=store,
        )
        self.device = self.device_layer.device
        self.ledger = ledger_class(
            runtime_id=runtime_id,
            page_size=page_size,
            max_requests=max_requests,
            max_request_tokens=max_request_tokens,
            l1_pages=l1_pages,
            l2_pages=l2_pages,
            numbering=numbering,
            free_order=FreeOrder(free_order),
            reporting=Reporting(reporting),
            seed=seed,
            vocab_size=(config or DecoderConfig()).vocab,
            host_mode=host_mode,
            l3=store is not None,
        )
        self.lost_cause = ""  # why the machinery is gone, while `ledger.state.lost`

    # -- info, test knobs, reference compute ---------------------------------------------

    @property
    def capabilities(self) -> frozenset[Capability]:
        caps = {Capability.ASYNC_TRANSFERS, Capability.INTROSPECTION, Capability.RESTART, Capability.DELAY_KNOB, Capability.FAULT_INJECTION}
        if self.device_layer.schedule is not None:
            caps.add(Capability.SCHEDULE_SEED)
        if self.ledger.has_l2:
            caps.add(Capability.L2)
        if self.device_layer.l3 is not None:
            caps.add(Capability.L3)
        if self.device_layer.runner.tagged:
            caps.add(Capability.TAGGED_COMPUTE)
        return frozenset(caps)

    def _info(self) -> RuntimeInfo:
        return RuntimeInfo(
            runtime_id=self.runtime_id,
            epoch=self.ledger.state.epoch,
            page_size=self.page_size,
            max_requests=self.max_requests,
            max_request_tokens=self.max_request_tokens,
            l1_pages=self.l1_pages,
            l2_pages=self.l2_pages,
            capabilities=self.capabilities,
            page_bytes=self.device_layer.memory.page_bytes,
            vocab_size=self.ledger.vocab_size,
        )

    @operation(journal=False)
    def info(self) -> RuntimeInfo:
        """Identity, epoch, sizes, capabilities and the bytes of one KV page."""
        return self._info()

    def set_transfer_delay(self, seconds: float, kind: TransferKind | None = None) -> None:
        """Test-only: hold the transfer stream `seconds` before every copy of `kind` (both if None),
        so that a missing wait (O1, O2) or a page reused under a copy (O3) is a sure race (DELAY_KNOB)."""
        if seconds < 0:
            raise ValueError("the transfer delay cannot be negative")
        for k in (TransferKind.BACKUP, TransferKind.RESTORE) if kind is None else (kind,):
            self.device_layer.delay[k] = float(seconds)

    def set_schedule_seed(self, seed: int) -> None:
        """Test-only: pick the interleaving of copies, compute and completions from `seed` (SCHEDULE_SEED).

        Only simulated streams have a schedule to seed; on threads and CUDA the machine picks.
        """
        schedule = self.device_layer.schedule
        if schedule is None:
            raise Unsupported("set_schedule_seed needs streams='simulated' (threads and CUDA streams interleave as the machine runs them)")
        schedule.reseed(seed)

    def reference_next_token(self, token_ids: list[int]) -> int:
        """The tiny runner's next token for `token_ids`, recomputed without any cache (for D1)."""
        runner = self.device_layer.runner
        if runner.tagged:
            raise Unsupported("the tagging runner has no token model to recompute")
        return runner.reference(list(token_ids))  # type: ignore[attr-defined, no-any-return]

    def close(self) -> None:
        """Drain the streams and stop their workers; the runtime is unusable afterwards."""
        self.device_layer.close()

    # -- request lifecycle -------------------------------------------------------------

    @operation()
    def open_request(self) -> RequestRuntimeHandle:
        """Take the lowest free slot, at its current generation, with an empty row."""
        opened = self.ledger.open_slot()
        if opened is None:
            raise OutOfSlots(f"all {self.max_requests} request slots are live")
        slot_id, slot = opened
        return RequestRuntimeHandle(self.runtime_id, self.ledger.state.epoch, slot_id, slot.generation)

    @operation()
    def close_request(self, request: RequestRuntimeHandle) -> None:
        """Retire the handle now; the row's pages go with their last holder (deferred if in flight)."""
        self.ledger.close_row(request)

    # -- two-phase batches -------------------------------------------------------------

    @operation(journal=False)
    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        """Check the plan, then reserve and map its rows, write ReqToToken, start its restores."""
        ledger = self.ledger
        batch_id, mapping = ledger.apply_plan(ledger.check_plan(plan))
        self.commit()
        self.device_layer.write_req_to_token(*mapping)
        self._launch_started()
        return PreparedBatchHandle(self.runtime_id, ledger.state.epoch, batch_id)

    @operation(journal=False)
    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """Wait for the restores compute reads (O1), compute, apply the intents, return outputs.

        The call commits only after compute succeeded; if a restore it reads failed or the
        runner raises, the call is rolled back and the batch fails instead (`ComputeFailed`, §4.5).
        """
        ledger, layer = self.ledger, self.device_layer
        executed = ledger.execute(batch)
        launched = layer.launched
        self.fail_if_unreadable(batch, executed.unreadable)
        kv_ready = {t: launched[t] for t in executed.kv_ready if t in launched}
        injected = self.compute_fault_due()
        record, rows = executed.record, executed.rows
        items = ComputeBatch(record.slots, record.starts, record.ends, executed.first_tags, record.plan.items, rows)
        try:
            tokens = layer.run_compute(
                items, kv_ready, ledger.txn.started, ledger.state.transfers, ledger.state.doomed, layer.compute_fault_site if injected else None
            )
        except StreamDead:
            raise
        except ReadsFailed as error:  # KV_READY: a restore compute reads failed; compute did not run
            self.fail_batch(batch, str(error), set(error.transfer_ids), False, error)
        except Exception as error:
            self.fail_batch(batch, f"the runner raised: {error!r}", set(), injected, error)
        ledger.txn.started = []
        ledger.settle(executed, batch.batch_id)
        self.commit()
        for slot, token in zip(rows, tokens):
            slot.last_output = token
        return BatchCompletion(batch, item_results(record.requests, record.ends, tokens), executed.published, executed.tickets)

    @operation()
    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        """Undo the batch's allocations and mappings; restores it started go on."""
        self.ledger.cancel(batch)

    # -- extents -----------------------------------------------------------------------

    @operation()
    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        """Make full, computed pages of a row an extent with one reference."""
        return self.ledger.publish_pages(Publish(request, first_page, page_count))

    @operation()
    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        """Retire the extent's only ref; issue refs for its first `at_page` pages and the rest."""
        return self.ledger.split_extent(extent, at_page)

    @operation()
    def retain(self, extent: CacheExtentRef) -> None:
        """Add a reference to a live extent."""
        self.ledger.retain_extent(extent)

    @operation()
    def release(self, extent: CacheExtentRef) -> None:
        """Drop a reference; with the last one the extent ends and its pages lose a holder."""
        self.ledger.apply_intent(Release(extent))

    # -- tier moves and completions ----------------------------------------------------

    @operation()
    def submit(self, intents: tuple[TierIntent | Persist, ...]) -> tuple[TransferTicket, ...]:
        """Apply standalone tier intents in order, atomically; a ticket per Backup, Restore and Persist."""
        tickets = self.ledger.submit(intents)
        self.commit()
        self._launch_started()
        self.device_layer.pump_after_submit()
        return tickets

    @operation(journal=False)
    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        """Complete the transfers whose device work is done (dependencies first); report as `reporting` says."""
        ledger, layer = self.ledger, self.device_layer
        layer.pump_idle()
        if ledger.state.transfers:
            ledger.complete_in_order(*layer.done(list(ledger.state.transfers)))
        return ledger.report(wait=False)

    @operation()
    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        """Block until every transfer has finished, complete them all, report everything.

        The ledger's completions (per page: its tags and its copy made valid, or gone for a
        copy that failed) run before the host blocks on the copies' events, so on CUDA they
        overlap the copies' tail; journaled, they are undone if the wait is interrupted.
        """
        ledger = self.ledger
        pending, failed, failures = self.device_layer.wait_all(sorted(ledger.state.transfers))
        ledger.complete_all(failed, failures)
        for launched in pending:
            launched.event.synchronize()
        return ledger.report(wait=True)

    @operation()
    def restart(self) -> RuntimeInfo:
        """Drain and discard transfers, forget everything, bump the epoch: every handle goes stale.

        After RuntimeLost nothing can drain: the streams are replaced and the transfers in
        flight abandoned (their copies never land); the runtime serves again.
        """
        layer, ledger = self.device_layer, self.ledger
        if not ledger.state.lost and layer.alive():
            layer.drain()
        if not ledger.state.lost and layer.alive():
            ledger.restart(*layer.outcomes(t for t in ledger.state.transfers if t in layer.launched))
        else:
            layer.replace_streams()
            ledger.restart(abandoned=True)
        self.commit()
        return self._info()

    # -- introspection (test-only; never part of a scheduling step) --------------------

    def probe(self) -> AbstractState:
        """The abstract state; tags from the real KV bytes when the runner is tagged."""
        layer, ledger = self.device_layer, self.ledger
        tags = layer.read_tags() if layer.runner.tagged else {tier: pool.tags for tier, pool in ledger.state.pools.items()}
        return ledger.abstract_state(tags, self.stored_objects())

    # -- the call's commit and its device work -----------------------------------------

    def commit(self) -> None:
        """Every precondition held: keep the ledger's changes, count the call (B1), forget completed launches."""
        ledger = self.ledger
        ledger.txn.commit(ledger.state.calls)
        if self.device_layer.launched:
            self.device_layer.forget(ledger.state.transfers)

    def _launch_started(self) -> None:
        """Issue the transfers this call started, in id order, each on its stream."""
        txn = self.ledger.txn
        if txn.started:
            self.device_layer.launch_all(txn.started, self.ledger.state.transfers, self.ledger.state.doomed)
            txn.started = []
