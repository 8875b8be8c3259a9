"""The pytest plugin from a separate throwaway project: passes for a conforming runtime, fails for a mutant."""

import subprocess
import sys


def _run_project(tmp_path, *options):
    (tmp_path / "test_engine_conformance.py").write_text("from cacheruntime.conformance.suite import *  # noqa: F403\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "core", "-rsx", *options],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )


def test_plugin_passes_for_the_local_runtime(tmp_path):
    run = _run_project(tmp_path, "--cacheruntime-factory", "cacheruntime.runtime.factories:conformance")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 passed" in run.stdout and "cacheruntime conformance" in run.stdout


def test_plugin_fails_for_a_mutant_with_its_reproduction(tmp_path):
    """Unshrunk: the plugin's shrinking is Hypothesis's own, and it costs minutes per violation on 2 cores."""
    run = _run_project(
        tmp_path,
        "--cacheruntime-factory",
        "cacheruntime.conformance.mutants:build",
        "--cacheruntime-option",
        "name=local.execute_twice",
        "--cacheruntime-no-shrink",
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert "[O4]" in run.stdout and "# Reproduces a conformance failure" in run.stdout


def test_without_the_option_the_suite_skips(tmp_path):
    run = _run_project(tmp_path)
    assert run.returncode == 0 and "no --cacheruntime-factory given" in run.stdout
