"""Argument checks shared by every store and the worker, run before any I/O.

Keys are content keys that control supplies (SGLang's HiCache keys a page by a hash of
the token prefix up to it, as hex): one key names the same bytes in every runtime that
shares the store. They are checked to be usable unchanged by every backend: as a file name
in the file store (no separators, no leading dot, which the file store keeps for its
temporary files) and as a Mooncake object key.

Buffers are anything with the buffer protocol (a `memoryview`, a `bytearray`, the numpy
view of a pinned torch page); they are taken as flat byte views, without a copy, so data
moves between the store and the caller's page directly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cacheruntime.storage.errors import InvalidStoreArgument

#: the longest key accepted (a sha256 in hex is 64; room for SGLang's suffixes)
MAX_KEY_LENGTH = 200
_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def check_keys(keys: Sequence[str]) -> tuple[str, ...]:
    """The keys as a tuple, or `InvalidStoreArgument` naming the first bad one and the rule."""
    if isinstance(keys, str | bytes):
        raise InvalidStoreArgument("keys must be a sequence of str, not one str or bytes; wrap a single key in a list")
    checked = tuple(keys)
    for key in checked:
        if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or _KEY.fullmatch(key) is None:
            raise InvalidStoreArgument(
                f"bad store key {key!r}: a key is a str of 1 to {MAX_KEY_LENGTH} characters from [A-Za-z0-9_.-], not starting with '.' (a hex hash is one)"
            )
    if len(set(checked)) != len(checked):
        raise InvalidStoreArgument("a batch names a key twice; give each key once")
    return checked


def byte_views(keys: Sequence[str], buffers: Sequence[Any], *, writable: bool) -> tuple[memoryview, ...]:
    """One flat byte view per key, without copying; `InvalidStoreArgument` if a buffer cannot serve."""
    if len(buffers) != len(keys):
        raise InvalidStoreArgument(f"{len(keys)} keys but {len(buffers)} buffers; give one buffer per key")
    views = []
    for key, buffer in zip(keys, buffers):
        try:
            view = memoryview(buffer)
        except TypeError:
            raise InvalidStoreArgument(f"the buffer for key {key!r} is a {type(buffer).__name__}, which has no buffer protocol; pass a memoryview") from None
        if not view.c_contiguous:
            raise InvalidStoreArgument(f"the buffer for key {key!r} is not contiguous; pass a contiguous page")
        if writable and view.readonly:
            raise InvalidStoreArgument(f"the buffer for key {key!r} is read-only; a get needs a writable buffer")
        if view.nbytes == 0:
            raise InvalidStoreArgument(f"the buffer for key {key!r} is empty; a page object has at least one byte")
        views.append(view.cast("B") if view.format != "B" or view.ndim != 1 else view)
    return tuple(views)


def lendable(view: memoryview) -> memoryview:
    """The view itself, or a writable copy of a read-only one: a backend that takes a buffer by
    address (Mooncake) or as a tensor (SGLang's) needs a writable one even to read from it."""
    return view if not view.readonly else memoryview(bytearray(view))
