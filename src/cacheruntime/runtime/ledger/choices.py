"""What the contract leaves to the runtime: numbering, placement, and when completions are reported.

These are the seams where two legal runtimes may differ (spec/protocol.md, "fixed and
free values"): the numbers of page names and of extent, batch and transfer ids, which
free physical page a new copy takes, and how late a completed transfer is reported. Each
is a constructor option of `LocalGPURuntime`; the defaults are the reference model's
choices, and a conformance suite that compares up to renaming must pass every other.
"""

from __future__ import annotations

import enum
import functools
import random
from collections import deque
from collections.abc import Callable

import attrs


@attrs.frozen
class Numbering:
    """How an epoch numbers its page names and its extent, batch and transfer ids.

    Each sequence starts at its `first_*` value and grows by `stride`; the defaults are
    the model's (extents from 1, everything else from 0).
    """

    first_page: int = 0
    first_extent: int = 1
    first_batch: int = 0
    first_transfer: int = 0
    stride: int = 1

    def __attrs_post_init__(self) -> None:
        if self.stride < 1 or min(self.first_page, self.first_extent, self.first_batch, self.first_transfer) < 0:
            raise ValueError("numbering: first values must be >= 0 and the stride >= 1")

    def issued_batch(self, batch_id: int, next_batch: int) -> bool:
        """Whether this epoch has prepared batch `batch_id` (forgotten once older than the finished window)."""
        return self.first_batch <= batch_id < next_batch and (batch_id - self.first_batch) % self.stride == 0

    def issued_extent(self, generation: int, next_extent: int) -> bool:
        """Whether this epoch has issued extent `generation` (it is stale once released or split)."""
        return self.first_extent <= generation < next_extent and (generation - self.first_extent) % self.stride == 0


#: The reference model's numbering, every runtime's default.
MODEL_NUMBERING = Numbering()


class FreeOrder(enum.Enum):
    """Which free physical page the allocator takes: the oldest free (the model's), the newest, or any."""

    FIFO = "fifo"
    LIFO = "lifo"
    RANDOM = "random"


class Allocator:
    """Takes physical pages off a free list in a `FreeOrder`, and says how to put them back exactly.

    Frees always go to the back of the list; only where pages are taken from differs.
    """

    def __init__(self, order: FreeOrder, seed: int = 0):
        self.order = order
        self._rng = random.Random(seed)

    def take(self, free: deque[int], count: int) -> tuple[list[int], Callable[[], object]]:
        """`count` pages off `free` (the caller checked there are enough), in the order taken,
        and the step that puts them back where they were (for a call's journal)."""
        if self.order is FreeOrder.FIFO:
            taken = [free.popleft() for _ in range(count)]
            return taken, functools.partial(free.extendleft, taken[::-1])
        if self.order is FreeOrder.LIFO:
            taken = [free.pop() for _ in range(count)]
            return taken, functools.partial(free.extend, taken[::-1])
        positions = []
        for _ in range(count):
            index = self._rng.randrange(len(free))
            positions.append((index, free[index]))
            del free[index]
        return [page for _, page in positions], functools.partial(_put_back, free, positions)


def _put_back(free: deque[int], positions: list[tuple[int, int]]) -> None:
    """Undo a random take: each page back at the index it was taken from, last taken first."""
    for index, page in reversed(positions):
        free.insert(index, page)


class Reporting(enum.Enum):
    """When a completed transfer is reported (its effects take place by the rules either way).

    - EAGER: by the first poll or wait after it completes (the model's choice);
    - NEXT_POLL: one poll later than EAGER (a wait reports everything);
    - AT_WAIT: only by `wait_completions`.
    """

    EAGER = "eager"
    NEXT_POLL = "next_poll"
    AT_WAIT = "at_wait"
