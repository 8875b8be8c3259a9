"""Runtime traces: recorded executions of LocalGPURuntime checked against CacheRuntime.tla by TLC.

The manifest pins the CI run (tla/manifest.json, `runtime-traces`: 200 traces of 40 calls
from seed 0, on CPU with simulated streams seeded per trace, so the traces and TLC's state
count are the same on every machine). About 15 seconds on 2 cores. A runtime with a
seeded ordering bug (a batch executes before an earlier prepared batch of its request) is
rejected at the call that shows it. Needs Java and tla2tools.jar; skipped without them.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from cacheruntime import runtimetrace, tlc
from cacheruntime.cli import main
from cacheruntime.conformance.mutants.local import ExecuteOutOfOrder
from cacheruntime.runtime import factories

try:
    JAVA, JAR = tlc.find_java(), tlc.find_jar()
except tlc.ToolMissing as missing:  # pragma: no cover - depends on the machine
    pytest.skip(str(missing), allow_module_level=True)

MODEL = runtimetrace.manifest_model(tlc.load_manifest())
MUTANT = "cacheruntime.conformance.mutants.local:ExecuteOutOfOrder"


@pytest.fixture(scope="module")
def traces() -> list[runtimetrace.RuntimeTrace]:
    assert MODEL["traces"] >= 200 and MODEL["steps"] <= runtimetrace.MAX_STEPS
    return runtimetrace.record_many(factories.traced, runtimetrace.DEFAULT_RUNTIME, MODEL["traces"], MODEL["steps"], MODEL["seed"])


def test_traces_of_the_local_runtime_follow_the_spec(traces):
    print(f"seeds {MODEL['seed']}..{MODEL['seed'] + MODEL['traces'] - 1}, {MODEL['steps']} calls each")
    result = runtimetrace.validate(traces, workers=2, java=JAVA, jar=str(JAR))
    assert result.ok, result.error or "\n".join(result.rejected)
    assert result.traces == MODEL["traces"] and result.steps == MODEL["traces"] * MODEL["steps"]
    assert result.distinct == MODEL["distinct_states"], "the manifest pins TLC's state count"
    # TLC took hidden completions: more states than the calls and initial states replayed
    assert result.distinct > result.steps + result.traces


#: traces scripts/gpu_check.sh recorded on the H200 (CUDA streams), 2026-12-02 (docs/gpu-record.md)
CUDA_TRACES = Path(__file__).resolve().parents[2] / "docs" / "gpu-record" / "2026-12-02-traces"


def test_traces_recorded_on_cuda_follow_the_spec():
    """Executions of LocalGPURuntime on a real GPU's streams, checked here on CPU (the GPU machine has no Java)."""
    recorded = runtimetrace.load(CUDA_TRACES)
    assert len(recorded) == 200
    result = runtimetrace.validate(recorded, workers=2, java=JAVA, jar=str(JAR))
    assert result.ok, result.error or "\n".join(result.rejected)
    assert (result.steps, result.distinct) == (8000, 11538), "the state count TLC found when these traces were committed"


def test_the_traces_reach_every_operation_both_ways(traces):
    """Every action the spec has for a boundary call is taken, and refused, in the recorded traces."""
    covered = runtimetrace.ops_covered(traces)
    actions = ["OpenRequest", "CloseRequest", "PrepareBatch", "ExecuteBatch", "CancelBatch", "Publish", "Split", "Retain", "Release"]
    actions += ["SubmitBackup", "SubmitRestore", "SubmitDemote", "SubmitDrop", "Submit"]
    for action in actions:
        assert covered.get(f"{action}:ok") and covered.get(f"{action}:raised"), (action, covered)
    assert covered.get("PollCompletions:ok") and covered.get("WaitCompletions:ok") and covered.get("Restart:ok")
    reported = [s for t in traces for s in runtimetrace.steps_of(t) if s.op in ("PollCompletions", "WaitCompletions") and s.out["done"]]
    assert len(reported) > 50, "completions are reported, and checked against the spec's"
    # restores a plan started return no ticket: their ids are first seen in a report and bound there
    tickets = {t["sym"] for tr in traces for s in runtimetrace.steps_of(tr) for t in s.out["tickets"]}
    assert any(d["sym"] not in tickets for s in reported for d in s.out["done"])


def test_a_runtime_with_an_ordering_bug_is_rejected_at_the_call_that_shows_it():
    """ExecuteOutOfOrder runs a batch before an earlier prepared batch of the same request (scenario 8)."""
    traces = runtimetrace.record_many(ExecuteOutOfOrder, MUTANT, 20, MODEL["steps"], 0)
    result = runtimetrace.validate(traces, workers=2, java=JAVA, jar=str(JAR))
    assert not result.ok and not result.error
    first = result.rejected[0]
    assert first.startswith(f"runtime {MUTANT} seed 5: call 9 of 40, ExecuteBatch: execute_batch(PreparedBatchHandle("), first
    assert "batch_id=1" in first and "returned what no interleaving of completions lets the spec return" in first
    assert all(", ExecuteBatch: " in line for line in result.rejected), result.rejected
    # the same seeds on the correct runtime are accepted (the first test checks seeds 0..199)


def test_traces_written_are_read_back_and_checked_from_the_command_line(tmp_path, capsys):
    folder = tmp_path / "traces"
    assert main(["tlc", "--runtime-traces", "3", "--steps", "20", "--seed", "7", "--record-to", str(folder), "--record-only"]) == 0
    files = sorted(folder.glob("*.jsonl.gz"))
    assert len(files) == 1 and files[0].stat().st_size < 16 << 20
    loaded = runtimetrace.load(folder)
    again = runtimetrace.record_many(factories.traced, runtimetrace.DEFAULT_RUNTIME, 3, 20, 7)
    assert [(t.seed, t.events) for t in loaded] == [(t.seed, t.events) for t in again], "recording is reproducible from the seed"
    capsys.readouterr()
    assert main(["tlc", "--traces-from", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "runtime traces: ok: 3 traces, 60 calls" in out, out


def test_the_mutant_from_the_command_line_exits_1_naming_the_call(capsys):
    assert main(["tlc", "--runtime-traces", "6", "--runtime", MUTANT]) == 1
    out = capsys.readouterr().out
    assert "REJECTED 1" in out and f"runtime {MUTANT} seed 5: call 9 of 40, ExecuteBatch" in out, out


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Warning" not in line and "_conversion_method_template" not in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--steps", "5"], "--steps needs --runtime-traces N"),
        (["--runtime-traces", "2", "--record-only"], "--record-only needs --record-to DIR"),
        (["--runtime-traces", "2", "--steps", "61"], "at most 60 calls a trace"),
        (["--runtime-traces", "2", "--traces-from", "{tmp}"], "give one"),
        (["--runtime-traces", "2", "--model", "default"], "run alone"),
        (["--traces-from", "{tmp}"], "no runtime-traces-*.jsonl.gz files in"),
        (["--runtime-traces", "1", "--runtime", "cacheruntime.runtime.factories:local"], "the check needs {'page_size': 1"),
    ],
)
def test_bad_runtime_trace_options_are_one_line_and_exit_2(argv, says, tmp_path, capsys):
    argv = [part.format(tmp=tmp_path) for part in argv]
    if argv[-1:] == ["cacheruntime.runtime.factories:local"]:
        argv += ["--option", "page_size=2"]
    assert main(["tlc", *argv]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("cacheruntime tlc: error: ") and says in line, line


def test_a_corrupt_trace_file_is_one_line_and_exit_2(tmp_path: Path, capsys):
    (tmp_path / "runtime-traces-000.jsonl.gz").write_bytes(gzip.compress(b'{"seed": 1, "runtime": "x"\n'))
    assert main(["tlc", "--traces-from", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("cacheruntime tlc: error: runtime-traces-000.jsonl.gz line 1 is not a runtime trace"), line
