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

A failure also carries what makes it readable without the suite's code: the boundary
calls the runtime was actually sent in the failing case (`calls`, printed by
`cacheruntime.recording`) and a field-level diff of the value that differed (`diff`:
only the differing fields, runtime against model, nested records and tuples followed).
"""

from __future__ import annotations

from typing import Any

import attrs

from cacheruntime import protocol
from cacheruntime.conformance.renaming import Kind, Renaming
from cacheruntime.protocol import (
    AlreadyExecuted,
    CacheExtentRef,
    CacheRuntimeError,
    ForeignRuntime,
    NotPrepared,
    OutOfOrder,
    OutOfPages,
    OutOfSlots,
    PreparedBatchHandle,
    StaleHandle,
    TransferTicket,
    UnknownHandle,
)
from cacheruntime.recording import Call, format_error


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
    """The runtime under test disagreed with the reference model or broke an invariant.

    `calls` are the boundary calls the runtime was sent in the failing case, one a line
    (`cacheruntime.recording.format_calls`), and `diff` the differing fields of the value
    that disagreed (`format_diff`); either is empty where there is none.
    """

    def __init__(self, ids: tuple[str, ...], message: str, operation: str = "", kind: str = "", calls: str = "", diff: str = ""):
        self.ids = tuple(ids)
        self.signature = Signature(self.ids, operation or "?", kind or "disagrees with the model")
        self.calls = calls
        self.diff = diff
        super().__init__(f"[{', '.join(self.ids)}] {message}")


def readable(calls: str, diff: str) -> str:
    """The calls sent and the differing fields, under the headers every report prints them with."""
    parts = []
    if calls:
        parts.append(f"# ---- boundary calls sent to the runtime, with what each returned or raised ----\n{calls}")
    if diff:
        parts.append(f"# ---- differing fields (runtime vs model) ----\n{diff}")
    return "\n\n".join(parts)


@attrs.frozen
class FieldDifference:
    """One field where the runtime's value differs from the model's: its path and both sides, printed."""

    path: str  # like `value.items[0].next_token` or `error.free`
    runtime: str
    model: str


def field_diff(runtime: Any, model: Any, path: str = "value") -> list[FieldDifference]:
    """The fields where `runtime` and `model` differ, following records, tuples and typed errors.

    Two protocol records of one type are compared field by field, two tuples of one length
    element by element, two errors of one type by what the contract fixes of them
    (`OutOfPages`: the tier and both counts); anything else that differs is one entry.
    """
    if isinstance(runtime, CacheRuntimeError) and isinstance(model, CacheRuntimeError) and type(runtime) is type(model):
        if isinstance(runtime, OutOfPages) and isinstance(model, OutOfPages):
            return [d for name in ("tier", "needed", "free") for d in field_diff(getattr(runtime, name), getattr(model, name), f"{path}.{name}")]
        return []
    if type(runtime) is not type(model):
        return [FieldDifference(path, _show(runtime), _show(model))]
    if isinstance(runtime, tuple) and len(runtime) == len(model):
        return [d for i, (mine, theirs) in enumerate(zip(runtime, model)) for d in field_diff(mine, theirs, f"{path}[{i}]")]
    if attrs.has(type(runtime)):
        return [d for f in attrs.fields(type(runtime)) for d in field_diff(getattr(runtime, f.name), getattr(model, f.name), f"{path}.{f.name}")]
    return [] if runtime == model else [FieldDifference(path, _show(runtime), _show(model))]


def outcome_diff(runtime: Call, model: Call) -> list[FieldDifference]:
    """How two calls' outcomes differ: both returned (the values' fields), both raised (the errors'), or one of each."""
    if runtime.error is not None and model.error is not None:
        return field_diff(runtime.error, model.error, "error")
    if runtime.error is None and model.error is None:
        return field_diff(runtime.value, model.value)
    return [FieldDifference("outcome", _outcome(runtime), _outcome(model))]


def format_diff(differences: list[FieldDifference]) -> str:
    """One differing field a line: `path: runtime X, model Y`."""
    return "\n".join(f"  {d.path}: runtime {d.runtime}, model {d.model}" for d in differences)


def in_runtime_names(renaming: Renaming, value: Any) -> Any:
    """A model value with every runtime-numbered field replaced by the runtime value that stands for it.

    So a model value can be diffed against the runtime's field by field: a value the
    runtime numbered as it may (spec/protocol.md §2.1) differs only where the renaming
    does not account for it. A model value nothing stands for yet is left as it is.
    """
    if isinstance(value, tuple):
        return tuple(in_runtime_names(renaming, v) for v in value)
    if isinstance(value, CacheExtentRef):
        return renaming.runtime_ref(value)
    if isinstance(value, PreparedBatchHandle):
        return attrs.evolve(value, batch_id=renaming.to_runtime(Kind.BATCH, value.epoch, value.batch_id))
    if isinstance(value, TransferTicket):
        return attrs.evolve(
            value,
            transfer_id=renaming.to_runtime(Kind.TRANSFER, value.epoch, value.transfer_id),
            extent_generation=renaming.to_runtime(Kind.EXTENT, value.epoch, value.extent_generation),
        )
    if attrs.has(type(value)) and type(value).__module__ == protocol.__name__:
        return attrs.evolve(value, **{f.name: in_runtime_names(renaming, getattr(value, f.name)) for f in attrs.fields(type(value))})
    return value


def _show(value: Any) -> str:
    return format_error(value) if isinstance(value, BaseException) else repr(value)


def _outcome(call: Call) -> str:
    return f"raises {format_error(call.error)}" if call.error is not None else f"returns {call.value!r}"


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
