"""The H200 diagnostics of the e2e probe and the protocol rows run on CPU and print their parts.

`ttftprobe` wraps the runtime's calls and the runner's forward to stamp the e2e probe;
`submitcost` times a protocol restore and backup of scattered one-page runs. Both are run on
the GPU machine by hand; here they run at CPU sizes so that a change of the runtime or the
bench that breaks them fails in CI rather than in a device call.
"""

from __future__ import annotations

import re
import sys

import pytest

from benchmarks.diagnostics import submitcost, ttftprobe


def test_ttftprobe_stamps_each_part_of_each_probe(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["ttftprobe", "--device", "cpu", "--quick"])
    ttftprobe.main()
    out = capsys.readouterr().out
    assert "TTFT at idle" in out
    for kind in ("l2 hit", "l1 hit", "recompute"):
        line = next(line for line in out.splitlines() if line.startswith(f"{kind}:"))
        stamps = [float(value) for value in re.findall(r"(?:prepare out|execute in|forward in|forward out|execute out) ([0-9.]+)", line)]
        assert len(stamps) == 5, line
        assert stamps == sorted(stamps), line  # each part ends after the one before it


def test_submitcost_times_both_directions_and_profiles_the_ledger(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["submitcost", "--device", "cpu", "--pages", "32", "--reps", "1"])
    submitcost.main()
    out = capsys.readouterr().out
    assert "32 pages in runs of 1" in out
    for name in ("restore", "backup"):
        assert re.search(rf"{name}: submit returns after [0-9.]+ ms \([0-9.]+ us a page\), wait_completions after [0-9.]+ ms more", out), out
    assert "complete_transfer" in out and "start_transfer" in out
