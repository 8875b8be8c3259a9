"""Argument checks: every value control passes in has the type and range the protocol declares.

They run first in every operation, before the handle checks (spec/protocol.md §3), so that
an ill-typed call fails with `InvalidArgument` before any code that would trip over it
(a float page index, a string slot id, `attach=None`). A value of the wrong *class* where
a handle or an intent is expected keeps its own error (`UnknownHandle`, `InvalidPlan`):
only the fields of the protocol's own values are checked here.
"""

from __future__ import annotations

from typing import Any

from cacheruntime.protocol import (
    Backup,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    Close,
    Demote,
    Drop,
    Fetch,
    InvalidArgument,
    PageRun,
    Persist,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestRuntimeHandle,
    Restore,
)

_EXTENT_INTENTS = (Backup, Restore, Demote, Drop, Release, Persist)


def shown(value: object) -> str:
    """A short description of a bad value for a message: its type and (clipped) repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def require_int(what: str, value: object) -> None:
    """`value` is an int (not a bool, float, string or an array scalar)."""
    if type(value) is not int:
        raise InvalidArgument(f"{what} must be an int, got {shown(value)}")


def require_str(what: str, value: object) -> None:
    if type(value) is not str:
        raise InvalidArgument(f"{what} must be a str, got {shown(value)}")


def require_sequence(what: str, value: object) -> tuple[Any, ...] | list[Any]:
    """`value` is a tuple (a list is accepted too, as before); `None` or a single value is not."""
    if not isinstance(value, (tuple, list)):
        raise InvalidArgument(f"{what} must be a tuple, got {shown(value)} (use () for none)")
    return value


def check_keys(what: str, keys: object) -> None:
    """L3 keys: a non-empty tuple of non-empty strings (control's, one per page)."""
    seq = require_sequence(what, keys)
    if not seq:
        raise InvalidArgument(f"{what} must name at least one key")
    for key in seq:
        if type(key) is not str or not key:
            raise InvalidArgument(f"an L3 key in {what} must be a non-empty str, got {shown(key)}")


def check_request_fields(request: object) -> None:
    """The fields of a request handle (another class is left to `UnknownHandle`)."""
    if isinstance(request, RequestRuntimeHandle):
        require_str("RequestRuntimeHandle.runtime_id", request.runtime_id)
        require_int("RequestRuntimeHandle.epoch", request.epoch)
        require_int("RequestRuntimeHandle.slot_id", request.slot_id)
        require_int("RequestRuntimeHandle.generation", request.generation)


def check_extent_fields(extent: object) -> None:
    """The fields of an extent ref, its page runs included: whole, non-negative runs."""
    if isinstance(extent, CacheExtentRef):
        require_str("CacheExtentRef.runtime_id", extent.runtime_id)
        require_int("CacheExtentRef.epoch", extent.epoch)
        require_int("CacheExtentRef.generation", extent.generation)
        for run in require_sequence("CacheExtentRef.page_runs", extent.page_runs):
            if not isinstance(run, PageRun):
                raise InvalidArgument(f"CacheExtentRef.page_runs must hold PageRuns, got {shown(run)}")
            require_int("PageRun.first_page", run.first_page)
            require_int("PageRun.page_count", run.page_count)
            if run.first_page < 0 or run.page_count < 1:
                raise InvalidArgument(f"{run} is not a run of pages: first_page must be >= 0 and page_count >= 1")


def check_batch_fields(batch: object) -> None:
    if isinstance(batch, PreparedBatchHandle):
        require_str("PreparedBatchHandle.runtime_id", batch.runtime_id)
        require_int("PreparedBatchHandle.epoch", batch.epoch)
        require_int("PreparedBatchHandle.batch_id", batch.batch_id)


def check_intent_fields(intent: object) -> None:
    """The fields of one intent (an object that is no intent is left to `InvalidPlan`)."""
    if isinstance(intent, _EXTENT_INTENTS):
        check_extent_fields(intent.extent)
        if isinstance(intent, Persist):
            check_keys("Persist.keys", intent.keys)
    elif isinstance(intent, Fetch):
        check_request_fields(intent.request)
        check_keys("Fetch.keys", intent.keys)
    elif isinstance(intent, Publish):
        check_request_fields(intent.request)
        require_int("Publish.first_page", intent.first_page)
        require_int("Publish.page_count", intent.page_count)
    elif isinstance(intent, Close):
        check_request_fields(intent.request)


def check_intents(what: str, intents: object) -> None:
    for intent in require_sequence(what, intents):
        check_intent_fields(intent)


def check_plan_fields(plan: BatchPlan, vocab_size: int) -> None:
    """Every field of a plan, items first, then intents; token ids inside 0 .. vocab_size-1."""
    for item in require_sequence("BatchPlan.items", plan.items):
        if not isinstance(item, BatchItem):
            raise InvalidArgument(f"BatchPlan.items must hold BatchItems, got {shown(item)}")
        check_request_fields(item.request)
        for token in require_sequence("BatchItem.input_ids", item.input_ids):
            require_int("a token id in BatchItem.input_ids", token)
            if not 0 <= token < vocab_size:
                raise InvalidArgument(f"token id {token} is outside the vocabulary 0 .. {vocab_size - 1} (RuntimeInfo.vocab_size)")
        for extent in require_sequence("BatchItem.attach", item.attach):
            check_extent_fields(extent)
        if type(item.append_previous_output) is not bool:
            raise InvalidArgument(f"BatchItem.append_previous_output must be a bool, got {shown(item.append_previous_output)}")
    check_intents("BatchPlan.intents", plan.intents)
