"""A manifest model may be a seeded TLC simulation (the deep model): how its output is read,
and that the run is built to be reproducible (one worker, the seed passed)."""

from __future__ import annotations

import json
from pathlib import Path

from cacheruntime import tlc

ROOT = Path(__file__).resolve().parents[2]

PASSED = """Running Random Simulation with seed 7 with 1 worker on 2 cores
Computed 1 initial states...
Progress: 2637 states checked.
Progress: 34986 states checked.
Finished in 59s at (2026-12-02 22:26:00)
"""

VIOLATED = """Running Random Simulation with seed 7 with 1 worker on 2 cores
Progress: 2637 states checked.
Error: Invariant R1 is violated.
Error: The behavior up to this point is:
Finished in 03s at (2026-12-02 22:26:00)
"""


def test_a_simulation_that_finished_clean_passes_with_its_last_count():
    assert tlc.parse_output(PASSED, 0, simulated=True) == ("pass", 34986, None)


def test_a_simulation_that_found_a_violation_names_it():
    got, count, _ = tlc.parse_output(VIOLATED, 12, simulated=True)
    assert got == "violation:R1" and count == 2637


def test_a_simulation_without_its_end_is_not_a_pass():
    assert tlc.parse_output(PASSED.replace("Finished in 59s", "killed"), 0, simulated=True)[0] != "pass"
    assert tlc.parse_output(PASSED, 0)[0] != "pass"  # the exhaustive reading wants TLC's completion line


def test_the_deep_model_is_a_pinned_seeded_simulation():
    (deep,) = [m for m in json.loads((ROOT / "tla" / "manifest.json").read_text())["models"] if m["name"] == "deep"]
    assert deep["group"] == "deep" and set(deep["simulate"]) == {"traces", "depth", "seed"}
    assert isinstance(deep["distinct_states"], int)
