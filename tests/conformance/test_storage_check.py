"""The `storage` check (issue 21 item 4) passes on `LocalGPURuntime` with L3 in both host modes, over
the file store and over Mooncake, and reaches its situations; the storage mutants die on it.

Each configuration is `cacheruntime.runtime.factories:conformance_l3` with `host_mode` and the
suite's `store` option; the check gives the runtime a `SuiteStore` around a fresh backend of that
kind per case (`cacheruntime.conformance.storage`). The file-store runs use the CI profile; the
Mooncake runs (a `LocalMooncake` on loopback, started and stopped here) a shorter one, as each
case's client connects to the cluster. One run on CPU worker threads holds store writes in
flight (`hold_store_writes`), which a simulated stream cannot (it runs the held step on the
caller's thread). One guided case per host mode and path plays the drawn store read failure
and checks its outcome directly (STORE, ComputeFailed, the object readable again). Each file-store run
also reaches, at its floor, device pages whose names end under an L3 transfer in flight that then
lands (`coverage.ENDED_UNDER_L3`, drawn by `end_under_l3`). The mutants
are `storage.*` (`cacheruntime.conformance.mutants.storage`):
`tests/conformance/test_conformance_mutants.py` asserts each dies, trying this check first.
"""

from __future__ import annotations

import importlib.util

import pytest

from cacheruntime.conformance import coverage
from cacheruntime.conformance.mutants import MUTANTS
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import describe, run_check
from cacheruntime.conformance.statemachine import machine_for
from cacheruntime.conformance.target import Target
from cacheruntime.protocol import ComputeFailed, TransferFailure, TransferKind
from cacheruntime.storage import Status

FACTORY = "cacheruntime.runtime.factories:conformance_l3"
MODES = ["resident", "buffer_only"]

#: cases of the Mooncake runs and of the thread-stream run (the file-store runs use the CI profile's 60)
SHORT_RUN = 15

needs_mooncake = pytest.mark.skipif(importlib.util.find_spec("mooncake") is None, reason="the [mooncake] extra is not installed")


def _run(target: Target, max_examples: int | None = None):
    """The storage check on `target` (no shrinking: a failure prints its unshrunk reproduction), and what it reached."""
    with coverage.recording() as reach:
        outcome = run_check(target, "storage", profile("ci", max_examples=max_examples, shrink=False))
    assert outcome.status == "passed", "\n\n".join(describe(v, shrunk=False) for v in outcome.violations) or outcome.message
    return reach["storage"]


@pytest.mark.parametrize("mode", MODES)
def test_storage_check_passes_over_the_file_store_and_reaches_its_situations(mode):
    tally = _run(Target(FACTORY, (("host_mode", mode),)))
    assert not tally.shortfalls("storage"), tally.shortfalls("storage")
    for situation, floor in (coverage.MODE_SITUATIONS[mode], *coverage.ENDED_UNDER_L3[mode]):
        assert tally.cases[situation] >= floor, f"{situation}: {tally.cases[situation]} case(s), floor {floor}"


@pytest.fixture(scope="module")
def mooncake_cluster(tmp_path_factory):
    from cacheruntime.storage.master import LocalMooncake

    with LocalMooncake(tmp_path_factory.mktemp("mooncake"), lease_ms=1500) as cluster:
        yield cluster


@needs_mooncake
@pytest.mark.parametrize("mode", MODES)
def test_storage_check_passes_over_mooncake(mode, mooncake_cluster):
    store = f"mooncake:{mooncake_cluster.master_address},{mooncake_cluster.metadata_url}"
    tally = _run(Target(FACTORY, (("host_mode", mode), ("store", store))), SHORT_RUN)
    assert tally.cases["persist lands"] and tally.cases["fetch lands"] and tally.cases["store failure on persist"]


def test_held_store_writes_on_thread_streams():
    """buffer_only on worker threads: the rule that holds store writes is drawn, and staging survives it (S2)."""
    tally = _run(Target(FACTORY, (("host_mode", "buffer_only"), ("streams", "threads"))), SHORT_RUN)
    assert tally.cases["buffer_only persist through staging"] and tally.cases[coverage.HELD_WRITE] >= 2, dict(tally.cases)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("execute", [True, False])
def test_a_failed_store_read_fails_the_fetch_and_its_batch(mode, execute):
    """The drawn read failure (`fetch`, gone="read_failed"): the fetch completes with STORE, the batch that reads
    it fails with ComputeFailed, on the runtime as on the model (which the machine holds it to), and the store
    reads the object again afterwards."""
    machine = machine_for(Target(FACTORY, (("host_mode", mode),)), check="storage")
    with coverage.recording() as reach:
        state = machine()
        state.start(0)
        try:
            state.persist(i=0, where="submit", fail=False)
            state.fetch(i=0, count=2, gone="read_failed", execute=execute)
            calls = list(state.runtime.calls)
            unreadable, store = state.unreadable, state.store
            objects = store.get(state.persisted[0], [bytearray(state.info.page_bytes) for _ in state.persisted[0]])
        finally:
            state.teardown()
    failed = [c for c in calls if c.operation == "execute_batch" and c.raised]
    reported = [c.failure for call in calls if call.operation.endswith("_completions") for c in call.value if c.ticket.kind is TransferKind.FETCH]
    assert reported == [TransferFailure.STORE]
    assert [type(c.error) for c in failed] == ([ComputeFailed] if execute else [])
    assert not unreadable and all(o.status is Status.HIT for o in objects)
    assert reach["storage"].cases["store failure on fetch"] == 1


def test_the_storage_check_skips_a_runtime_without_l3():
    outcome = run_check(Target("cacheruntime.runtime.factories:conformance"), "storage", profile("ci", max_examples=1))
    assert outcome.status == "skipped" and "L3" in outcome.message


def test_every_storage_mutant_names_an_l3_invariant():
    storage = {name: m for name, m in MUTANTS.items() if name.startswith("storage.")}
    assert set(storage) >= {
        "storage.staging_reused_before_store_write",
        "storage.store_failure_drops_device_copy",
        "storage.fetch_miss_reported_as_hit",
        "storage.fetch_read_failure_reported_as_hit",
        "storage.device_frees_skipped_on_landing",
        "storage.device_frees_skipped_on_fetch_landing",
    }
    assert all(m.invariant in {"S1", "S2", "S3", "F1", "R1"} for m in storage.values())
