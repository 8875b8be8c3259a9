"""Configured runtimes by import path: `cacheruntime.runtime.factories:NAME`.

The conformance suite calls `conformance()` once per test case (a fresh runtime each
time); the main job and the tests call `local(...)`. `process` and `process_conformance`
are the same runtimes in a runtime process of their own (`ProcessGPURuntime`): this
module imports torch only inside the factories that build a `LocalGPURuntime` here, so
that control can name a process factory without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cacheruntime.runtime.local import LocalGPURuntime
    from cacheruntime.runtime.process import ProcessGPURuntime


def local(device: str = "cpu", **options: Any) -> LocalGPURuntime:
    """A `LocalGPURuntime` on `device` with the constructor's defaults, overridden by `options`."""
    from cacheruntime.runtime.local import LocalGPURuntime

    return LocalGPURuntime(device=device, **options)


def conformance_options() -> dict[str, Any]:
    """The conformance configuration, for building broken subclasses (mutants) of the same shape."""
    from cacheruntime.runtime.device.runner import DecoderConfig

    return {
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


def __getattr__(name: str) -> Any:
    """`CONFORMANCE_OPTIONS`, built (with torch) when first named."""
    if name == "CONFORMANCE_OPTIONS":
        return conformance_options()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from cacheruntime.runtime.local import LocalGPURuntime

    return LocalGPURuntime(device=device, **conformance_options(), **suite_streams(device))


def conformance_l3(host_mode: str = "resident", store: str = "file", l3: Any = None, streams: str = "simulated", device: str = "cpu") -> LocalGPURuntime:
    """The conformance configuration with an L3 store, in `host_mode` (resident or buffer_only).

    The storage check passes `l3`, the store it slows down and makes fail
    (`cacheruntime.conformance.storage.SuiteStore`, around a backend of the kind `store` names);
    the other checks, which pass none, get a fresh one of that kind here. `streams="threads"`
    is the same runtime on CPU worker threads, where the check also holds store writes in flight.
    """
    import weakref

    from cacheruntime.conformance.storage import SuiteStore
    from cacheruntime.runtime.local import LocalGPURuntime

    chosen = suite_streams(device) if streams == "simulated" else {"streams": streams}
    own = SuiteStore(store) if l3 is None else None
    runtime = LocalGPURuntime(device=device, **conformance_options(), **chosen, host_mode=host_mode, l3=l3 if own is None else own)
    if own is not None:  # a runtime leaves its store open (the store is the caller's): this one is ours, closed with the runtime
        weakref.finalize(runtime, own.close)
    return runtime


def conformance_threads() -> LocalGPURuntime:
    """The conformance configuration on CPU worker threads: interleavings the machine picks."""
    from cacheruntime.runtime.local import LocalGPURuntime

    return LocalGPURuntime(**conformance_options())


def traced(device: str = "cpu", **options: Any) -> LocalGPURuntime:
    """The runtime the runtime-trace check records (`cacheruntime tlc --runtime-traces`).

    Built with the check's geometry (page size 1, its pool and row sizes, passed in
    `options` with any others, which win), the tagging runner, and on CPU simulated
    streams whose schedule the check seeds per trace (`streams="threads"` for the machine's).
    """
    from cacheruntime.runtime.device.runner import DecoderConfig
    from cacheruntime.runtime.local import LocalGPURuntime

    defaults: dict[str, Any] = {"runtime_id": "local", "runner": "tagging", "config": DecoderConfig(vocab=100), **suite_streams(device)}
    return LocalGPURuntime(device=device, **{**defaults, **options})


def process(device: str = "cpu", **options: Any) -> ProcessGPURuntime:
    """`local(device, **options)` in a runtime process of its own, driven over ZeroMQ (no torch here)."""
    from cacheruntime.runtime.process import ProcessGPURuntime

    return ProcessGPURuntime("cacheruntime.runtime.factories:local", device=device, **options)


def process_conformance(device: str = "cpu") -> ProcessGPURuntime:
    """The conformance configuration (`conformance`) in a runtime process of its own: the suite's
    checks hold across the boundary, probe() and the test knobs travel over the link."""
    from cacheruntime.runtime.process import ProcessGPURuntime

    return ProcessGPURuntime("cacheruntime.runtime.factories:conformance", device=device)
