"""The conformance suite holds ProcessGPURuntime to the model: every check, across the process boundary.

`process_conformance` is the conformance configuration in a runtime process: probe()
(INTROSPECTION), the delay knob, the schedule seed and fault injection travel over the
link, so every check runs as it does on `conformance`. The CI run draws fewer cases per
check than the `ci` profile (each case forks a runtime process); the full profile is the
command `cacheruntime conformance --runtime cacheruntime.runtime.factories:process_conformance`
(docs/process-runtime.md gives its time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("core", "tiers", "restart", "ordering", "faults")


def test_every_check_passes_on_the_process_runtime():
    argv = ["conformance", "--runtime", "cacheruntime.runtime.factories:process_conformance", "--max-examples", "6", "--no-shrink"]
    code = "import sys; from cacheruntime.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *argv], env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines() if line.split()[:1] and line.split()[0] in CHECKS}
    assert verdicts == dict.fromkeys(CHECKS, "passed"), done.stdout
