"""A failure reads as protocol calls: the calls the runtime was sent, the differing fields, and a leak named at its call.

The leaking runtime is `LocalGPURuntime` with one seam swapped (a ledger whose page free
forgets the first device page it frees). It records, on its own side, the operation in
which it lost the page, so the test can check that the report names that call without
taking the suite's word for it. With INTROSPECTION the suite catches the leak as R1
right after the losing call; a runtime that does not claim it shows the same leak only
later, as an `OutOfPages` whose free count differs from the model's, and the field
diff says which number.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from cacheruntime.conformance.failure import FieldDifference, field_diff, format_diff, in_runtime_names, outcome_diff
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.renaming import Renaming
from cacheruntime.conformance.runner import describe, run_check
from cacheruntime.conformance.target import Target
from cacheruntime.protocol import (
    BatchCompletion,
    CacheExtentRef,
    Capability,
    ItemResult,
    OutOfPages,
    PageRun,
    PreparedBatchHandle,
    RequestRuntimeHandle,
    StaleHandle,
    Tier,
    TransferKind,
    TransferTicket,
)
from cacheruntime.recording import Call
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.local import LocalGPURuntime

#: The operation each leaking runtime lost its page in, in the order the runtimes were made.
LOSSES: list[str] = []


class ForgetsOneFreeLedger(Ledger):
    """The first device page freed outright is never put back on the free list."""

    leaked = False

    def free_phys(self, tier: Tier, phys: int) -> None:
        if tier is Tier.L1 and not self.leaked and not self.transfers_on(tier, phys):
            self.leaked = True
            LOSSES.append(self.txn.operation)
            return
        super().free_phys(tier, phys)


class Leaky(LocalGPURuntime):
    """The conformance runtime on the CPU with the leaking ledger."""

    def __init__(self, **options: Any):
        super().__init__(**{**CONFORMANCE_OPTIONS, "device": "cpu", "ledger_class": ForgetsOneFreeLedger, **options})


class LeakyWithoutProbe(Leaky):
    """The same leak in a runtime that does not claim INTROSPECTION: no probe() to judge."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        return super().capabilities - {Capability.INTROSPECTION}


def leaky(**options: Any) -> Leaky:
    return Leaky(**options)


def leaky_without_probe(**options: Any) -> LeakyWithoutProbe:
    return LeakyWithoutProbe(**options)


def _marked_call(calls: str) -> str:
    """The call the report marks as where the failure showed: `operation(...)` of the last line."""
    last = calls.splitlines()[-1]
    assert last.endswith("<-- the failure shows here"), calls
    return re.match(r"\s*\d+\s+(\w+)\(", last).group(1)


def test_a_leak_is_r1_at_the_call_that_lost_the_page():
    LOSSES.clear()
    outcome = run_check(Target("test_readable_failures:leaky"), "core", profile("ci", shrink=False), keep_going=False)
    assert outcome.status == "failed"
    (violation,) = outcome.violations
    assert "R1" in violation.signature.ids, describe(violation)
    assert _marked_call(violation.calls) == LOSSES[-1] == violation.signature.operation, describe(violation)
    assert f"after {LOSSES[-1]}: R1: L1: lost [" in violation.message
    printed = describe(violation, shrunk=False)
    assert printed.index("# ---- boundary calls sent") < printed.index("# ---- unshrunk reproduction")
    assert printed.rstrip().endswith("state.teardown()"), "the reproduction comes last, runnable as printed"


def test_without_probe_the_leak_shows_later_as_an_out_of_pages_count_with_its_field_diff():
    outcome = run_check(Target("test_readable_failures:leaky_without_probe"), "core", profile("ci", shrink=False), keep_going=False)
    assert outcome.status == "failed"
    (violation,) = outcome.violations
    assert "R1" not in violation.signature.ids
    assert "OutOfPages" in violation.signature.kind, describe(violation)
    # Where the lost page shows depends on the drawn sequence: both sides out of pages with
    # one page fewer free on the runtime's, or the runtime out of pages where the model is not.
    free = re.findall(r"^  error\.free: runtime (\d+), model (\d+)$", violation.diff, flags=re.M)
    if free:
        assert int(free[0][1]) - int(free[0][0]) == 1, violation.diff  # exactly the one page lost
        assert "error.needed" not in violation.diff and "error.tier" not in violation.diff, "only differing fields"
    else:
        assert re.match(r"^  outcome: runtime raises OutOfPages: .*, model returns ", violation.diff), violation.diff
    assert _marked_call(violation.calls) == violation.signature.operation
    assert "raises OutOfPages: L1 needs" in violation.calls.splitlines()[-1]


# -- the field diff on its own -------------------------------------------------------------


def test_the_diff_follows_records_and_tuples_and_shows_only_differing_fields():
    request = RequestRuntimeHandle("local", 0, 1, 0)
    batch = PreparedBatchHandle("local", 0, 4)
    ref = CacheExtentRef("local", 0, 2, (PageRun(0, 2),))
    runtime = BatchCompletion(batch, (ItemResult(request, 5, 11), ItemResult(request, 3, 9)), (ref,), ())
    model = BatchCompletion(batch, (ItemResult(request, 5, 11), ItemResult(request, 4, 9)), (attrs.evolve(ref, page_runs=(PageRun(0, 3),)),), ())
    assert field_diff(runtime, model) == [
        FieldDifference("value.items[1].num_tokens", "3", "4"),
        FieldDifference("value.published[0].page_runs[0].page_count", "2", "3"),
    ]
    assert format_diff(field_diff((1, 2), (1, 2, 3))) == "  value: runtime (1, 2), model (1, 2, 3)"
    assert field_diff(OutOfPages(Tier.L1, 3, 1), OutOfPages(Tier.L1, 3, 2), "error") == [FieldDifference("error.free", "1", "2")]
    assert field_diff(StaleHandle("a"), StaleHandle("b"), "error") == [], "the contract fixes a typed error's type, not its text"


def test_outcomes_that_differ_in_kind_are_one_line():
    runtime = Call(1, "release", (), error=StaleHandle("extent 3 was split"))
    model = Call(0, "release", (), None)
    assert outcome_diff(runtime, model) == [FieldDifference("outcome", "raises StaleHandle: extent 3 was split", "returns None")]


def test_the_model_value_is_diffed_in_the_runtimes_names():
    """A runtime numbering its batches from 40 differs from the model only where the renaming does not account for it."""
    renaming = Renaming()
    assert renaming.match(PreparedBatchHandle("local", 0, 40), PreparedBatchHandle("local", 0, 0)) == []
    model = TransferTicket("local", 0, 0, TransferKind.BACKUP, 1, 2)
    assert in_runtime_names(renaming, PreparedBatchHandle("local", 0, 0)) == PreparedBatchHandle("local", 0, 40)
    assert field_diff(TransferTicket("local", 0, 0, TransferKind.BACKUP, 1, 1), in_runtime_names(renaming, model)) == [
        FieldDifference("value.page_count", "1", "2")
    ]
