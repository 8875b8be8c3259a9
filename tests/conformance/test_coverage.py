"""Reach, measured: the CI profile drives the landed runtime into every named situation, at its floor.

The full run here is the CI's one conformance run of `LocalGPURuntime` (it also asserts the
verdict and the JUnit report), with `--coverage`: the command exits 1 when a situation a
check must reach stays below its floor in that check, and prints which.
"""

from cacheruntime.cli import main
from cacheruntime.conformance import coverage
from cacheruntime.conformance.statemachine import CHECKS, machine_for

LOCAL = "cacheruntime.runtime.factories:conformance"


def test_local_runtime_conforms_and_reaches_every_floor(tmp_path, capsys):
    status = main(["conformance", "--runtime", LOCAL, "--coverage", "--junitxml", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    assert "OK: 0 new violation(s)" in out, out
    assert 'failures="0"' in (tmp_path / "j.xml").read_text()
    assert "BELOW FLOOR" not in out, "\n".join(line for line in out.splitlines() if line.startswith("BELOW FLOOR"))
    assert status == 0
    for situation in coverage.SITUATIONS:  # the table names every situation
        assert situation.name in out


def test_every_situation_names_checks_that_exist():
    assert len(coverage.BY_NAME) == len(coverage.SITUATIONS)
    for situation in coverage.SITUATIONS:
        assert situation.checks and situation.checks <= set(CHECKS), situation
        assert situation.floor >= 1


def test_situations_are_counted_per_case_from_the_model():
    """Guided steps that fill the host reach the situations they are built for, counted once per case."""
    machine = machine_for(LOCAL, check="tiers")
    with coverage.recording() as reach:
        for then in ("extend_and_backup", "cycle_host"):  # two cases
            state = machine()
            state.start()
            state.fill_host(keep_free=2, pages=4, then=then)
            state.teardown()
    tally = reach["tiers"]
    assert tally.cases["half the host pages in use"] == 2 < tally.calls["half the host pages in use"]
    assert tally.cases["Backup of a partly backed-up extent, host short of its pages"] == 1
    assert tally.cases["restore from host pages out of order"] == 1
    assert "core" not in reach


def test_shortfalls_name_the_situation_and_its_count():
    tally, floor = coverage.Tally(), coverage.BY_NAME["restart with a transfer in flight"].floor
    assert f"restart with a transfer in flight: 0 case(s), floor {floor}" in tally.shortfalls("restart")
    assert tally.shortfalls("nothing-like-a-check") == []


def test_guided_steps_reach_the_situations_of_the_last_survivors():
    """The steps built for the mutants that survived issue 17 reach their situations on the landed runtime."""
    reached = {}
    for check, step, kwargs in (
        ("tiers", "end_pages_under_restore", {"i": 0, "drop": True}),
        ("ordering", "hit_two_evicted", {"i": 0, "n": 1}),
        ("core", "pipeline", {"i": 0, "n": 3, "how": "close_intent_under_newer"}),
        ("core", "plain_plan_errors", {"i": 0}),
    ):
        machine = machine_for(LOCAL, check=check)
        with coverage.recording() as reach:
            state = machine()
            state.start(0)
            state.schedule_step(picks=[0], n=5, insert=True)  # no live request: one opens
            state.schedule_step(picks=[0], n=5, insert=True)  # it computes and publishes two pages
            getattr(state, step)(**kwargs)
            state.teardown()
        reached[step] = set(reach[check].cases)
    assert "page name ends while a restore reads its host copy" in reached["end_pages_under_restore"]
    assert "compute over two restores in flight" in reached["hit_two_evicted"]
    assert "Close intent on a request a later batch holds" in reached["pipeline"]
    assert "publish of a negative first page" in reached["plain_plan_errors"]


def test_guided_steps_reach_the_situations_of_the_situation_survivors():
    """The steps built for the last survivors of the situation mutants reach their situations on the landed runtime."""
    for check, step, kwargs, situation in (
        ("core", "forge_live_handle", {"i": 0, "how": "generation_ahead", "operation": "retain"}, "request handle a generation ahead of its slot"),
        ("core", "forge_live_handle", {"i": 0, "how": "runs_cut", "operation": "release"}, "a real extent's pages cut into other runs"),
        ("core", "forge_live_handle", {"i": 0, "how": "runs_rotated", "operation": "retain"}, "a real extent's whole runs in another order"),
        ("tiers", "move_part_of_overlap", {"i": 0, "how": "demote_half_backed"}, "Demote of an extent whose first page alone is on the host"),
        ("tiers", "move_part_of_overlap", {"i": 1, "how": "drop_half_resident"}, "Drop of an extent whose first page alone is on the device"),
        ("tiers", "fill_host", {"keep_free": 2, "pages": 4, "then": "backup_in_plan"}, "OutOfPages(L2) from a plan's Backup"),
        ("restart", "retain_reissued_ref", {"i": 0}, "retain of an old epoch's ref reissued"),
    ):
        machine = machine_for(LOCAL, check=check)
        with coverage.recording() as reach:
            state = machine()
            state.start(0)
            state.schedule_step(picks=[0], n=5, insert=True)
            state.schedule_step(picks=[0], n=5, insert=True)
            getattr(state, step)(**kwargs)
            state.teardown()
        assert reach[check].cases[situation] == 1, (step, kwargs)
