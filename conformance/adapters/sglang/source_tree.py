"""Lay out the installed SGLang wheel as SGLang's repository lays it out, to test `--sglang-source`.

No source distribution of 0.5.23 is published, so the gate's source mode is tested on a
tree made from the wheel: `DIR/python/sglang/` holds the wheel's Python sources and its
compiled extensions (the Rust TreeCore's source is not in the wheel), `DIR/python/pyproject.toml`
a setuptools project with the wheel's name and version. That is what was tested, not an
upstream checkout.

    .venv-sglang/bin/python -m conformance.adapters.sglang.source_tree DIR
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
from pathlib import Path

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{version}"
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["sglang*"]

[tool.setuptools.package-data]
"*" = ["*.so", "*.json", "*.txt"]
"""


def make(target: Path) -> Path:
    """Copy the importable sglang package into `target/python/sglang` and write its pyproject.toml."""
    import sglang

    version = importlib.metadata.version("sglang")
    package = Path(sglang.__file__).resolve().parent
    python = target / "python"
    python.mkdir(parents=True, exist_ok=True)
    shutil.copytree(package, python / "sglang", ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    (python / "pyproject.toml").write_text(PYPROJECT.format(version=version))
    return target


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
