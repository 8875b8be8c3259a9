"""A small operations namespace, so that one policy function runs on values and on Z3 terms.

Control-side policy (locks, evictability, victim selection; `cacheruntime.control.policy`)
and the page-run algebra (`cacheruntime.pageruns`) are written once against an `Ops`
object: `CONCRETE` evaluates them on Python values (what TreeCore and the model run),
`cacheruntime.z3check.z3ops.Z3OPS` builds Z3 terms from the very same code (what the proofs
check). Policy code uses only these operations, never Python `and`/`or`/`if` on values
that may be symbolic; Python control flow is allowed on shapes (lengths, positions) only.

Three operations exist for speed, not expressiveness: `Get`/`Scatter` index a sequence
with a value that may be symbolic (O(1) here, an If-chain over the positions in Z3),
`ArgMin` picks the least key in C-speed `min` here and by a fold in Z3, and `IsFalse` lets
a loop stop early once its remaining rounds certainly do nothing (never, for a symbolic
condition). The faithfulness tests in `tests/z3/` check that both implementations agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableSequence, Sequence
from typing import Any


class ConcreteOps:
    """The operations on plain Python bools and ints."""

    @staticmethod
    def And(*terms: Any) -> bool:
        return all(terms)

    @staticmethod
    def Or(*terms: Any) -> bool:
        return any(terms)

    @staticmethod
    def Not(term: Any) -> bool:
        return not term

    @staticmethod
    def If(condition: Any, then: Any, otherwise: Any) -> Any:
        return then if condition else otherwise

    @staticmethod
    def Sum(terms: Iterable[Any]) -> int:
        return sum(terms)

    @staticmethod
    def BoolVal(value: bool) -> bool:
        return bool(value)

    @staticmethod
    def IntVal(value: int) -> int:
        return int(value)

    @staticmethod
    def Get(values: Sequence[Any], index: Any) -> Any:
        """`values[index]`."""
        return values[index]

    @staticmethod
    def Scatter(values: MutableSequence[Any], index: Any, update: Callable[[int, Any], Any]) -> None:
        """`values[index] = update(index, values[index])`, in place."""
        values[index] = update(index, values[index])

    @staticmethod
    def ArgMin(mask: Sequence[Any], keys: Sequence[Any]) -> tuple[Any, Any]:
        """(whether any position is masked in, the masked position of least key, lowest first on ties).

        The position is 0 when the mask is empty.
        """
        best = min(((key, i) for i, (m, key) in enumerate(zip(mask, keys, strict=True)) if m), default=None)
        return (False, 0) if best is None else (True, best[1])

    @staticmethod
    def IsFalse(term: Any) -> bool:
        """Whether `term` is certainly false."""
        return not term


CONCRETE = ConcreteOps()
