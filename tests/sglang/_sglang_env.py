"""Where the SGLang environment is, and whether this python can import SGLang."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ADAPTER_DIR = REPO / "conformance" / "adapters" / "sglang"
VENV_PYTHON = REPO / ".venv-sglang" / "bin" / "python"


def _have_sglang() -> bool:
    # Not find_spec("sglang"): under pytest, tests/ is on sys.path and this folder,
    # tests/sglang, would pass for a namespace package of that name.
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    spec = importlib.util.find_spec("sglang")
    return spec is not None and spec.origin is not None


HAVE_SGLANG = _have_sglang()

if HAVE_SGLANG:
    for extra in (str(ADAPTER_DIR / "stubs"), str(REPO)):
        if extra not in sys.path:
            sys.path.append(extra)  # torchvision import-only stub; REPO for conformance.adapters.sglang
    os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "0")

SKIP_REASON = (
    "SGLang is not importable in this python: run conformance/adapters/sglang/install.sh, "
    "then .venv-sglang/bin/python -m pytest tests/sglang (test_venv.py does it for you)"
)
