"""The trace projection and the TLA+ spec name the same variables, in the same groups and order.

Runs without Java: it reads `tla/CacheRuntime.tla` as text.
"""

from __future__ import annotations

import re

from cacheruntime import tlatrace

SPEC = (tlatrace.TLA_DIR / "CacheRuntime.tla").read_text()


def _spec_tuple(name: str) -> tuple[str, ...]:
    body = re.search(rf"^{name} == <<(.*?)>>", SPEC, re.MULTILINE | re.DOTALL)
    assert body, f"{name} == <<...>> not found"
    return tuple(v.strip() for v in body.group(1).split(","))


def test_vars_is_the_groups_in_the_projection_order():
    assert _spec_tuple("vars") == tuple(group for group, _ in tlatrace.GROUPS)


def test_each_group_tuple_lists_its_variables_in_the_projection_order():
    for group, members in tlatrace.GROUPS:
        assert _spec_tuple(group) == members, group


def test_every_variable_is_declared_once_in_group_order():
    declared: list[str] = []
    for block in re.finditer(r"^VARIABLES?\b(.*?)(?=^\S)", SPEC, re.MULTILINE | re.DOTALL):
        text = re.sub(r"\\\*[^\n]*", "", block.group(1))
        declared += [v.strip() for v in text.split(",") if v.strip()]
    assert tuple(declared) == tlatrace.VARIABLES


def test_bounds_are_the_spec_constants():
    declared = re.search(r"^CONSTANTS\n(.*?)\n\n", SPEC, re.MULTILINE | re.DOTALL)
    assert declared
    names = [m.group(1) for m in re.finditer(r"^    (\w+),?\s", declared.group(1) + "\n", re.MULTILINE)]
    assert names == list(tlatrace.Bounds().__dict__)
