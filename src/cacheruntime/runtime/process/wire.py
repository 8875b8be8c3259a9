"""The process runtime's messages: protocol values to bytes and back, one message per boundary call.

A request is `(operation, args, kwargs)`, a reply `(OK, value)`, `(ERROR, [type name,
message, attributes])` for a typed error, or `(CRASH, exception type name, message)` for
an untyped one (a bug, or a test knob's `ValueError`).

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
from collections.abc import Callable
from typing import Any

import attrs

from cacheruntime import protocol
from cacheruntime.protocol import CacheRuntimeError

OK, ERROR, CRASH = 0, 1, 2

_ERRORS: dict[str, type[CacheRuntimeError]] = {c.__name__: c for c in vars(protocol).values() if isinstance(c, type) and issubclass(c, CacheRuntimeError)}


def keyword_record(cls: type, positional: tuple[Any, ...], keywords: dict[str, Any]) -> Any:
    """Rebuild a record that has keyword-only fields (`RuntimeInfo.vocab_size`)."""
    return cls(*positional, **keywords)


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


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH.update({cls: _reducer(cls) for cls in vars(protocol).values() if isinstance(cls, type) and attrs.has(cls)})


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
