"""Bad input (issue 17, item 4): a Hypothesis fuzz of every operation that takes arguments,
on the reference model and on `LocalGPURuntime`: only typed errors, and none that changes
`probe()`. The checker (`cacheruntime.conformance.badinput`) is shown to catch both kinds of
violation on runtimes broken on purpose.

CI runs 1,000 examples per runtime; the deep run is `slow`:

    PYTHONPATH=src python -m pytest -m slow tests/test_bad_input.py -s
"""

from __future__ import annotations

import functools

import pytest

from cacheruntime.conformance import badinput
from cacheruntime.conformance.target import model_for
from cacheruntime.model import ReferenceModel, operation
from cacheruntime.protocol import RuntimeInfo
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, conformance
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.local import LocalGPURuntime

SEED = 20261202


@functools.cache
def conformance_info() -> RuntimeInfo:
    runtime = conformance()
    runtime.close()
    return runtime.info()


def model() -> ReferenceModel:
    """The model sized as the conformance runtime, with its vocabulary (as the suite makes it)."""
    return model_for(conformance_info())


FACTORIES = {"model": model, "local": conformance}


def fuzz(name: str, examples: int) -> badinput.Report:
    report = badinput.run(FACTORIES[name], examples, SEED, name)
    print(f"seed {SEED}: {report.summary()}")
    for violation in report.violations[:10]:
        print(f"  {violation.kind}: {violation.call} -> {violation.outcome}")
    return report


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_bad_input_raises_typed_errors_and_changes_nothing(name):
    report = fuzz(name, 1_000)
    assert report.examples == 1_000
    assert report.violations == []
    assert report.raised["InvalidArgument"] > report.examples // 2, "most corruptions are ill-typed arguments"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_bad_input_deep(name):
    report = fuzz(name, 10_000)
    assert report.examples == 10_000 and report.violations == []


class UncheckedSplit(ReferenceModel):
    """A model whose `split` skips the argument checks: a float split point fails untyped."""

    @operation
    def split(self, extent, at_page):
        return self.split_extent(extent, at_page)


class RefcountLeak(Ledger):
    """A ledger whose `retain_extent` adds the reference before checking its argument, unjournaled."""

    def retain_extent(self, extent):
        record = self.state.extents.get(getattr(extent, "generation", None))
        if record is not None:
            record.refcount += 1
        super().retain_extent(extent)


def test_the_checker_reports_untyped_errors():
    info = conformance_info()
    sizes = {"runtime_id": info.runtime_id, "page_size": info.page_size, "max_requests": info.max_requests, "max_request_tokens": info.max_request_tokens}
    report = badinput.run(
        lambda: UncheckedSplit(**sizes, l1_pages=info.l1_pages, l2_pages=info.l2_pages, vocab_size=info.vocab_size), 300, SEED, "unchecked split"
    )
    assert report.untyped > 0 and all(v.call.startswith("split(") for v in report.violations), report.summary()


def test_the_checker_reports_state_changed_on_error():
    report = badinput.run(lambda: LocalGPURuntime(**CONFORMANCE_OPTIONS, ledger_class=RefcountLeak), 300, SEED, "refcount leak")
    assert report.changed > 0 and all(v.call.startswith("retain(") for v in report.violations), report.summary()
