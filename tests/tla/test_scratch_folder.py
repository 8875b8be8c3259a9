"""Every way the project starts TLC gives it a scratch folder of its own.

SANY copies the standard modules out of tla2tools.jar into java.io.tmpdir and deletes them when
the JVM exits, so TLCs sharing one folder race: a CI run on 2026-12-04 failed with "Cannot find
source file for module Integers" when pytest's two workers ran TLC at once. The race itself is
timing; its outcome is not: here the shared folder is one that does not exist (what another JVM's
exit leaves behind, at worst), set through JDK_JAVA_OPTIONS, which a command line's own
-Djava.io.tmpdir overrides. Each entry point must still parse and check its module.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cacheruntime import runtimetrace, specmutants, tlatrace, tlc
from cacheruntime.runtime import factories
from cacheruntime.tlatools import tlc_java

try:
    JAVA, JAR = tlc.find_java(), tlc.find_jar()
except tlc.ToolMissing as missing:  # pragma: no cover - depends on the machine
    pytest.skip(str(missing), allow_module_level=True)


@pytest.fixture(autouse=True)
def shared_folder_gone(monkeypatch, tmp_path):
    monkeypatch.setenv("JDK_JAVA_OPTIONS", f"-Djava.io.tmpdir={tmp_path / 'gone'}")


def test_the_shared_folder_gone_breaks_a_tlc_without_its_own(tmp_path):
    """The setting reproduces the CI failure: a TLC started without tlc_java's folder cannot parse."""

    def tlc_in(work: Path, java_command: list[str]) -> subprocess.CompletedProcess[str]:
        work.mkdir()
        (work / "Plain.tla").write_text("---- MODULE Plain ----\nEXTENDS Integers\nVARIABLE x\nInit == x = 0\nNext == x' = x\n====\n")
        (work / "Plain.cfg").write_text("INIT Init\nNEXT Next\n")
        return subprocess.run([*java_command, "-metadir", str(work / "states"), "-config", "Plain.cfg", "Plain.tla"], cwd=work, capture_output=True, text=True)

    shared = tlc_in(tmp_path / "shared", [JAVA, "-cp", str(JAR), "tlc2.TLC"])
    assert shared.returncode != 0 and "Integers.tla" in shared.stdout + shared.stderr, shared.stdout + shared.stderr
    own = tlc_in(tmp_path / "own", tlc_java(JAVA, JAR, tmp_path / "own"))
    assert own.returncode == 0, own.stdout + own.stderr


def test_a_manifest_model():
    model = next(m for m in tlc.load_manifest()["models"] if m["name"] == "liveness")
    outcome = tlc.run_model(model, workers=1, java=JAVA, jar=JAR)
    assert (outcome.got, outcome.distinct) == ("pass", model["distinct_states"])


def test_the_model_trace_check():
    result = tlatrace.validate([tlatrace.random_trace(seed, 6) for seed in range(3)], java=JAVA, jar=str(JAR))
    assert result.ok, result.output[-2000:]


def test_the_runtime_trace_check():
    traces = runtimetrace.record_many(factories.traced, runtimetrace.DEFAULT_RUNTIME, 2, 6, 0)
    result = runtimetrace.validate(traces, workers=1, java=JAVA, jar=str(JAR))
    assert result.ok, result.error or "\n".join(result.rejected)


def test_a_spec_mutant_run():
    spec = (tlc.TLA_DIR / "CacheRuntime.tla").read_text()
    got, distinct, _, out = specmutants.run_tlc(spec, tlc.TLA_DIR / "MCLive.cfg", java=JAVA, jar=JAR, workers=1)
    assert got == "pass", out[-2000:]
