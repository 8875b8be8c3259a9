"""Every subcommand over a table of bad inputs: one line naming what was wrong, a non-zero exit, no traceback.

Options are checked before any work starts (argparse types in `cacheruntime.cliargs`:
exit 2); what they cannot foresee, such as a malformed trace file, is one line with exit
1, and `--debug` shows its traceback instead. The calls run in-process: each fails while
its options are parsed, before the subcommand's work.
"""

from __future__ import annotations

import pytest

from cacheruntime.cli import main


def _lines(text: str) -> list[str]:
    """stderr without the warnings a CPU-only torch prints on import."""
    return [line for line in text.splitlines() if line.strip() and "Warning" not in line and "_conversion_method_template" not in line]


@pytest.fixture
def paths(tmp_path):
    return {"missing": str(tmp_path / "missing.toml"), "directory": str(tmp_path)}


BAD_OPTIONS = [
    (("run", "--requests", "0"), "argument --requests: expected a positive integer, got 0"),
    (("run", "--page-size", "four"), "argument --page-size: expected a positive integer, got 'four'"),
    (("run", "--trace", "{missing}"), "argument --trace: no file"),
    (("run", "--json", "{directory}"), "argument --json: '{directory}' is a directory"),
    (("run", "--write-policy", "sometimes"), "argument --write-policy: invalid choice: 'sometimes'"),
    (("conformance", "--runtime", "nocolon"), "argument --runtime: 'nocolon' is not MODULE:FACTORY"),
    (("conformance", "--runtime", "no_such_module_here:make"), "argument --runtime: cannot import 'no_such_module_here'"),
    (("conformance", "--runtime", "cacheruntime.runtime.factories:nosuch"), "has no 'nosuch'"),
    (("conformance", "--runtime", "cacheruntime.runtime.factories:CONFORMANCE_OPTIONS"), "is not callable"),
    (("conformance", "--max-examples", "-3"), "argument --max-examples: expected a positive integer, got -3"),
    (("conformance", "--expected", "{missing}"), "argument --expected: no file"),
    (("conformance", "--junitxml", "{directory}"), "argument --junitxml: '{directory}' is a directory"),
    (("conformance", "--bad-input", "0"), "argument --bad-input: expected a positive integer, got 0"),
    (("conformance", "--profile", "fast"), "argument --profile: invalid choice: 'fast'"),
    (("tlc", "--workers", "0"), "argument --workers: expected a positive integer, got 0"),
    (("tlc", "--manifest", "{missing}"), "argument --manifest: no file"),
    (("tlc", "--runtime-traces", "0"), "argument --runtime-traces: expected a positive integer, got 0"),
    (("tlc", "--traces-from", "{missing}"), "argument --traces-from: no directory"),
    (("tlc", "--runtime-traces", "2", "--runtime", "nocolon"), "argument --runtime: 'nocolon' is not MODULE:FACTORY"),
    (("tlc", "--runtime-traces", "2", "--runtime", "cacheruntime.runtime.factories:nosuch"), "has no 'nosuch'"),
    (("tlc", "--runtime-traces", "2", "--steps", "zero"), "argument --steps: expected a positive integer, got 'zero'"),
    (("z3", "--rlimit-scale", "0"), "argument --rlimit-scale: expected a positive number, got 0"),
    (("z3", "--nodes", "eight"), "argument --nodes: expected a positive integer, got 'eight'"),
    (("check", "--runtime", "nocolon"), "argument --runtime: 'nocolon' is not MODULE:FACTORY"),
    (("check", "--junitxml", "{directory}"), "argument --junitxml: '{directory}' is a directory"),
    (("trace", "--nosuch"), "unrecognized arguments: --nosuch"),
    (("bench", "--bogus"), "unrecognized arguments: --bogus"),
    (("bench", "--model-steps", "many"), "argument --model-steps: invalid"),
    (("serve",), "argument command: invalid choice: 'serve'"),
]


@pytest.mark.parametrize(("argv", "says"), BAD_OPTIONS, ids=[" ".join(argv) for argv, _ in BAD_OPTIONS])
def test_a_bad_option_is_one_line_and_exit_2(argv, says, paths, capsys):
    argv = [part.format(**paths) for part in argv]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    captured = capsys.readouterr()
    (line,) = _lines(captured.err)
    assert exit_.value.code == 2 and captured.out == "", (argv, captured)
    assert line.startswith(f"cacheruntime {argv[0]}: error: " if argv[0] != "serve" else "cacheruntime: error: "), line
    assert says.format(**paths) in line, line


def test_a_malformed_input_file_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"conversation": 1, "unterminated\n')
    assert main(["run", "--trace", str(trace), "--quiet"]) == 1
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith("cacheruntime run: error: ValueError: ") and f"{trace}:1: not JSON" in line, line
    assert "(--debug shows the traceback)" in line
    with pytest.raises(ValueError, match="not JSON"):
        main(["run", "--trace", str(trace), "--quiet", "--debug"])


def test_an_output_path_under_a_file_is_refused_before_work(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--json", str(blocker / "summary.json")])
    (line,) = _lines(capsys.readouterr().err)
    assert exit_.value.code == 2 and "argument --json: cannot write" in line and "is not a writable directory" in line, line


@pytest.mark.parametrize("pair", [("0", "0"), ("5", "3")])
def test_new_tokens_out_of_order_or_zero_is_one_line_before_work(pair, capsys):
    """`--new-tokens 0 0` used to hang the job (turns that never finish); `5 3` ended in a ValueError from randrange."""
    assert main(["run", "--new-tokens", *pair, "--quiet"]) == 2
    (line,) = _lines(capsys.readouterr().err)
    assert line.startswith("cacheruntime run: error: argument --new-tokens:"), line


@pytest.mark.parametrize("arrival", ["1e300", "100000000"])
def test_a_far_arrival_in_a_trace_is_served_without_stepping_to_it(arrival, tmp_path, capsys):
    """A trace whose request arrives at step 1e300 used to hang: the scheduler stepped through every empty step."""
    trace = tmp_path / "far.jsonl"
    trace.write_text(f'{{"id": "a", "prompt": [1, 2, 3], "max_new_tokens": 2, "arrival": {arrival}}}\n')
    assert main(["run", "--runtime", "model", "--trace", str(trace), "--quiet"]) == 0
