"""Content keys of a token prefix's pages: the names control gives L3 objects (spec/protocol.md §9.2).

A page's key is the sha256 (hex) of the previous page's key and the page's token ids, so it
names the whole prefix up to and including the page, as SGLang's HiCache keys pages: two
runtimes, or two runs, that computed the same prefix name the same bytes the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def page_keys(tokens: Sequence[int], page_size: int) -> tuple[str, ...]:
    """One key per whole page of `tokens`, in order (a partial last page has none)."""
    keys: list[str] = []
    previous = b""
    for start in range(0, len(tokens) - page_size + 1, page_size):
        digest = hashlib.sha256(previous)
        digest.update(b",".join(str(t).encode() for t in tokens[start : start + page_size]))
        previous = digest.hexdigest().encode()
        keys.append(previous.decode())
    return tuple(keys)
