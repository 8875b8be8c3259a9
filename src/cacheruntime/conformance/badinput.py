"""Bad input: every operation that takes arguments, called with ill-typed and out-of-range ones.

The contract (spec/protocol.md §3) says a call either does what it says or raises a
`CacheRuntimeError` and changes nothing, whatever it is given. This checker holds any
runtime to that: for each example it makes a fresh runtime with the `factory`, brings it to
a state with a live request, a computed row, a published extent, an executed and a prepared
batch (and, with L2, a completed backup), takes the valid arguments of one operation over
those, corrupts one or more of them (a field of a handle, an element of a tuple, the whole
value: a float for an int, a string slot id, `None` for a tuple, a bool, a negative count,
a token id outside `RuntimeInfo.vocab_size`, another class), calls the operation and judges:

- **untyped**: the call raised something other than a `CacheRuntimeError`;
- **changed**: the call raised a `CacheRuntimeError` but `probe()` differs from before it
  (only for runtimes that claim INTROSPECTION).

A corrupted call that succeeds is counted as accepted (some corruptions are still legal
values, e.g. a list where a tuple is declared). Every violation is reported with the call
that caused it; `run` never stops at the first. Operations without arguments (`info`,
`open_request`, `poll_completions`, `wait_completions`, `restart`) have no argument to
corrupt and are left out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from cacheruntime.protocol import (
    Backup,
    BatchItem,
    BatchPlan,
    CacheRuntimeError,
    Capability,
    Close,
    Demote,
    Publish,
    Release,
    RuntimeInterface,
    TransferKind,
)

#: Operations that take arguments, in protocol order.
OPERATIONS = ("close_request", "prepare_batch", "execute_batch", "cancel_batch", "publish", "split", "retain", "release", "submit")


class _Opaque:
    """An object of no protocol class, for a value of the wrong class."""

    def __repr__(self) -> str:
        return "<opaque>"


#: Values no protocol field may hold as an int: other types, and ints out of every range.
BAD_INTS: tuple[object, ...] = (None, 1.5, 0.0, -0.0, math.nan, math.inf, "0", "1", True, False, b"1", (0,), [1], -1, -(2**63), 2**64)
BAD_STRS: tuple[object, ...] = (None, 0, b"local", ("local",), True)
BAD_BOOLS: tuple[object, ...] = (None, 0, 1, "True", 1.0)
BAD_SEQUENCES: tuple[object, ...] = (None, "ab", 0, 1.5, frozenset(), {0: 0}, b"")
BAD_OBJECTS: tuple[object, ...] = (None, 0, "x", 2.5, _Opaque(), (), frozenset())


@attrs.frozen
class Violation:
    """One call that broke the contract: what kind, the call, and what happened."""

    kind: str  # "untyped" or "changed"
    call: str
    outcome: str


@attrs.define
class Report:
    """What `run` saw: examples made, errors raised by class, accepted calls, violations."""

    runtime: str
    examples: int = 0
    raised: Counter[str] = attrs.field(factory=Counter)
    accepted: int = 0
    accepted_calls: list[str] = attrs.field(factory=list)  # the first few, to read
    violations: list[Violation] = attrs.field(factory=list)

    @property
    def untyped(self) -> int:
        return sum(v.kind == "untyped" for v in self.violations)

    @property
    def changed(self) -> int:
        return sum(v.kind == "changed" for v in self.violations)

    def summary(self) -> str:
        errors = ", ".join(f"{name} {count}" for name, count in self.raised.most_common())
        return (
            f"{self.runtime}: {self.examples} bad calls; {self.untyped} untyped errors, {self.changed} state changes on error, "
            f"{self.accepted} accepted; raised: {errors}"
        )


def valid_arguments(runtime: RuntimeInterface) -> dict[str, tuple[Any, ...]]:
    """Bring a fresh runtime to a state with a value of every kind; each operation's valid arguments.

    Request `h` holds 2 computed pages, published as extent `x` (backed up, with L2); a
    fresh request `f` has an empty row; request `p` is in prepared batch `b`; `e` is an
    executed batch. Nothing is in flight afterwards (a probe is then stable).
    """
    info = runtime.info()
    ps, tiers = info.page_size, Capability.L2 in info.capabilities
    h, f, p = runtime.open_request(), runtime.open_request(), runtime.open_request()
    executed = runtime.prepare_batch(BatchPlan((BatchItem(h, tuple(i % info.vocab_size for i in range(2 * ps))),)))
    runtime.execute_batch(executed)
    x = runtime.publish(h, 0, 2)
    if tiers:
        runtime.submit((Backup(x),))
    prepared = runtime.prepare_batch(BatchPlan((BatchItem(p, (1 % info.vocab_size,)),)))
    runtime.wait_completions()
    plan = BatchPlan(
        (BatchItem(f, (0, 1 % info.vocab_size), (x,)), BatchItem(h, (1 % info.vocab_size,), (), False)),
        (Publish(h, 0, 1), Release(x), Close(f)),
    )
    return {
        "close_request": (f,),
        "prepare_batch": (plan,),
        "execute_batch": (prepared,),
        "cancel_batch": (prepared,),
        "publish": (h, 0, 1),
        "split": (x, 1),
        "retain": (x,),
        "release": (x,),
        "submit": ((Backup(x), Demote(x)) if tiers else (Release(x),),),
    }


def corrupt(data: st.DataObject, value: Any, depth: int = 0) -> Any:
    """A corrupted `value`: the whole value replaced by a bad one, or (for a protocol value or a
    tuple) one of its parts corrupted in turn."""
    if isinstance(value, bool):
        return data.draw(st.sampled_from(BAD_BOOLS))
    if isinstance(value, int):
        return data.draw(st.sampled_from(BAD_INTS))
    if isinstance(value, str):
        return data.draw(st.sampled_from(BAD_STRS))
    if isinstance(value, tuple) and not attrs.has(type(value)):
        how = data.draw(st.sampled_from(("whole", "element", "extra") if value else ("whole", "extra")))
        if how == "whole":
            return data.draw(st.sampled_from(BAD_SEQUENCES))
        if how == "extra":
            return (*value, data.draw(st.sampled_from(BAD_OBJECTS)))
        index = data.draw(st.integers(0, len(value) - 1))
        return (*value[:index], corrupt(data, value[index], depth + 1), *value[index + 1 :])
    if attrs.has(type(value)):
        fields = [field.name for field in attrs.fields(type(value)) if not isinstance(getattr(value, field.name), TransferKind)]
        if depth > 0 and data.draw(st.booleans()):
            return data.draw(st.sampled_from(BAD_OBJECTS))
        name = data.draw(st.sampled_from(fields))
        return attrs.evolve(value, **{name: corrupt(data, getattr(value, name), depth + 1)})
    return data.draw(st.sampled_from(BAD_OBJECTS))


def judge(runtime: RuntimeInterface, operation: str, arguments: tuple[Any, ...], report: Report) -> None:
    """Make the call; count its outcome; record a violation if it raised untyped or changed state on error."""
    introspect = Capability.INTROSPECTION in runtime.info().capabilities
    before = runtime.probe() if introspect else None  # type: ignore[attr-defined]
    call = f"{operation}{arguments!r}"
    try:
        getattr(runtime, operation)(*arguments)
    except CacheRuntimeError as error:
        report.raised[type(error).__name__] += 1
        if introspect and runtime.probe() != before:  # type: ignore[attr-defined]
            report.violations.append(Violation("changed", call, f"{type(error).__name__}: {error}"))
    except Exception as error:  # an untyped error is exactly what is judged
        report.raised[type(error).__name__] += 1
        report.violations.append(Violation("untyped", call, f"{type(error).__name__}: {error}"))
    else:
        report.accepted += 1
        if len(report.accepted_calls) < 20:
            report.accepted_calls.append(call)


def run(factory: Callable[[], RuntimeInterface], examples: int, seed_value: int = 0, name: str = "") -> Report:
    """Fuzz `examples` bad calls on fresh runtimes from `factory`, with Hypothesis seeded by `seed_value`."""
    report = Report(name or getattr(factory, "__name__", repr(factory)))

    @seed(seed_value)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        runtime = factory()
        try:
            valid = valid_arguments(runtime)
            operation = data.draw(st.sampled_from(OPERATIONS), label="operation")
            arguments = list(valid[operation])
            positions = data.draw(st.sets(st.integers(0, len(arguments) - 1), min_size=1), label="corrupted")
            for index in sorted(positions):
                arguments[index] = corrupt(data, arguments[index])
            report.examples += 1
            judge(runtime, operation, tuple(arguments), report)
        finally:
            if hasattr(runtime, "close"):
                runtime.close()

    one()
    return report
