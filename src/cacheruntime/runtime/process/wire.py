"""The process runtime's messages: protocol values to bytes and back, one message per boundary call.

A request is `(operation, args, kwargs, unsent polls)` (the polls the client answered
itself since its last message, `client.py`), a reply `(OK, value)` (an `execute_batch`'s
is `(OK, completion, quiet)`, quiet True when a poll now reports nothing),
`(ERROR, [type name, message, attributes])` for a typed error, or `(CRASH, exception type
name, message)` for an untyped one (a bug, or a test knob's `ValueError`).

A decode step's short forms. Control keeps one immutable plan for a running decode set
(the ledger's decode cache relies on it too), so both sides remember the items of one
accepted plan and their handles. The client decides what is remembered: a plan whose items
cannot change in place (`immutable_items`) is sent as `(PREPARE_REMEMBER, (plan,), ...)`,
and when the runtime accepts it both sides remember its items, the client on the OK reply,
the runtime process on the success it replies; any other plan, and any rejected one, leaves
both memories as they were. A `prepare_batch` of the very items remembered is the request
`(PREPARE_AGAIN, (intents,), ...)`, and the runtime process prepares a plan of its own copy:
the same tuple its ledger checked, so its decode cache holds, as in-process. The completion
of a batch prepared of those items, whose items are exactly `ItemResult`s of their own
handles in order, is the reply `(ON_PLAN, [batch, token counts, next tokens, published,
tickets], quiet)`, and control rebuilds it around the handles it holds. On the H200 host at
B=64 this took the plan's encoding and decoding from 86 and 68 us to 6-9 and 4-5, the
runtime process's `prepare_batch` from 104 to 36-53 us (29-41 in-process), and the
completion's from 62 and 137 to 22-30 and 17-25 (docs/benchmarks.md).

Serialization is pickle (protocol 5) with a dispatch table that reduces each frozen attrs
record of `cacheruntime.protocol` to its constructor and field values, so that pickle's C
loop rebuilds a record by one call of the record's own constructor. Why this and not the
alternatives (measured by `benchmarks/diagnostics/wireformat.py`, figures in
docs/process-runtime.md): pickling the records as they are runs attrs' Python
`__setstate__` per record, several times slower; a Python walk that flattens records into
lists before pickling is slower still on the receiving side; msgspec (MessagePack) encodes
attrs records but cannot decode the protocol's unions of records (an `Intent`, a reply of
any type) without a tag, so it needs such a walk too, and then also turns every tuple into
a list that must be walked back. Pickle's trust model is the process runtime's anyway: both
ends are this package, on one host, over a socket in a private directory (`client.py`).

A decode step's two large messages, a `BatchPlan` and a `BatchCompletion`, cross as columns
instead: one list per field of their items and of the items' request handles, taken with
`map` and rebuilt with `map` over the fields' slot setters (`_records`, as the ledger's
`item_results` builds its results), so that neither end runs Python per item. Per record
through the dispatch table, each item cost a reducer call to save and an attrs `__init__`
to load, twice (the item and its handle): 73 and 86 us at B=64 for a plan here, about four
fifths of it per-record calls. A plan or completion whose items or handles are not exactly
the protocol's classes (a bad argument) crosses record by record as before, so whatever
control passed arrives as it was.

Request handles arrive as the receiving process's own objects where it has one of that value:
each process remembers the handles it sent or received (the latest per slot, so the table
stays as small as the slots), and a decoded handle of a remembered value is that object. The
runtime process then checks the very handles its `open_request` made, as in-process, and control
gets back in a completion the handles it holds. Measured on the H200 host at B=64 before this
(docs/process-runtime.md): building a decode step's handles anew cost the runtime process's
`prepare_batch` 146-170 us against 58 in-process, besides their decoding. Handles are frozen
values, so which equal object arrives changes nothing else.

Typed errors cross as `[class name, message, attributes]` and are rebuilt without calling
their constructors (`OutOfPages` and `ComputeFailed` take other arguments than the
message), as the nearest protocol type they are, with the type, message and fields the
runtime raised.
"""

from __future__ import annotations

import builtins
import copyreg
import io
import operator
import pickle
import struct
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from typing import Any

import attrs

from cacheruntime import protocol
from cacheruntime.protocol import BatchCompletion, BatchItem, BatchPlan, CacheExtentRef, CacheRuntimeError, ItemResult, RequestRuntimeHandle

OK, ERROR, CRASH, ON_PLAN = 0, 1, 2, 3
#: A `prepare_batch` whose plan's items both sides should remember if the runtime accepts it
#: (`immutable_items` holds for them); it carries the plan as a `prepare_batch` does.
PREPARE_REMEMBER = "prepare_batch remember"
#: A `prepare_batch` of a plan with the very items both sides remember: it carries the intents only.
PREPARE_AGAIN = "prepare_batch again"


def quiet(reply: tuple[Any, ...]) -> bool:
    """Whether `reply` is an `execute_batch`'s that says a poll now reports nothing (`server.poll_reports_nothing`)."""
    return len(reply) == 3 and reply[2] is True


_ERRORS: dict[str, type[CacheRuntimeError]] = {c.__name__: c for c in vars(protocol).values() if isinstance(c, type) and issubclass(c, CacheRuntimeError)}


def keyword_record(cls: type, positional: tuple[Any, ...], keywords: dict[str, Any]) -> Any:
    """Rebuild a record that has keyword-only fields (`RuntimeInfo.vocab_size`)."""
    return cls(*positional, **keywords)


#: The request handles this process sent or received, by value (runtime id, epoch, slot, generation).
_HANDLES: dict[tuple[str, int, int, int], RequestRuntimeHandle] = {}
#: Per (runtime id, slot): the value remembered last, the only one `_HANDLES` keeps for the slot.
_LATEST: dict[tuple[str, int], tuple[str, int, int, int]] = {}


def _remember(key: tuple[str, int, int, int], handle: RequestRuntimeHandle) -> RequestRuntimeHandle:
    slot = (key[0], key[2])
    previous = _LATEST.get(slot)
    if previous is not None and previous != key:
        _HANDLES.pop(previous, None)
    _LATEST[slot] = key
    _HANDLES[key] = handle
    return handle


def _typed(runtime_id: Any, epoch: Any, slot_id: Any, generation: Any) -> bool:
    """Whether a handle's fields are exactly str, int, int, int: only such handles are remembered,
    since a key does not tell 1 from True or 1.0, and a handle with fields of other types (bad
    input) must arrive with the types control gave it."""
    return type(runtime_id) is str and type(epoch) is int and type(slot_id) is int and type(generation) is int


def handle_of(runtime_id: str, epoch: int, slot_id: int, generation: int) -> RequestRuntimeHandle:
    """The handle of this value: this process's own object if it has one, else a new one it remembers."""
    if not _typed(runtime_id, epoch, slot_id, generation):
        return RequestRuntimeHandle(runtime_id, epoch, slot_id, generation)
    key = (runtime_id, epoch, slot_id, generation)
    known = _HANDLES.get(key)
    return known if known is not None else _remember(key, RequestRuntimeHandle(runtime_id, epoch, slot_id, generation))


def _reduce_handle(handle: RequestRuntimeHandle) -> tuple[Any, ...]:
    """How pickle saves a request handle (exactly of the class: the dispatch table is by type)."""
    values = (handle.runtime_id, handle.epoch, handle.slot_id, handle.generation)
    if _typed(*values) and _HANDLES.get(values) is not handle:
        _remember(values, handle)  # sent: whatever comes back with this value arrives as this object
    return (handle_of, values)


def _handles(columns: Sequence[Sequence[Any]]) -> Sequence[RequestRuntimeHandle]:
    """The handles whose fields are `columns`, remembered objects where this process has them."""
    if not (_exactly(str, columns[0]) and _exactly(int, columns[1]) and _exactly(int, columns[2]) and _exactly(int, columns[3])):
        return _records(RequestRuntimeHandle, columns)  # fields of other types (bad input), or no items
    keys = list(zip(*columns, strict=True))
    found: list[Any] = list(map(_HANDLES.get, keys))
    if any(map(operator.is_, found, repeat(None))):
        found = [known if known is not None else handle_of(*key) for known, key in zip(found, keys)]
    return found


def _reducer(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """How pickle saves a record of `cls`: its constructor and its field values."""
    fields = attrs.fields(cls)
    names = [f.name for f in fields if not f.kw_only]
    keywords = [f.name for f in fields if f.kw_only]
    if keywords:
        return lambda value: (keyword_record, (cls, tuple(getattr(value, n) for n in names), {k: getattr(value, k) for k in keywords}))
    if len(names) == 1:
        only = names[0]
        return lambda value: (cls, (getattr(value, only),))
    values = operator.attrgetter(*names)
    return lambda value: (cls, values(value))


_new_object = object.__new__
_exhaust: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend  # runs an iterator to its end in C
#: Per columnar class: its fields' getters and its slots' setters, in field order.
_GETTERS: dict[type, list[Callable[[Any], Any]]] = {
    cls: [operator.attrgetter(f.name) for f in attrs.fields(cls)] for cls in (RequestRuntimeHandle, BatchItem, ItemResult)
}
_SETTERS: dict[type, list[Callable[[Any, Any], None]]] = {cls: [cls.__dict__[f.name].__set__ for f in attrs.fields(cls)] for cls in _GETTERS}


def _columns(cls: type, records: Sequence[Any]) -> list[list[Any]]:
    """One list per field of `records` (all exactly of `cls`)."""
    return [list(map(get, records)) for get in _GETTERS[cls]]


def _records(cls: type, columns: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    """The records of `cls` whose fields are `columns`, set through the slots: the values an
    attrs `__init__` makes (the frozen classes have no converters, validators or hooks)."""
    records: tuple[Any, ...] = tuple(map(_new_object, repeat(cls, len(columns[0]))))
    for set_field, values in zip(_SETTERS[cls], columns, strict=True):
        _exhaust(map(set_field, records, values))
    return records


def _exactly(cls: type, values: Iterable[Any]) -> bool:
    return set(map(type, values)) == {cls}


def _columnar(items: Any, cls: type) -> list[Any] | None:
    """The columns of `items` with their requests' columns in place of the requests, if every
    item is exactly `cls` with exactly a `RequestRuntimeHandle`; else None."""
    if type(items) is not tuple or not _exactly(cls, items):
        return None
    columns: list[Any] = _columns(cls, items)
    if not _exactly(RequestRuntimeHandle, columns[0]):
        return None
    return [_columns(RequestRuntimeHandle, columns[0]), *columns[1:]]


def _remember_sent(handles: Sequence[RequestRuntimeHandle], columns: Sequence[Sequence[Any]]) -> None:
    """Remember the handles a plan sends as columns, as `_reduce_handle` remembers one sent alone:
    its completion, which comes back with their values, then arrives with these very objects
    (control gets back the handles it put in its plan, not an equal one it sent before)."""
    if not (_exactly(str, columns[0]) and _exactly(int, columns[1]) and _exactly(int, columns[2]) and _exactly(int, columns[3])):
        return
    keys = list(zip(*columns, strict=True))
    if any(map(operator.is_not, map(_HANDLES.get, keys), handles)):
        for key, handle in zip(keys, handles):
            if _HANDLES.get(key) is not handle:
                _remember(key, handle)


def _items(cls: type, columns: list[Any]) -> tuple[Any, ...]:
    return _records(cls, [_handles(columns[0]), *columns[1:]])


def plan_of_columns(columns: list[Any], intents: Any) -> BatchPlan:
    """Rebuild a plan that crossed as columns."""
    return BatchPlan(_items(BatchItem, columns), intents)


def completion_of_columns(batch: Any, columns: list[Any], published: Any, tickets: Any) -> BatchCompletion:
    """Rebuild a completion that crossed as columns."""
    return BatchCompletion(batch, _items(ItemResult, columns), published, tickets)


_request_of = operator.attrgetter("request")
_input_ids_of = operator.attrgetter("input_ids")
_attach_of = operator.attrgetter("attach")
_page_runs_of = operator.attrgetter("page_runs")
_num_tokens_of = operator.attrgetter("num_tokens")
_next_token_of = operator.attrgetter("next_token")


def immutable_items(plan: Any) -> tuple[BatchItem, ...] | None:
    """The items of `plan` if nothing in them can change in place, else None: exactly a `BatchPlan`
    whose items are a tuple of exactly `BatchItem`s, each with exactly a `RequestRuntimeHandle`, a
    tuple of input ids and a tuple of attached extents, each extent's page runs a tuple.

    The runtime also takes lists where the protocol says tuple (`ledger/arguments.py`), and a
    list can change between two prepares of the same plan: such a plan always crosses whole. Of
    an immutable plan, what the runtime accepts is immutable all the way down (its checks leave
    only ints and frozen records inside), so a copy of it stays equal to it."""
    if type(plan) is not BatchPlan:
        return None
    items = plan.items
    if type(items) is not tuple or not _exactly(BatchItem, items) or not _exactly(RequestRuntimeHandle, map(_request_of, items)):
        return None
    if not _exactly(tuple, map(_input_ids_of, items)) or not _exactly(tuple, map(_attach_of, items)):
        return None
    attached = list(chain.from_iterable(map(_attach_of, items)))
    if attached and not (_exactly(CacheExtentRef, attached) and _exactly(tuple, map(_page_runs_of, attached))):
        return None
    return items


def requests_of(items: tuple[BatchItem, ...] | None) -> list[RequestRuntimeHandle] | None:
    return None if items is None else list(map(_request_of, items))


def completion_on_plan(completion: Any, requests: list[RequestRuntimeHandle] | None) -> list[Any] | None:
    """The parts of a completion whose items are exactly `ItemResult`s of the very handles `requests`
    (the accepted plan's), in order: the batch, the token counts, the next tokens, published and
    tickets; None for any other (it crosses whole)."""
    if requests is None or type(completion) is not BatchCompletion:
        return None
    items = completion.items
    if type(items) is not tuple or len(items) != len(requests) or not _exactly(ItemResult, items):
        return None
    if not all(map(operator.is_, map(_request_of, items), requests)):
        return None
    return [completion.batch, list(map(_num_tokens_of, items)), list(map(_next_token_of, items)), completion.published, completion.tickets]


def completion_of_plan(parts: list[Any], requests: list[RequestRuntimeHandle]) -> BatchCompletion:
    """The completion `completion_on_plan` took apart, with this side's handles of the accepted plan."""
    batch, num_tokens, next_tokens, published, tickets = parts
    return BatchCompletion(batch, _records(ItemResult, [requests, num_tokens, next_tokens]), published, tickets)


def _reduce_plan(plan: BatchPlan) -> tuple[Any, ...]:
    columns = _columnar(plan.items, BatchItem)
    if columns is None:
        return (BatchPlan, (plan.items, plan.intents))
    _remember_sent(list(map(_request_of, plan.items)), columns[0])
    return (plan_of_columns, (columns, plan.intents))


def _reduce_completion(completion: BatchCompletion) -> tuple[Any, ...]:
    columns = _columnar(completion.items, ItemResult)
    if columns is None:
        return (BatchCompletion, (completion.batch, completion.items, completion.published, completion.tickets))
    return (completion_of_columns, (completion.batch, columns, completion.published, completion.tickets))


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH.update({cls: _reducer(cls) for cls in vars(protocol).values() if isinstance(cls, type) and attrs.has(cls)})
_DISPATCH.update({BatchPlan: _reduce_plan, BatchCompletion: _reduce_completion, RequestRuntimeHandle: _reduce_handle})


# -- a decode step's messages, in fixed layouts ------------------------------------------
#
# A decode step's four messages are coded right after the wait for the other process, when
# the code runs cold (the client's `_warm`), and there pickle's general path costs about a
# quarter more than a fixed layout (`benchmarks/diagnostics/afterspin.py`). So a short
# prepare without intents, an `execute_batch`, prepare's handle reply and a short completion
# with nothing published and no tickets cross as a tag byte (a pickle opens with 0x80) and
# `struct`/`array` fields, each only when its values have exactly the layout's types (str,
# int in 64 bits, bool): what arrives equals what was sent, types and all. Else: pickle.

PreparedBatchHandle = protocol.PreparedBatchHandle
_TAG_AGAIN, _TAG_EXECUTE, _TAG_HANDLE, _TAG_COMPLETION = b"A"[0], b"E"[0], b"H"[0], b"C"[0]
_AGAIN = struct.Struct("=BI")  # tag, unsent polls
_EXECUTE = struct.Struct("=BIqqH")  # tag, unsent polls, the handle's epoch, batch id, runtime id's length (then its bytes)
_HANDLE = struct.Struct("=BqqH")  # tag, epoch, batch id, runtime id's length (then its bytes)
_COMPLETION = struct.Struct("=B?qqHI")  # tag, quiet, epoch, batch id, runtime id's length, items (then the id, token counts, next tokens)
_INT64 = range(-(2**63), 2**63)
_TAGS = frozenset((_TAG_AGAIN, _TAG_EXECUTE, _TAG_HANDLE, _TAG_COMPLETION))


def _batch_fields(batch: Any) -> tuple[bytes, int, int] | None:
    """A batch handle's runtime id (UTF-8), epoch and batch id if it is exactly a `PreparedBatchHandle`
    of a str and two ints in 64 bits; else None (it is pickled)."""
    if type(batch) is not PreparedBatchHandle:
        return None
    runtime_id, epoch, batch_id = batch.runtime_id, batch.epoch, batch.batch_id
    if type(runtime_id) is not str or type(epoch) is not int or type(batch_id) is not int or epoch not in _INT64 or batch_id not in _INT64:
        return None
    try:
        encoded = runtime_id.encode()
    except UnicodeEncodeError:
        return None
    return (encoded, epoch, batch_id) if len(encoded) < 2**16 else None


def _int64s(values: list[Any]) -> bytes | None:
    if not _exactly(int, values):
        return None
    try:
        return array("q", values).tobytes()
    except OverflowError:
        return None


def laid_out(data: bytes) -> bool:
    return data[0] in _TAGS  # one of a decode step's layouts, not a pickle


def dumps_request(operation: str, args: tuple[Any, ...], kwargs: dict[str, Any], unsent_polls: int) -> bytes:
    """A request: a short prepare without intents or an `execute_batch` in its layout, any other pickled."""
    if not kwargs and type(unsent_polls) is int and unsent_polls in range(2**32):
        if operation == PREPARE_AGAIN and len(args) == 1 and type(args[0]) is tuple and not args[0]:
            return _AGAIN.pack(_TAG_AGAIN, unsent_polls)
        if operation == "execute_batch" and len(args) == 1 and (fields := _batch_fields(args[0])) is not None:
            return _EXECUTE.pack(_TAG_EXECUTE, unsent_polls, fields[1], fields[2], len(fields[0])) + fields[0]
    return dumps((operation, args, kwargs, unsent_polls))


def loads_request(data: bytes) -> tuple[Any, ...]:
    """The request `dumps_request` made of `data`: (operation, args, kwargs, unsent polls)."""
    tag = data[0]
    if tag == _TAG_AGAIN:
        return (PREPARE_AGAIN, ((),), {}, _AGAIN.unpack(data)[1])
    if tag == _TAG_EXECUTE:
        _, unsent, epoch, batch_id, size = _EXECUTE.unpack_from(data)
        runtime_id = data[_EXECUTE.size : _EXECUTE.size + size].decode()
        return ("execute_batch", (PreparedBatchHandle(runtime_id, epoch, batch_id),), {}, unsent)
    return loads(data)


def dumps_reply(reply: tuple[Any, ...]) -> bytes:
    """A reply: a batch handle or a short completion in its layout, any other pickled."""
    status = reply[0]
    if status == OK and len(reply) == 2 and (fields := _batch_fields(reply[1])) is not None:
        return _HANDLE.pack(_TAG_HANDLE, fields[1], fields[2], len(fields[0])) + fields[0]
    if status == ON_PLAN and type(reply[2]) is bool:
        batch, num_tokens, next_tokens, published, tickets = reply[1]
        fields = _batch_fields(batch)
        if fields is not None and type(published) is tuple and type(tickets) is tuple and not published and not tickets:
            counts, tokens = _int64s(num_tokens), _int64s(next_tokens)
            if counts is not None and tokens is not None:
                head = _COMPLETION.pack(_TAG_COMPLETION, reply[2], fields[1], fields[2], len(fields[0]), len(num_tokens))
                return b"".join((head, fields[0], counts, tokens))
    return dumps(reply)


def loads_reply(data: bytes) -> tuple[Any, ...]:
    """The reply `dumps_reply` made of `data`."""
    tag = data[0]
    if tag == _TAG_HANDLE:
        _, epoch, batch_id, size = _HANDLE.unpack_from(data)
        return (OK, PreparedBatchHandle(data[_HANDLE.size : _HANDLE.size + size].decode(), epoch, batch_id))
    if tag == _TAG_COMPLETION:
        _, quiet, epoch, batch_id, size, items = _COMPLETION.unpack_from(data)
        at = _COMPLETION.size + size
        columns = array("q")
        columns.frombytes(memoryview(data)[at:])
        values = columns.tolist()
        batch = PreparedBatchHandle(data[_COMPLETION.size : at].decode(), epoch, batch_id)
        return (ON_PLAN, [batch, values[:items], values[items:], (), ()], quiet)
    return loads(data)


def dumps(message: tuple[Any, ...]) -> bytes:
    """One message (a request or a reply) as bytes."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(message)
    return buffer.getvalue()


def loads(data: bytes) -> tuple[Any, ...]:
    """The message `dumps` made of `data`."""
    message: tuple[Any, ...] = pickle.loads(data)
    return message


def error_reply(error: BaseException) -> tuple[Any, ...]:
    """The reply for an exception the runtime raised: typed errors in full, anything else by type and message."""
    if isinstance(error, CacheRuntimeError):  # as the nearest protocol type it is (a runtime's own subclass is one)
        typed = next(cls for cls in type(error).__mro__ if _ERRORS.get(cls.__name__) is cls)
        return (ERROR, [typed.__name__, str(error), dict(vars(error))])
    return (CRASH, type(error).__name__, str(error))


def raise_reply(reply: tuple[Any, ...]) -> Any:
    """The value of an OK reply; raise the error of any other, as the runtime raised it."""
    status = reply[0]
    if status == OK:
        return reply[1]
    if status == ERROR:
        name, message, fields = reply[1]
        error = _ERRORS[name].__new__(_ERRORS[name])
        Exception.__init__(error, message)
        for key, value in fields.items():
            setattr(error, key, value)
        raise error
    name, message = reply[1], reply[2]
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        raise builtin(message)
    raise RuntimeError(f"the runtime process raised {name}: {message}")
