"""`streams.on_stream` switches streams as `torch.cuda.stream` does, per thread (CUDA only)."""

from __future__ import annotations

import threading

import pytest
import torch

from cacheruntime.runtime.device.streams import current_cuda_stream, on_stream

pytestmark = pytest.mark.cuda


def test_on_stream_sets_and_restores_the_current_stream():
    side, other = torch.cuda.Stream(), torch.cuda.Stream()
    before = torch.cuda.current_stream()
    with on_stream(side):
        assert torch.cuda.current_stream() == side
        assert current_cuda_stream(side.device_index) == side
        with on_stream(other):
            assert torch.cuda.current_stream() == other
        assert torch.cuda.current_stream() == side
    assert torch.cuda.current_stream() == before


def test_on_stream_restores_each_threads_own_stream_when_uses_interleave():
    """Thread A enters, thread B enters (from its own stream), A leaves, B leaves: each is back where it was."""
    shared, b_home = torch.cuda.Stream(), torch.cuda.Stream()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    after: dict[str, torch.cuda.Stream] = {}
    before: dict[str, torch.cuda.Stream] = {}

    def thread_a() -> None:
        before["a"] = torch.cuda.current_stream()
        with on_stream(shared):
            a_in.set()
            b_in.wait()
        after["a"] = torch.cuda.current_stream()
        a_out.set()

    def thread_b() -> None:
        with torch.cuda.stream(b_home):
            a_in.wait()
            with on_stream(shared):
                b_in.set()
                a_out.wait()
            after["b"] = torch.cuda.current_stream()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert after["a"] == before["a"]
    assert after["b"] == b_home
