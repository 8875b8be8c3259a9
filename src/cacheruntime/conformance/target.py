"""The runtime under test: a `MODULE:FACTORY` spec plus keyword options, and its twin model.

Both entry points (the command line and the pytest plugin) name the runtime the same
way, so a failure found by one is reproduced by the other. The factory is called once
per test case: every case starts from a fresh runtime, never from a reset one, because
a reset path is itself code that can be wrong.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Iterable

import attrs

from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import Capability, HostMode, RuntimeInfo, RuntimeInterface


def parse_options(pairs: Iterable[str]) -> dict[str, object]:
    """`key=value` strings to factory kwargs; values are Python literals where they parse.

    `device=cuda` stays the string "cuda"; `l1_pages=32` becomes the int 32.
    """
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"option {pair!r} is not key=value")
        try:
            options[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            options[key] = raw
    return options


@attrs.frozen
class Target:
    """A runtime factory by import path, with the kwargs it is called with."""

    spec: str  # "package.module:factory"
    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def parse(cls, spec: str, pairs: Iterable[str] = ()) -> Target:
        """Build from the command-line form: a spec and `key=value` strings."""
        if ":" not in spec:
            raise ValueError(f"runtime {spec!r} is not MODULE:FACTORY")
        return cls(spec, tuple(sorted(parse_options(pairs).items())))

    def factory(self) -> Callable[..., RuntimeInterface]:
        """Import the factory (errors here are the engine team's setup, not conformance)."""
        module, _, name = self.spec.partition(":")
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    def new(self, **overrides: object) -> RuntimeInterface:
        """A fresh runtime from the factory; `overrides` are the suite's own arguments (the storage
        check's `l3` store), passed besides the target's options and winning over them."""
        return self.factory()(**{**dict(self.options), **overrides})

    def __str__(self) -> str:
        opts = "".join(f" --option {k}={v}" for k, v in self.options)
        return f"{self.spec}{opts}"


def model_for(info: RuntimeInfo) -> ReferenceModel:
    """The reference model configured as the runtime says it is, so ids and sizes agree.

    A runtime that claims L3 gets a model with L3; one that claims L3 but not L2 keeps its host
    pages for staging only (buffer_only, spec/protocol.md §9.1), and the model does too.
    """
    l3 = Capability.L3 in info.capabilities
    buffer_only = l3 and Capability.L2 not in info.capabilities
    return ReferenceModel(
        runtime_id=info.runtime_id,
        page_size=info.page_size,
        max_requests=info.max_requests,
        max_request_tokens=info.max_request_tokens,
        l1_pages=info.l1_pages,
        l2_pages=info.l2_pages,
        vocab_size=info.vocab_size,
        l3=l3,
        host_mode=HostMode.BUFFER_ONLY if buffer_only else HostMode.RESIDENT,
    )
