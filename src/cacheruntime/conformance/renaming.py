"""The renaming: the runtime's own names and ids, matched one to one with the model's as they are issued.

spec/protocol.md §2.1 leaves to the runtime how it numbers page names, extent
generations, batch ids and transfer ids: the contract fixes only their relations (which
ref is stale, which pages an extent covers, which ticket completed). Two legal runtimes
given the same calls may therefore return different numbers, and the suite never compares
such a value by equality. Instead it learns, per kind and per epoch, a bijection between
the runtime's values and the model's, from the values both issue for the same call: the
first time a runtime value is seen it is bound to the model's value in the same place,
and from then on it must stand for that value and no other (same runtime value, same
model value; distinct values stay distinct). A value that breaks the bijection is a
problem the caller reports as a violation, never an exception.

Arguments travel the other way: the machine sends the runtime the values the runtime
issued, and the model gets their images. A runtime value the bijection has never seen
(a forged handle) gets a *phantom* image, a value the model never issues, so the model
answers as for a handle it never issued.

Physical pages are renamed too, but only within one probe (`projection`): a physical
page's identity lasts only while it is in use, and two runtimes may legally reuse their
free pages in different orders.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from cacheruntime import pageruns, protocol
from cacheruntime.protocol import CacheExtentRef, PageRun, PreparedBatchHandle, TransferTicket

#: The first phantom value: above anything the model issues in a conformance run.
PHANTOM = 10**9
#: The phantom page a ref's runs carry to the model when they are not the coalesced runs of
#: their names (never issued, see `_model_runs`): one fixed value above every other phantom,
#: so that the suite's coverage can tell a real extent's pages cut into other runs.
UNCOALESCED = 2 * PHANTOM


class Kind(enum.Enum):
    """The kinds of value the runtime numbers as it likes; each kind has its own bijection per epoch."""

    PAGE = "page name"
    EXTENT = "extent generation"
    BATCH = "batch id"
    TRANSFER = "transfer id"


@attrs.frozen
class Unmatched:
    """A runtime value the renaming cannot account for: it equals no model value, so a comparison shows it."""

    what: str
    value: int

    def __repr__(self) -> str:
        return f"<runtime {self.what} {self.value}, matched to nothing>"


class Bijection:
    """One kind's runtime-to-model correspondence (within one epoch, or within one probe for physical pages)."""

    def __init__(self, what: str):
        self.what = what
        self.forward: dict[int, int] = {}
        self.backward: dict[int, int] = {}

    def conflict(self, runtime: int, model: int) -> str | None:
        """Why `runtime` cannot stand for `model`, or None when it can (already does, or both are free)."""
        mine, theirs = self.forward.get(runtime), self.backward.get(model)
        if mine == model or (mine is None and theirs is None):
            return None
        if mine is not None:
            return f"runtime {self.what} {runtime} stood for model {self.what} {mine}, here for {model}"
        return f"runtime {self.what}s {theirs} and {runtime} both stand for model {self.what} {model}"

    def bind(self, runtime: int, model: int) -> str | None:
        """Make `runtime` stand for `model` unless that breaks the bijection; the conflict, if any."""
        problem = self.conflict(runtime, model)
        if problem is None:
            self.forward[runtime] = model
            self.backward[model] = runtime
        return problem

    def image(self, runtime: int) -> int | Unmatched:
        """The model value `runtime` stands for, or an `Unmatched` that equals nothing."""
        bound = self.forward.get(runtime)
        return Unmatched(self.what, runtime) if bound is None else bound


#: A problem found while matching two values: where (a path like `value.published[0].generation`) and what.
Problem = tuple[str, str]


class Renaming:
    """The bijections of one conformance case, per kind and epoch, and the translation of whole values."""

    def __init__(self) -> None:
        self._maps: dict[tuple[Kind, int], Bijection] = {}
        self._phantoms: dict[tuple[Kind, int, int], int] = {}

    def bijection(self, kind: Kind, epoch: int) -> Bijection:
        """The bijection of `kind` in `epoch` (empty until values are bound)."""
        key = (kind, epoch)
        if key not in self._maps:
            self._maps[key] = Bijection(kind.value)
        return self._maps[key]

    # -- runtime values to the model --------------------------------------------------

    def to_model(self, kind: Kind, epoch: int, value: int) -> int:
        """The model value `value` stands for; a phantom (never issued by the model) if it stands for none yet."""
        bound = self.bijection(kind, epoch).forward.get(value)
        if bound is not None:
            return bound
        return self._phantoms.setdefault((kind, epoch, value), PHANTOM + len(self._phantoms))

    def model_args(self, value: Any) -> Any:
        """`value` (an argument the runtime gets) with every runtime-numbered field replaced by its model image."""
        if isinstance(value, tuple):
            return tuple(self.model_args(v) for v in value)
        if isinstance(value, CacheExtentRef):
            return attrs.evolve(
                value,
                generation=self.to_model(Kind.EXTENT, value.epoch, value.generation),
                page_runs=self._model_runs(value.epoch, value.page_runs),
            )
        if isinstance(value, PreparedBatchHandle):
            return attrs.evolve(value, batch_id=self.to_model(Kind.BATCH, value.epoch, value.batch_id))
        if isinstance(value, TransferTicket):
            return attrs.evolve(
                value,
                transfer_id=self.to_model(Kind.TRANSFER, value.epoch, value.transfer_id),
                extent_generation=self.to_model(Kind.EXTENT, value.epoch, value.extent_generation),
            )
        if _is_protocol_record(value):
            return attrs.evolve(value, **{f.name: self.model_args(getattr(value, f.name)) for f in attrs.fields(type(value))})
        return value

    def _model_runs(self, epoch: int, runs: tuple[PageRun, ...]) -> tuple[PageRun, ...]:
        """The model's runs for the runtime's: its names renamed and coalesced.

        A runtime issues only the coalesced runs of its names (§4.7), so runs that are not
        coalesced were never issued: the model gets runs it never issued either (a phantom
        page added), and both must answer UnknownHandle (or StaleHandle, checked first).
        """
        names = pageruns.expand(runs)
        renamed = pageruns.coalesce(self.to_model(Kind.PAGE, epoch, name) for name in names)
        if tuple(runs) != pageruns.coalesce(names):
            renamed += (PageRun(UNCOALESCED, 1),)
        return renamed

    # -- model values to the runtime --------------------------------------------------

    def to_runtime(self, kind: Kind, epoch: int, value: int) -> int:
        """The runtime value standing for model `value` (the value itself if none does: the runtime judges it)."""
        return self.bijection(kind, epoch).backward.get(value, value)

    def runtime_ref(self, ref: CacheExtentRef) -> CacheExtentRef:
        """The ref the runtime issued for the model's `ref`: its generation and page names, coalesced anew."""
        names = [self.to_runtime(Kind.PAGE, ref.epoch, name) for name in pageruns.expand(ref.page_runs)]
        return attrs.evolve(ref, generation=self.to_runtime(Kind.EXTENT, ref.epoch, ref.generation), page_runs=pageruns.coalesce(names))

    # -- returned values ----------------------------------------------------------------

    def match(self, actual: Any, expected: Any, path: str = "value") -> list[Problem]:
        """Compare what the runtime returned with what the model returned, up to renaming.

        Runtime-numbered fields are bound as they are met (every consistent pair is kept,
        so a mismatch elsewhere in the value does not hide the rest); every other field
        must be equal. Returns the problems, empty when the values match.
        """
        problems: list[Problem] = []
        try:
            self._match(actual, expected, path, problems)
        except Exception as error:  # a value of no protocol shape (B2 names it): a problem, not a crash
            problems.append((path, f"cannot be compared with the model's {expected!r}: {type(error).__name__}: {error}"))
        return problems

    def _match(self, actual: Any, expected: Any, path: str, problems: list[Problem]) -> None:
        if type(actual) is not type(expected):
            problems.append((path, f"runtime {actual!r}, model {expected!r}"))
        elif isinstance(actual, tuple):
            if len(actual) != len(expected):
                problems.append((path, f"runtime has {len(actual)} values {actual!r}, model {len(expected)} {expected!r}"))
            for i, (a, e) in enumerate(zip(actual, expected)):
                self._match(a, e, f"{path}[{i}]", problems)
        elif isinstance(actual, (CacheExtentRef, PreparedBatchHandle, TransferTicket)):
            self._match_numbered(actual, expected, path, problems)
        elif _is_protocol_record(actual):
            for f in attrs.fields(type(actual)):
                self._match(getattr(actual, f.name), getattr(expected, f.name), f"{path}.{f.name}", problems)
        elif actual != expected:
            problems.append((path, f"runtime {actual!r}, model {expected!r}"))

    def _match_numbered(self, actual: Any, expected: Any, path: str, problems: list[Problem]) -> None:
        """A handle, ref or ticket: fixed fields equal, numbered fields bound."""
        numbered = {
            CacheExtentRef: {"generation": Kind.EXTENT, "page_runs": Kind.PAGE},
            PreparedBatchHandle: {"batch_id": Kind.BATCH},
            TransferTicket: {"transfer_id": Kind.TRANSFER, "extent_generation": Kind.EXTENT},
        }[type(actual)]
        for f in attrs.fields(type(actual)):
            if f.name not in numbered:
                self._match(getattr(actual, f.name), getattr(expected, f.name), f"{path}.{f.name}", problems)
        if actual.epoch != expected.epoch:
            return  # reported above; nothing to bind across epochs
        for name, kind in numbered.items():
            where = f"{path}.{name}"
            if kind is Kind.PAGE:
                self._match_runs(actual.epoch, actual.page_runs, expected.page_runs, where, problems)
                continue
            problem = self.bijection(kind, actual.epoch).bind(getattr(actual, name), getattr(expected, name))
            if problem:
                problems.append((where, problem))

    def _match_runs(self, epoch: int, actual: tuple[PageRun, ...], expected: tuple[PageRun, ...], path: str, problems: list[Problem]) -> None:
        """Page runs: the runtime's are the coalesced runs of its names, and the names match the model's one by one."""
        names, theirs = pageruns.expand(actual), pageruns.expand(expected)
        if tuple(actual) != pageruns.coalesce(names):
            problems.append((path, f"runs {actual!r} are not the coalesced runs of their page names {list(names)}"))
        if len(names) != len(theirs):
            problems.append((path, f"runtime names {len(names)} pages {list(names)}, model {len(theirs)} {list(theirs)}"))
        pages = self.bijection(Kind.PAGE, epoch)
        for i, (mine, model) in enumerate(zip(names, theirs)):
            problem = pages.bind(mine, model)
            if problem:
                problems.append((f"{path} page {i}", problem))


def _is_protocol_record(value: Any) -> bool:
    return attrs.has(type(value)) and type(value).__module__ == protocol.__name__
