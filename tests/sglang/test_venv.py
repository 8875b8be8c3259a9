"""Run tests/sglang under the SGLang venv's python when the venv exists (else skip)."""

from __future__ import annotations

import subprocess

import pytest
from _sglang_env import HAVE_SGLANG, REPO, VENV_PYTHON


@pytest.mark.skipif(HAVE_SGLANG, reason="already running under a python that has SGLang")
@pytest.mark.skipif(
    not VENV_PYTHON.exists(),
    reason="no .venv-sglang: run conformance/adapters/sglang/install.sh to enable the SGLang tests",
)
def test_sglang_suite_in_its_venv():
    proc = subprocess.run(
        [str(VENV_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/sglang"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
