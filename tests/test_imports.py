"""The protocol, the model and the checkers' vocabulary import without torch (control needs none)."""

import subprocess
import sys

BLOCK_TORCH = "import sys; sys.modules['torch'] = None; "


def test_protocol_and_model_import_without_torch():
    code = BLOCK_TORCH + "import cacheruntime.protocol, cacheruntime.model, cacheruntime.invariants, cacheruntime.pageruns"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_is_really_blocked_by_the_check():
    code = BLOCK_TORCH + "import torch"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0
