"""The two memories: the device pool (L1) and the host pool (L2), as plain Python lists.

A physical page holds one version tag per token position: the stand-in for the KV
bytes that a real engine keeps in device and pinned host memory. Compute writes tags on
the caller's thread and reads them back for `next_token` (`compute.py`); the copy
streams move whole pages between the tiers (`copier.py`). Nothing in the ledger points
into memory except by physical page number, and nothing clears memory: a page reused
holds whatever it held before until compute or a copy overwrites it, as real memory does.
"""

from __future__ import annotations

from cacheruntime.protocol import Tier


class Memory:
    """Per tier, per physical page, the tags at each token position (0 where nothing was ever written)."""

    def __init__(self, page_size: int, l1_pages: int, l2_pages: int):
        self._pages = {tier: [[0] * page_size for _ in range(total)] for tier, total in ((Tier.L1, l1_pages), (Tier.L2, l2_pages))}

    def read(self, tier: Tier, phys: int) -> tuple[int, ...]:
        """The tags one physical page holds now."""
        return tuple(self._pages[tier][phys])

    def write(self, tier: Tier, phys: int, position: int, tag: int) -> None:
        """Compute writes one token's tag."""
        self._pages[tier][phys][position] = tag

    def copy(self, source: Tier, src: int, destination: Tier, dst: int) -> None:
        """A copy stream moves one whole page, position by position (a reader may see it half done)."""
        into, out_of = self._pages[destination][dst], self._pages[source][src]
        for position, tag in enumerate(out_of):
            into[position] = tag
