"""The landed runtime on its CPU worker threads passes the checks whose steps race.

The suite's factory runs `LocalGPURuntime` on simulated streams, so that its reach is the
same on every machine. The worker threads it serves on are checked here too, in the
restart and ordering checks, where the machine's clock picks the interleavings. Only the
verdict is asserted (25 cases per check): what these runs reach depends on the machine's load.
"""

from cacheruntime.cli import main

THREADS = "cacheruntime.runtime.factories:conformance_threads"


def test_thread_streams_pass_the_restart_and_ordering_checks(capsys):
    status = main(["conformance", "--runtime", THREADS, "--check", "restart", "--check", "ordering", "--max-examples", "25"])
    out = capsys.readouterr().out
    assert status == 0 and "OK: 0 new violation(s)" in out, out
    assert "applied: interleavings drawn per case" not in out  # threads claim no SCHEDULE_SEED
