"""A small operations namespace, so that one policy function runs on values and on Z3 terms.

Control-side policy (locks, evictability, victim selection) and the page-run algebra are
written once against an `Ops` object: `CONCRETE` evaluates them on Python values (what
TreeCore runs), `cacheruntime.z3check.Z3Ops` builds Z3 terms from the very same code (what
the proofs check). Policy code uses only these operations, never Python `and`/`or`/`if`
on values that may be symbolic.
"""

from __future__ import annotations

from collections.abc import Iterable
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


CONCRETE = ConcreteOps()
