"""Runtime tests run on CPU everywhere and, where a GPU is present, on CUDA too.

A test (or a `device` parameter) marked `cuda` needs a CUDA device: without one it is
skipped here, because the hardware is missing, not because the work is.
"""

import pytest
import torch
from runtimekit import new_twin

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and item.path.is_relative_to(config.rootpath / "tests" / "runtime"):
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each test that takes `device` runs on CPU and (marked `cuda`) on CUDA."""
    return request.param


@pytest.fixture
def twin(device):
    """The runtime and the reference model driven by the same calls (`runtimekit.Twin`)."""
    t = new_twin(device)
    yield t
    t.runtime.close()
