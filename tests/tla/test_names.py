"""The trace projection and the TLA+ spec name the same variables, in the same order.

Runs without Java: it reads `tla/CacheRuntime.tla` as text.
"""

from __future__ import annotations

import re

from cacheruntime import tlatrace


def _spec_tuple(name: str) -> tuple[str, ...]:
    text = (tlatrace.TLA_DIR / "CacheRuntime.tla").read_text()
    body = re.search(rf"^{name} == <<(.*?)>>", text, re.MULTILINE | re.DOTALL)
    assert body, f"{name} == <<...>> not found"
    return tuple(v.strip() for v in body.group(1).split(","))


def test_projection_follows_the_spec_variables():
    assert _spec_tuple("vars") == tlatrace.VARIABLES


def test_every_variable_is_declared():
    text = (tlatrace.TLA_DIR / "CacheRuntime.tla").read_text()
    declared = re.search(r"^VARIABLES\n(.*?)\n\n", text, re.MULTILINE | re.DOTALL)
    assert declared
    names = tuple(m.group(1) for m in re.finditer(r"^    (\w+),?\s", declared.group(1) + "\n", re.MULTILINE))
    assert names == tlatrace.VARIABLES


def test_bounds_are_the_spec_constants():
    text = (tlatrace.TLA_DIR / "CacheRuntime.tla").read_text()
    declared = re.search(r"^CONSTANTS\n(.*?)\n\n", text, re.MULTILINE | re.DOTALL)
    assert declared
    names = [m.group(1) for m in re.finditer(r"^    (\w+),?\s", declared.group(1) + "\n", re.MULTILINE)]
    assert names == list(tlatrace.Bounds().__dict__)
