"""What the suite reports when a runtime breaks the contract, named by catalogue id and signature.

A failure carries the ids it is evidence for (`H1`, `R4`, `D1`, ... from
`spec/invariants.md`, or `contract:<operation>` for a result that differs from the
model's without a more specific id), so the mutant kill table can say what caught each
mutant, and a `Signature`: the ids, the operation, and the kind of disagreement (which
error the runtime raised where the model raised which, or which part of the state
differed). The signature is what an expected-failures entry names and what a check sets
aside to keep looking for other violations: narrower than an operation, so a new bug
under the same id still fails, and independent of the call sequence that led there, so
one bug keeps one signature however a run reaches it.
"""

from __future__ import annotations

import attrs

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


@attrs.frozen
class Signature:
    """Which kind of violation: its ids, the operation it showed in, and how it differed.

    `kind` is one of a few shapes (see `RuntimeConformance`): `returns where the model
    raises X`, `raises X where the model returns`, `raises X where the model raises Y`,
    `crashes with T`, `returns another value`, `serves other tokens`, `probe differs in F`,
    `breaks R1` (an invariant of its probe), `changes state when it raises X`,
    `reports a completion too early`, `hands control a device object`.
    Its text, `ids operation: kind`, is what an expected-failures file names.
    """

    ids: tuple[str, ...]
    operation: str
    kind: str

    def __str__(self) -> str:
        return f"{','.join(self.ids)} {self.operation}: {self.kind}"


class ConformanceFailure(AssertionError):
    """The runtime under test disagreed with the reference model or broke an invariant."""

    def __init__(self, ids: tuple[str, ...], message: str, operation: str = "", kind: str = ""):
        self.ids = tuple(ids)
        self.signature = Signature(self.ids, operation or "?", kind or "disagrees with the model")
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
