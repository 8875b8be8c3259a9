"""`cacheruntime run` end to end: on LocalGPURuntime (CPU, tiny model) and on the reference model."""

import json

from cacheruntime.cli import main


def run(tmp_path, *args):
    out = tmp_path / "summary.json"
    code = main(["run", "--quiet", "--json", str(out), *args])
    return code, json.loads(out.read_text())


def test_default_job_on_cpu_serves_with_l2_restores_and_correct_outputs(tmp_path):
    code, summary = run(tmp_path)
    assert code == 0
    assert summary["output_check"] == "reference_next_token" and summary["output_mismatches"] == 0
    assert summary["requests"] == 36 and summary["tokens"] > 0
    assert summary["hit_tokens_l2"] > 0 and summary["restored_bytes"] > 0 and summary["backed_up_bytes"] > 0
    assert summary["boundary_calls_per_batch"] <= summary["boundary_calls_per_batch_bound"]


def test_job_on_the_llama_architecture_serves_recomputed_tokens(tmp_path):
    """The small Llama-architecture runner (issue 18): prefix hits on both tiers, outputs equal recomputation."""
    code, summary = run(tmp_path, "--runner", "llama-small")
    assert code == 0 and summary["output_mismatches"] == 0 and summary["tokens"] > 0
    assert summary["hit_tokens_l2"] > 0 and summary["restored_bytes"] > 0


def test_boundary_calls_per_batch_stay_constant_across_workload_sizes(tmp_path):
    _, small = run(tmp_path, "--requests", "6", "--new-tokens", "2", "3", "--l1-pages", "256")
    _, large = run(tmp_path, "--requests", "24", "--new-tokens", "12", "16", "--l1-pages", "256")
    assert large["tokens"] > 10 * small["tokens"]
    assert small["boundary_calls_per_batch"] == large["boundary_calls_per_batch"] == 3


def test_trace_replay_on_the_model(tmp_path):
    trace = tmp_path / "trace.jsonl"
    system = list(range(20))
    trace.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"id": "a", "prompt": system + [50, 51, 52], "max_new_tokens": 3},
                {"id": "b", "prompt": system + [60, 61], "max_new_tokens": 2, "arrival": 1},
                {"id": "a2", "after": "a", "append": [70, 71, 72, 73], "max_new_tokens": 2},
            ]
        )
    )
    code, summary = run(tmp_path, "--runtime", "model", "--trace", str(trace), "--l1-pages", "32")
    assert code == 0 and summary["requests"] == 3 and summary["tokens"] == 7
    assert summary["hit_tokens_l1"] + summary["hit_tokens_l2"] >= 20  # b and a2 reuse the system prompt
