"""`SkeletonRuntime`: the boundary's operations over the ledger, the memories and the copy streams.

Every operation is one transaction: it runs on a draft (a deep copy) of the ledger and
the draft replaces the ledger only if the operation returns; an operation that raises
a `CacheRuntimeError` leaves the ledger exactly as it was, which is the contract's
atomicity rule (spec §3, H1) by construction. Only then does the hardware act: compute
writes and reads memory, and the copier starts the transfers the call recorded. A real
engine would validate first and then apply, or keep an undo log; the draft keeps this
template short and hard to get wrong.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import attrs

from cacheruntime.protocol import (
    AbstractState,
    BatchCompletion,
    BatchPlan,
    CacheExtentRef,
    Capability,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    RuntimeInfo,
    TierIntent,
    TransferCompletion,
    TransferKind,
    TransferTicket,
)

from . import batches, compute, extents, requests, tiers
from .copier import Copier
from .ledger import Ledger, new_epoch
from .memory import Memory
from .probe import probe
from .transfers import complete_with_predecessors, report

T = TypeVar("T")


class SkeletonRuntime:
    """A plain-Python cache runtime that implements `RuntimeInterface`, `probe()` and `set_transfer_delay()`."""

    def __init__(self, *, runtime_id: str, page_size: int, max_requests: int, max_request_tokens: int, l1_pages: int, l2_pages: int, vocab_size: int):
        claims = {Capability.INTROSPECTION, Capability.RESTART, Capability.TAGGED_COMPUTE}
        if l2_pages:  # transfers exist only with a host tier
            claims |= {Capability.L2, Capability.ASYNC_TRANSFERS, Capability.DELAY_KNOB}
        self._info = RuntimeInfo(runtime_id, 0, page_size, max_requests, max_request_tokens, l1_pages, l2_pages, frozenset(claims), vocab_size=vocab_size)
        self._memory = Memory(page_size, l1_pages, l2_pages)
        self._copier = Copier(self._memory)
        self._ledger = new_epoch(self._info, [0] * max_requests, next_version=1)

    # -- the transaction ---------------------------------------------------------------

    def _draft(self) -> Ledger:
        return copy.deepcopy(self._ledger)

    def _commit(self, operation: str, draft: Ledger) -> None:
        """The draft becomes the ledger; the operation counts for B1 (only successful calls do)."""
        draft.calls[operation] += 1
        self._ledger = draft

    def _call(self, operation: str, body: Callable[..., T], *args: object) -> T:
        draft = self._draft()
        result = body(draft, *args)
        self._commit(operation, draft)
        self._copier.sync(draft.transfers)
        return result

    # -- the boundary --------------------------------------------------------------------

    def info(self) -> RuntimeInfo:
        self._ledger.calls["info"] += 1  # it cannot fail, so no draft is needed
        return self._info

    def open_request(self) -> RequestRuntimeHandle:
        return self._call("open_request", requests.open_request)

    def close_request(self, request: RequestRuntimeHandle) -> None:
        self._call("close_request", requests.close_request, request)

    def prepare_batch(self, plan: BatchPlan) -> PreparedBatchHandle:
        return self._call("prepare_batch", batches.prepare, plan)

    def execute_batch(self, batch: PreparedBatchHandle) -> BatchCompletion:
        """Compute runs after the commit, and the copier starts the batch's backups after compute (O2)."""
        draft = self._draft()
        completion, work = batches.execute(draft, batch, self._copier.wait)
        self._commit("execute_batch", draft)
        tokens = compute.run(self._memory, work, draft.page_size)
        self._copier.sync(draft.transfers)
        items = tuple(attrs.evolve(item, next_token=token) for item, token in zip(completion.items, tokens))
        return attrs.evolve(completion, items=items)

    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        self._call("cancel_batch", batches.cancel, batch)

    def publish(self, request: RequestRuntimeHandle, first_page: int, page_count: int) -> CacheExtentRef:
        return self._call("publish", extents.publish, request, first_page, page_count)

    def split(self, extent: CacheExtentRef, at_page: int) -> tuple[CacheExtentRef, CacheExtentRef]:
        return self._call("split", extents.split, extent, at_page)

    def retain(self, extent: CacheExtentRef) -> None:
        self._call("retain", extents.retain, extent)

    def release(self, extent: CacheExtentRef) -> None:
        self._call("release", extents.release, extent)

    def submit(self, intents: tuple[TierIntent, ...]) -> tuple[TransferTicket, ...]:
        return self._call("submit", tiers.submit, intents)

    def poll_completions(self) -> tuple[TransferCompletion, ...]:
        """Complete, in the ledger, every transfer whose bytes have landed; report what is unreported."""

        def poll(ledger: Ledger) -> tuple[TransferCompletion, ...]:
            complete_with_predecessors(ledger, {t for t in ledger.transfers if self._copier.landed(t)})
            return report(ledger)

        return self._call("poll_completions", poll)

    def wait_completions(self) -> tuple[TransferCompletion, ...]:
        """Block until every transfer's bytes have landed, then complete and report them all."""

        def wait(ledger: Ledger) -> tuple[TransferCompletion, ...]:
            self._copier.wait(ledger.transfers)
            complete_with_predecessors(ledger, set(ledger.transfers))
            return report(ledger)

        return self._call("wait_completions", wait)

    def restart(self) -> RuntimeInfo:
        """Drain the copies, forget the epoch, close live slots; version tags and memory carry on.

        The restart is the new epoch's first boundary call: it counts there (B1), and its
        answer is not counted as a call of `info`.
        """
        self._copier.drain()
        old = self._ledger
        self._info = attrs.evolve(self._info, epoch=old.epoch + 1)
        self._ledger = new_epoch(self._info, [slot.generation + slot.live for slot in old.slots], old.next_version)
        self._ledger.calls["restart"] += 1
        return self._info

    # -- test-only surfaces ----------------------------------------------------------------

    def probe(self) -> AbstractState:
        return probe(self._ledger, self._memory)

    def set_transfer_delay(self, seconds: float, kind: TransferKind | None = None) -> None:
        self._copier.set_delay(seconds, kind)

    def close(self) -> None:
        """Stop the copy streams (the conformance suite calls this at the end of every case)."""
        self._copier.close()
