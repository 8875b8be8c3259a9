"""The `cacheruntime.ops` namespace on Z3 terms: the same policy code, read as a formula.

Python bools and ints stay Python values as long as they can (`If(True, a, b)` is `a`),
so that the parts of a formula fixed by the shape of the input (node 0 is the root, a
position is or is not the one indexed) fold away before Z3 sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableSequence, Sequence
from typing import Any

import z3


def _is_const(term: Any) -> bool:
    return isinstance(term, (bool, int))


class Z3Ops:
    """Builds Z3 terms; indexing with a symbolic position becomes an If-chain over positions."""

    @staticmethod
    def And(*terms: Any) -> Any:
        if any(t is False for t in terms):
            return False
        rest = [t for t in terms if t is not True]
        return True if not rest else rest[0] if len(rest) == 1 else z3.And(*rest)

    @staticmethod
    def Or(*terms: Any) -> Any:
        if any(t is True for t in terms):
            return True
        rest = [t for t in terms if t is not False]
        return False if not rest else rest[0] if len(rest) == 1 else z3.Or(*rest)

    @staticmethod
    def Not(term: Any) -> Any:
        return (not term) if isinstance(term, bool) else z3.Not(term)

    @staticmethod
    def If(condition: Any, then: Any, otherwise: Any) -> Any:
        if isinstance(condition, bool):
            return then if condition else otherwise
        if _is_const(then) and _is_const(otherwise) and then == otherwise and type(then) is type(otherwise):
            return then
        return z3.If(condition, then, otherwise)

    @staticmethod
    def Sum(terms: Iterable[Any]) -> Any:
        terms = list(terms)
        constant = sum(t for t in terms if _is_const(t))
        symbolic = [t for t in terms if not _is_const(t)]
        return z3.Sum(symbolic) + constant if symbolic else constant

    @staticmethod
    def BoolVal(value: bool) -> bool:
        return bool(value)

    @staticmethod
    def IntVal(value: int) -> int:
        return int(value)

    @staticmethod
    def Get(values: Sequence[Any], index: Any) -> Any:
        if isinstance(index, int):
            return values[index]
        result = values[0]
        for k in range(1, len(values)):
            result = Z3Ops.If(index == k, values[k], result)
        return result

    @staticmethod
    def Scatter(values: MutableSequence[Any], index: Any, update: Callable[[int, Any], Any]) -> None:
        if isinstance(index, int):
            values[index] = update(index, values[index])
            return
        for k in range(len(values)):
            values[k] = Z3Ops.If(index == k, update(k, values[k]), values[k])

    @staticmethod
    def ArgMin(mask: Sequence[Any], keys: Sequence[Any]) -> tuple[Any, Any]:
        found: Any = False
        best_key: Any = 0
        best: Any = 0
        for i, (m, key) in enumerate(zip(mask, keys, strict=True)):
            take = Z3Ops.And(m, Z3Ops.Or(Z3Ops.Not(found), key < best_key))
            best = Z3Ops.If(take, i, best)
            best_key = Z3Ops.If(take, key, best_key)
            found = Z3Ops.Or(found, m)
        return found, best

    @staticmethod
    def IsFalse(term: Any) -> bool:
        return term is False or (isinstance(term, z3.BoolRef) and z3.is_false(term))


Z3OPS = Z3Ops()
