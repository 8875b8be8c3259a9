"""Hypothesis draws that depend only on the seed, not on which modules happen to be imported.

Hypothesis (6.131 and later) sometimes draws a constant instead of a random value, and its
pool of constants includes every literal of every *local* module in `sys.modules`, local
meaning outside site-packages and the standard library. So a derandomized run's sequences
depend on what else is loaded: a check run from the command line, from the pytest plugin,
or late in a test session that has imported the whole test tree draws different calls
from the same seed, and an editable install (its source is local) draws differently from a
wheel (its source is in site-packages). Measured: the model's `NoDeferredFree` mutant was
caught when its test ran alone and survived inside the full CI session.

The pool is private to Hypothesis and has no setting, so this swaps the function that
fills it for one that returns no local constants, for as long as the context lasts;
Hypothesis's own global constants (edge values such as 0, -1, 2**63) are kept. With a
Hypothesis that has no such pool there is nothing to swap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def independent_of_loaded_modules() -> Iterator[None]:
    """Within the context, every draw depends on the seed (and Hypothesis's version) alone."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # a Hypothesis without the constants pool: draws are already independent
        yield
        return
    original = getattr(providers, "_get_local_constants", None)
    cache: Any = getattr(providers, "CONSTANTS_CACHE", None)
    if original is None or cache is None:
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    cache.cache.clear()  # permitted constants are cached per kind of draw, local ones included
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()
