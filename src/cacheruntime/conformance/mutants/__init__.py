"""Deliberately broken runtimes, each violating one invariant: the suite must kill every one.

A mutant that survives the CI profile is a blind spot of the suite;
`tests/conformance/test_conformance_mutants.py` asserts none survives (except the known
survivors of `families.SURVIVORS`, which it asserts still survive) and
`cacheruntime conformance --mutants` prints the kill table.

Three families, each a `MODULE:FACTORY` target like any runtime under test:
`local.*` and `family.*` are `LocalGPURuntime` with one seam swapped (a `ledger_class`
with one wrong public method, a `transaction_class`, an `ordering_class` that leaves out a
wait, or a `memory_class`): the real bugs an engine would have. `local.*` are the first
ones, a few per invariant; `family.*` (`families.py`, written without reading the suite's
rules) cover every operation against its error classes and the hard situations, and
`families.SURVIVORS` lists those the CI profile does not kill yet. `situation.*`
(`situations.py`, written the same way) fill the operation x error-class cells and the
situations the others leave out, with its own table and `SITUATION_SURVIVORS`. `model.*` break the
suite's own model runtime (`cacheruntime.conformance.selftest`), so the suite is tested
even where the runtime does not expose a guard (a corrupted restore, a non-atomic submit,
a split that keeps its parent). `faults.*` mishandle one fault each (a failed copy taken for
landed, write-back that drops too early, a failed batch committed, a dead worker unnoticed):
the `faults` check kills them. `storage.*` get one step of the L3 tier wrong (staging freed
before the store write, a failed write that drops the device copy, a miss or a failed read
taken for a hit, device pages left deferred when the transfer that used them lands):
the `storage` check, which gives a runtime its store, kills them.
"""

from __future__ import annotations

import attrs

from cacheruntime.conformance.mutants import families as _families
from cacheruntime.conformance.mutants import faults as _faults
from cacheruntime.conformance.mutants import local as _local
from cacheruntime.conformance.mutants import model as _model
from cacheruntime.conformance.mutants import situations as _situations
from cacheruntime.conformance.mutants import storage as _storage
from cacheruntime.conformance.target import Target

_FAMILIES = {
    "local": _local.MUTANTS,
    "model": _model.MUTANTS,
    "family": _families.MUTANTS,
    "situation": _situations.MUTANTS,
    "faults": _faults.MUTANTS,
    "storage": _storage.MUTANTS,
}


@attrs.frozen
class Mutant:
    """A broken runtime: its name (family.bug), the invariant it violates, and how."""

    name: str
    invariant: str
    how: str

    @property
    def target(self) -> Target:
        """The factory target that builds this mutant."""
        return Target("cacheruntime.conformance.mutants:build", (("name", self.name),))


MUTANTS: dict[str, Mutant] = {
    f"{family}.{name}": Mutant(f"{family}.{name}", cls.invariant, cls.__doc__.splitlines()[0])
    for family, classes in _FAMILIES.items()
    for name, cls in classes.items()
}


def build(name: str, **options):
    """Factory: a fresh instance of mutant `name` ("local.double_free", "model.corrupt_restore", ...)."""
    family, _, bug = name.partition(".")
    return _FAMILIES[family][bug](**options)
