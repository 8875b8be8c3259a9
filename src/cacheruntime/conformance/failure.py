"""What the suite reports when a runtime breaks the contract, named by catalogue id.

A failure carries the ids it is evidence for (`H1`, `R4`, `D1`, ... from
`spec/invariants.md`, or `contract:<operation>` for a result that differs from the
model's without a more specific id), so an expected-failures file can name it and the
mutant kill table can say what caught each mutant.
"""

from __future__ import annotations

from cacheruntime.protocol import (
    AlreadyExecuted,
    CacheRuntimeError,
    ForeignRuntime,
    NotPrepared,
    OutOfOrder,
    OutOfSlots,
    StaleHandle,
    UnknownHandle,
)


class ConformanceFailure(AssertionError):
    """The runtime under test disagreed with the reference model or broke an invariant."""

    def __init__(self, ids: tuple[str, ...], message: str):
        self.ids = tuple(ids)
        super().__init__(f"[{', '.join(self.ids)}] {message}")


def ids_for_error_mismatch(operation: str, expected: CacheRuntimeError | None) -> tuple[str, ...]:
    """The ids a wrong outcome is evidence for, from the error the model raised.

    Accepting a stale, foreign or unknown handle is H1; executing a batch that is
    executed, cancelled or out of order is O4; opening a request with every slot live
    hands out a second handle to a live row (H3); anything else is a contract mismatch
    of the operation.
    """
    if isinstance(expected, (StaleHandle, ForeignRuntime, UnknownHandle)):
        return ("H1",)
    if operation == "execute_batch" and isinstance(expected, (AlreadyExecuted, NotPrepared, OutOfOrder)):
        return ("O4",)
    if operation == "open_request" and isinstance(expected, OutOfSlots):
        return ("H3",)
    return (f"contract:{operation}",)
