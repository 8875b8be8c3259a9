"""The process runtime's messages: protocol values to bytes and back, one message per boundary call.

A request is `(operation, *args)`, a reply `(OK, value)`, `(ERROR, typed error)` or
`(CRASH, exception type name, message)` for an untyped exception (a bug, or a test knob's
`ValueError`). Serialization is pickle (protocol 5) of a *flat* form of the values: each
frozen attrs record of `cacheruntime.protocol` becomes a list `[class index, fields...]`
(lists mark records, so a list itself goes as `[-1, items...]`; tuples stay tuples; ints,
strings, enums and frozensets go as they are), rebuilt through the record's own constructor on the other side.

Why this and not the alternatives (measured by `benchmarks/diagnostics/wireformat.py`,
figures in docs/process-runtime.md): pickling the attrs records themselves runs attrs'
Python `__setstate__` per record, several times slower than the flat form; msgspec
(MessagePack) encodes attrs records but cannot decode the protocol's unions of records
(an `Intent`, a reply of any type) without a tag, so it needs a tagged walk too, and then
also turns every tuple into a list that must be walked back, which measured slower than
pickling the flat form. Pickle's trust model is the process runtime's anyway: both ends
are this package, on one host, over a socket in a private directory (`client.py`).

Typed errors cross as `[class name, message, attributes]` and are rebuilt without calling
their constructors (`OutOfPages` and `ComputeFailed` take other arguments than the
message), so the error control sees has the type, message and fields the runtime raised.
"""

from __future__ import annotations

import builtins
import operator
import pickle
from collections.abc import Callable
from typing import Any

import attrs

from cacheruntime import protocol
from cacheruntime.protocol import CacheRuntimeError

OK, ERROR, CRASH = 0, 1, 2
_LIST = -1  # the "class index" of a plain list

_RECORDS: list[type] = sorted((c for c in vars(protocol).values() if isinstance(c, type) and attrs.has(c)), key=lambda c: c.__name__)
_INDEX: dict[type, int] = {cls: i for i, cls in enumerate(_RECORDS)}
_ERRORS: dict[str, type[CacheRuntimeError]] = {c.__name__: c for c in vars(protocol).values() if isinstance(c, type) and issubclass(c, CacheRuntimeError)}
#: What a tuple may start with and still be plain data, passed through unwalked (token ids, pages).
_PLAIN = (int, str, float, bool, type(None))


def _getter(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """The record's field values in constructor order (positional fields, then keyword-only ones)."""
    names = [f.name for f in attrs.fields(cls) if not f.kw_only] + [f.name for f in attrs.fields(cls) if f.kw_only]
    if len(names) == 1:
        only = names[0]
        return lambda value: (getattr(value, only),)
    return operator.attrgetter(*names)


def _constructor(cls: type) -> Callable[..., Any]:
    """Calls the record's constructor with values in `_getter`'s order."""
    keywords = [f.name for f in attrs.fields(cls) if f.kw_only]
    if not keywords:
        return cls
    positional = len(attrs.fields(cls)) - len(keywords)
    return lambda *values: cls(*values[:positional], **dict(zip(keywords, values[positional:])))


_GETTERS = {cls: _getter(cls) for cls in _RECORDS}
_CONSTRUCTORS = [_constructor(cls) for cls in _RECORDS]


def flatten(value: Any) -> Any:
    """`value` with every protocol record replaced by `[class index, flattened fields...]`."""
    kind = type(value)
    getter = _GETTERS.get(kind)
    if getter is not None:
        return [_INDEX[kind], *[flatten(field) for field in getter(value)]]
    if kind is tuple and value and not isinstance(value[0], _PLAIN):
        return tuple(flatten(item) for item in value)
    if kind is list:
        return [_LIST, *[flatten(item) for item in value]]
    return value


def rebuild(value: Any) -> Any:
    """The inverse of `flatten`."""
    kind = type(value)
    if kind is list:
        if value[0] == _LIST:
            return [rebuild(item) for item in value[1:]]
        return _CONSTRUCTORS[value[0]](*[rebuild(field) for field in value[1:]])
    if kind is tuple and value and not isinstance(value[0], _PLAIN):
        return tuple(rebuild(item) for item in value)
    return value


def dumps(message: tuple[Any, ...]) -> bytes:
    """One message (a request `(operation, *args)` or a reply) as bytes: each element flattened, then pickled."""
    return pickle.dumps(tuple(flatten(part) for part in message), protocol=5)


def loads(data: bytes) -> tuple[Any, ...]:
    """The message `dumps` made of `data`."""
    return tuple(rebuild(part) for part in pickle.loads(data))


def error_reply(error: BaseException) -> tuple[Any, ...]:
    """The reply for an exception the runtime raised: typed errors in full, anything else by type and message."""
    if isinstance(error, CacheRuntimeError):  # as the nearest protocol type it is (a runtime's own subclass is one)
        typed = next(cls for cls in type(error).__mro__ if _ERRORS.get(cls.__name__) is cls)
        return (ERROR, [typed.__name__, str(error), {k: flatten(v) for k, v in vars(error).items()}])
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
            setattr(error, key, rebuild(value))
        raise error
    name, message = reply[1], reply[2]
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        raise builtin(message)
    raise RuntimeError(f"the runtime process raised {name}: {message}")
