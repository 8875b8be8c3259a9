"""Tests against SGLang's real cache classes; they need the SGLang environment.

`conformance/adapters/sglang/install.sh` builds it in `.venv-sglang/`. Under that venv's
python these tests import SGLang directly; under any other python they skip with the
reason, and `test_venv.py` re-runs this folder under the venv's python when the venv
exists (so the main test run covers it once the venv is installed).
"""

from __future__ import annotations

import pytest
from _sglang_env import HAVE_SGLANG, SKIP_REASON


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_sglang: needs SGLang importable (the .venv-sglang python)")


def pytest_collection_modifyitems(config, items):
    if HAVE_SGLANG:
        return
    marker = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "needs_sglang" in item.keywords:
            item.add_marker(marker)
