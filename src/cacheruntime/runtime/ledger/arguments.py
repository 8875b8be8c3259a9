"""Argument checks: the types and ranges of what control passes in, before anything else (§3).

A call whose argument has the wrong type (a float page index, a string slot id,
`attach=None`, a bool where an int belongs) or is out of range (a negative page count in a
run, a token id outside the vocabulary) raises `InvalidArgument` here, before the handle
checks and before the ledger changes: nothing downstream ever meets such a value half-way
through a change. Objects of the wrong class where a handle or intent is expected keep
their errors (`UnknownHandle`, `InvalidPlan`).

The same rules as the reference model's `arguments`, written for the hot path: a plan's
token ids are checked in bulk (their set of types, their minimum and maximum), and a plan
the decode cache already accepted is not checked again (`decode.item_handles`).
"""

from __future__ import annotations

from itertools import chain
from typing import Any

from cacheruntime.protocol import (
    Backup,
    BatchItem,
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
_SEQUENCES = (tuple, list)


def describe(value: object) -> str:
    """The type and a clipped repr of a bad value, for the message."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def int_argument(what: str, value: object) -> None:
    """InvalidArgument unless `value` is an int (a bool, a float or an array scalar is not)."""
    if type(value) is not int:
        raise InvalidArgument(f"{what} must be an int, got {describe(value)}")


def tuple_argument(what: str, value: Any) -> tuple[Any, ...] | list[Any]:
    """InvalidArgument unless `value` is a tuple (or a list); `None` is not an empty tuple."""
    if type(value) is not tuple and not isinstance(value, _SEQUENCES):
        raise InvalidArgument(f"{what} must be a tuple, got {describe(value)} (use () for none)")
    return value


def keys_argument(what: str, keys: object) -> None:
    """L3 keys: a non-empty tuple of non-empty strings (control's, one per page)."""
    seq = tuple_argument(what, keys)
    if not seq:
        raise InvalidArgument(f"{what} must name at least one key")
    for key in seq:
        if type(key) is not str or not key:
            raise InvalidArgument(f"an L3 key in {what} must be a non-empty str, got {describe(key)}")


def request_fields(request: object) -> None:
    if isinstance(request, RequestRuntimeHandle):
        if type(request.runtime_id) is not str:
            raise InvalidArgument(f"RequestRuntimeHandle.runtime_id must be a str, got {describe(request.runtime_id)}")
        int_argument("RequestRuntimeHandle.epoch", request.epoch)
        int_argument("RequestRuntimeHandle.slot_id", request.slot_id)
        int_argument("RequestRuntimeHandle.generation", request.generation)


def extent_fields(extent: object) -> None:
    if isinstance(extent, CacheExtentRef):
        if type(extent.runtime_id) is not str:
            raise InvalidArgument(f"CacheExtentRef.runtime_id must be a str, got {describe(extent.runtime_id)}")
        int_argument("CacheExtentRef.epoch", extent.epoch)
        int_argument("CacheExtentRef.generation", extent.generation)
        for run in tuple_argument("CacheExtentRef.page_runs", extent.page_runs):
            if type(run) is not PageRun:
                raise InvalidArgument(f"CacheExtentRef.page_runs must hold PageRuns, got {describe(run)}")
            int_argument("PageRun.first_page", run.first_page)
            int_argument("PageRun.page_count", run.page_count)
            if run.first_page < 0 or run.page_count < 1:
                raise InvalidArgument(f"{run} is not a run of pages: first_page must be >= 0 and page_count >= 1")


def batch_fields(batch: object) -> None:
    if isinstance(batch, PreparedBatchHandle):
        if type(batch.runtime_id) is not str:
            raise InvalidArgument(f"PreparedBatchHandle.runtime_id must be a str, got {describe(batch.runtime_id)}")
        int_argument("PreparedBatchHandle.epoch", batch.epoch)
        int_argument("PreparedBatchHandle.batch_id", batch.batch_id)


def intents_fields(what: str, intents: object) -> None:
    """The container and every intent's fields (an object that is no intent is `InvalidPlan` later)."""
    for intent in tuple_argument(what, intents):
        if isinstance(intent, _EXTENT_INTENTS):
            extent_fields(intent.extent)
            if isinstance(intent, Persist):
                keys_argument("Persist.keys", intent.keys)
        elif isinstance(intent, Fetch):
            request_fields(intent.request)
            keys_argument("Fetch.keys", intent.keys)
        elif isinstance(intent, Publish):
            request_fields(intent.request)
            int_argument("Publish.first_page", intent.first_page)
            int_argument("Publish.page_count", intent.page_count)
        elif isinstance(intent, Close):
            request_fields(intent.request)


def items_fields(items: object, vocab_size: int) -> None:
    """Every item's fields, in plan order; then every token id of the plan at once."""
    for item in tuple_argument("BatchPlan.items", items):
        if type(item) is not BatchItem:
            raise InvalidArgument(f"BatchPlan.items must hold BatchItems, got {describe(item)}")
        request_fields(item.request)
        tuple_argument("BatchItem.input_ids", item.input_ids)
        if item.attach:
            for extent in tuple_argument("BatchItem.attach", item.attach):
                extent_fields(extent)
        else:
            tuple_argument("BatchItem.attach", item.attach)
        if type(item.append_previous_output) is not bool:
            raise InvalidArgument(f"BatchItem.append_previous_output must be a bool, got {describe(item.append_previous_output)}")
    tokens = list(chain.from_iterable(item.input_ids for item in items))  # type: ignore[attr-defined]
    if tokens:
        kinds = set(map(type, tokens))
        if kinds != {int}:
            bad = next(token for token in tokens if type(token) is not int)
            raise InvalidArgument(f"a token id in BatchItem.input_ids must be an int, got {describe(bad)}")
        low, high = min(tokens), max(tokens)
        if low < 0 or high >= vocab_size:
            raise InvalidArgument(f"token id {low if low < 0 else high} is outside the vocabulary 0 .. {vocab_size - 1} (RuntimeInfo.vocab_size)")
