"""Configured `LocalGPURuntime`s by import path: `cacheruntime.runtime.factories:NAME`.

The conformance suite calls `conformance()` once per test case (a fresh runtime each
time); the main job and the tests call `local(...)`.
"""

from __future__ import annotations

from typing import Any

from cacheruntime.runtime.device.runner import DecoderConfig
from cacheruntime.runtime.local import LocalGPURuntime


def local(device: str = "cpu", **options: Any) -> LocalGPURuntime:
    """A `LocalGPURuntime` on `device` with the constructor's defaults, overridden by `options`."""
    return LocalGPURuntime(device=device, **options)


#: The conformance configuration, for building broken subclasses (mutants) of the same shape.
CONFORMANCE_OPTIONS: dict[str, Any] = {
    "runtime_id": "local",
    "page_size": 2,
    "max_requests": 4,
    "max_request_tokens": 32,
    "l1_pages": 12,
    "l2_pages": 24,
    "runner": "tagging",
    # The tagging runner reads no token ids, so its vocabulary is only what info() reports:
    # 100 holds every token id the conformance suite's plans carry (0 .. 99).
    "config": DecoderConfig(vocab=100),
}


def suite_streams(device: str) -> dict[str, Any]:
    """The streams the suite's runtimes run on: simulated on CPU, CUDA's own on a GPU.

    On simulated streams the suite draws each case's interleaving (SCHEDULE_SEED), so what a
    case meets, and so the verdict and its reach, are the same on every machine and load.
    `conformance_threads` is the same runtime on CPU worker threads, as it serves.
    """
    return {"streams": "simulated"} if device == "cpu" else {}


def conformance(device: str = "cpu") -> LocalGPURuntime:
    """A small tagged runtime: tiny pools so that out-of-pages, deferral and reuse happen quickly.

    TAGGED_COMPUTE lets the suite compare next tokens with the model's digests, so a stale
    KV read anywhere shows as a mismatch, not just as a wrong abstract state.
    """
    return LocalGPURuntime(device=device, **CONFORMANCE_OPTIONS, **suite_streams(device))


def conformance_threads() -> LocalGPURuntime:
    """The conformance configuration on CPU worker threads: interleavings the machine picks."""
    return LocalGPURuntime(**CONFORMANCE_OPTIONS)


def traced(device: str = "cpu", **options: Any) -> LocalGPURuntime:
    """The runtime the runtime-trace check records (`cacheruntime tlc --runtime-traces`).

    Built with the check's geometry (page size 1, its pool and row sizes, passed in
    `options` with any others, which win), the tagging runner, and on CPU simulated
    streams whose schedule the check seeds per trace (`streams="threads"` for the machine's).
    """
    defaults: dict[str, Any] = {"runtime_id": "local", "runner": "tagging", "config": DecoderConfig(vocab=100), **suite_streams(device)}
    return LocalGPURuntime(device=device, **{**defaults, **options})
