"""Legal variants of `LocalGPURuntime`: each differs from it only where the contract leaves freedom.

The mutants (`cacheruntime.conformance.mutants`) are runtimes the suite must fail; these
are runtimes it must pass. Each takes one freedom spec/protocol.md §2.1 grants (how
values are numbered, which physical page a copy takes, when a completed transfer is
reported, in which legal order transfers complete, how many streams carry them, when a
finished transfer is completed) and every check it claims must pass:
`cacheruntime conformance --legal` prints the table, and
`tests/conformance/test_legal_variants.py` runs it in the CI profile.

The `l3_*` variants have an L3 store (§9) and claim the storage check only (`L3_CHECKS`):
their freedoms are the L3 tier's (which host page stages a persist or fetch, when its
completion is reported, in what order persists and fetches complete, how a persist's
objects reach the store), and the others' freedoms are the variants above. Without them
the storage check had no runtime it must pass but the landed one.

Every variant is the conformance configuration
(`cacheruntime.runtime.factories.CONFORMANCE_OPTIONS`) on the CPU, built only on the
runtime's public seams: its constructor options (`numbering`, `free_order`, `reporting`,
`d2h_bytes_per_batch`, `d2h_issue`, `host_mode`, `l3`), its public parts (the ledger's
`allocator`, the device layer's `h2d` and `d2h` streams and the storage side's `stream`,
replaced by `Lanes`), the store the storage check gives it (seen through
`OnePutPerObject`), and public operations and properties of a subclass (`capabilities`,
the freeing calls). None overrides a private method.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import torch

from cacheruntime.conformance.storage import SuiteStore
from cacheruntime.conformance.target import Target
from cacheruntime.protocol import CacheExtentRef, Capability, PreparedBatchHandle, RequestRuntimeHandle, RuntimeInfo
from cacheruntime.runtime.device.deadstreams import StreamDead
from cacheruntime.runtime.device.streams import Event, Stream, make_stream
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS, suite_streams
from cacheruntime.runtime.ledger import Numbering
from cacheruntime.runtime.local import LocalGPURuntime
from cacheruntime.storage import KeyResult, Store

#: Another numbering of page names and ids: other first values, and gaps between values.
RENUMBERED = Numbering(first_page=100, first_extent=7, first_batch=40, first_transfer=9, stride=3)


class Lanes:
    """One transfer stream made of several lanes: each transfer's work goes to the next lane, round robin.

    The device layer issues a transfer as its waits, the delay knob's sleep, the copy, and
    then `record()` of the event that marks it done, so `record` ends one transfer's work
    on the current lane and moves on to the next. Transfers on different lanes run
    concurrently and complete in whatever order their events allow: each still waits
    for every event it is told to (the backup filling its source, compute), so every
    order is a legal one. `lag` holds the first lane that many seconds before each of its
    transfers, so that a later transfer on another lane usually completes first.
    """

    def __init__(self, streams: list[Stream], lag: float = 0.0):
        self.streams = streams
        self.lag = lag
        self.current = 0
        self._hold()

    def _hold(self) -> None:
        if self.lag and self.current == 0:
            self.streams[0].sleep(self.lag)

    def submit(self, fn: Callable[[], Any]) -> Any:
        return self.streams[self.current].submit(fn)

    def wait(self, event: Any) -> None:
        self.streams[self.current].wait(event)

    def sleep(self, seconds: float) -> None:
        self.streams[self.current].sleep(seconds)

    def record(self) -> Event:
        """The event after the current transfer's work; the next transfer goes to the next lane."""
        event = self.streams[self.current].record()
        self.current = (self.current + 1) % len(self.streams)
        self._hold()
        return event

    def synchronize(self) -> None:
        for stream in self.streams:
            stream.synchronize()

    @property
    def alive(self) -> bool:
        """Every lane's worker still runs (a dead lane is a dead stream: RuntimeFault)."""
        return all(stream.alive for stream in self.streams)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


def _close(streams: list[Stream]) -> None:
    for stream in streams:
        stream.close()


class _Variant(LocalGPURuntime):
    """The conformance runtime with the constructor options and streams a variant names."""

    options: ClassVar[dict[str, Any]] = {}
    h2d_lanes = 1
    d2h_lanes = 1
    storage_lanes = 1
    lag = 0.0

    def __init__(self, device: str = "cpu", **options: Any):
        super().__init__(device=device, **{**CONFORMANCE_OPTIONS, **suite_streams(device), **self.options, **options})
        self._stop_lanes = weakref.finalize(self, _close, [])
        self._add_lanes()

    def _streams(self) -> list[tuple[Any, str, str, torch.device, int]]:
        """Each transfer stream as (its owner, its attribute, its name, its device, the lanes it becomes): the
        device layer's H2D and D2H streams, and with L3 the storage worker's host queue (`L3Moves.stream`)."""
        layer = self.device_layer
        streams: list[tuple[Any, str, str, torch.device, int]] = [
            (layer, "h2d", "h2d", layer.device, self.h2d_lanes),
            (layer, "d2h", "d2h", layer.device, self.d2h_lanes),
        ]
        if layer.l3 is not None:
            streams.append((layer.l3, "stream", "storage", torch.device("cpu"), self.storage_lanes))
        return streams

    def _add_lanes(self) -> None:
        """Make the transfer streams lanes; the device layer stops the streams it made, the extra lanes stop with the runtime."""
        layer, extra = self.device_layer, []
        for owner, attribute, name, device, count in self._streams():
            if count > 1:
                lanes = [getattr(owner, attribute)] + [make_stream(f"{name}-{i}", device, schedule=layer.schedule) for i in range(1, count)]
                extra += lanes[1:]
                setattr(owner, attribute, Lanes(lanes, self.lag))
        self._stop_lanes()
        self._stop_lanes = weakref.finalize(self, _close, extra)

    def restart(self) -> RuntimeInfo:
        """After RuntimeLost the device layer makes new streams (`replace_streams`): they become lanes again."""
        streams = [getattr(owner, attribute) for owner, attribute, *_ in self._streams()]
        info = super().restart()
        if [getattr(owner, attribute) for owner, attribute, *_ in self._streams()] != streams:
            self._add_lanes()
        return info

    def close(self) -> None:
        super().close()
        self._stop_lanes()


class Lifo(_Variant):
    """A new copy takes the physical page freed last (§2.1: placement is the runtime's)."""

    options: ClassVar[dict[str, Any]] = {"free_order": "lifo"}


class RandomFree(_Variant):
    """A new copy takes a random free physical page (§2.1: placement is the runtime's)."""

    options: ClassVar[dict[str, Any]] = {"free_order": "random", "seed": 7}


class Renumbered(_Variant):
    """Page names from 100, extents from 7, batches from 40, transfers from 9, each step 3 (§2.1: numbering)."""

    options: ClassVar[dict[str, Any]] = {"numbering": RENUMBERED}


class NextPoll(_Variant):
    """A completed transfer is reported one poll later than it could be (§5: reporting is the runtime's)."""

    options: ClassVar[dict[str, Any]] = {"reporting": "next_poll"}


class AtWait(_Variant):
    """Completed transfers are reported only by `wait_completions`; polls report nothing (§5)."""

    options: ClassVar[dict[str, Any]] = {"reporting": "at_wait"}


class RestoresOutOfOrder(_Variant):
    """Restores on two H2D lanes, the first held 4 ms per transfer: later restores complete first (§5: legal orders)."""

    h2d_lanes = 2
    lag = 0.004


class MoreStreams(_Variant):
    """Three H2D and two D2H lanes; backups copied one page per piece, each issued after the batch's outputs (§5)."""

    options: ClassVar[dict[str, Any]] = {"d2h_bytes_per_batch": 1, "d2h_issue": "after_outputs"}
    h2d_lanes = 3
    d2h_lanes = 2


class EagerFree(_Variant):
    """Completes every transfer whose device work is done before a call that frees pages (close, release,
    cancel), so it never defers a free it can do at once (§5: completion timing is the runtime's)."""

    def complete_finished(self, operation: str) -> None:
        """Complete (or fail), in the ledger, the transfers the device has finished (their effects take place now)."""
        self.check_machinery(operation)
        ledger = self.ledger
        if ledger.state.transfers:
            try:
                landed, failed, failures = self.device_layer.done(list(ledger.state.transfers))
            except StreamDead as dead:
                fault = self.machinery_fault(dead)
                assert fault is not None
                raise fault from dead
            ledger.complete_in_order(landed, failed, failures)  # an L3 transfer fails with its own outcome (MISS, STORE)

    def close_request(self, request: RequestRuntimeHandle) -> None:
        self.complete_finished("close_request")
        super().close_request(request)

    def release(self, extent: CacheExtentRef) -> None:
        self.complete_finished("release")
        super().release(extent)

    def cancel_batch(self, batch: PreparedBatchHandle) -> None:
        self.complete_finished("cancel_batch")
        super().cancel_batch(batch)


class Opaque(_Variant):
    """Claims no INTROSPECTION, numbers its own way and takes pages last-freed-first: the suite learns the
    renaming from returned values alone (§2.1; capabilities are the runtime's claim)."""

    options: ClassVar[dict[str, Any]] = {"numbering": RENUMBERED, "free_order": "lifo"}

    @property
    def capabilities(self) -> frozenset[Capability]:
        return super().capabilities - {Capability.INTROSPECTION}


class Combined(EagerFree):
    """Every freedom at once: renumbered, random placement, reports one poll late, restores out of order, eager frees."""

    options: ClassVar[dict[str, Any]] = {"numbering": RENUMBERED, "reporting": "next_poll", "free_order": "random", "seed": 3}
    h2d_lanes = 2
    lag = 0.004


class OnePutPerObject:
    """The store the runtime was given, but a put of several objects goes to it one object per put, the
    last key first: the contract fixes what a persist's completion and failure mean (§9.3), not in what
    order or in how many calls its objects reach the store. Every other call passes through as it is."""

    def __init__(self, inner: Store):
        self.inner = inner
        self.name = f"one-put-per-object({inner.name})"

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        answers = {i: self.inner.put((keys[i],), (sources[i],))[0] for i in reversed(range(len(keys)))}
        return tuple(answers[i] for i in range(len(keys)))

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        return self.inner.get(keys, targets)

    def exists(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        return self.inner.exists(keys)

    def remove(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        return self.inner.remove(keys)

    def close(self) -> None:
        self.inner.close()


class _L3Variant(_Variant):
    """A variant with an L3 store (its host mode among its `options`): the store the storage check gives it
    (`l3=`, seen through `one_put_per_object` where the variant says so), else a suite store of its own."""

    one_put_per_object = False

    def __init__(self, device: str = "cpu", store: str = "file", l3: Store | None = None, **options: Any):
        own = SuiteStore(store) if l3 is None else None
        given: Store = own if own is not None else l3  # type: ignore[assignment]
        super().__init__(device=device, l3=OnePutPerObject(given) if self.one_put_per_object else given, **options)
        if own is not None:  # a runtime leaves its store open (the store is the caller's): this one is ours
            weakref.finalize(self, own.close)


class L3LifoStaging(_L3Variant):
    """buffer_only L3: staging host pages taken last-freed-first, completions reported one poll late (§2.1 placement, §5.2)."""

    options: ClassVar[dict[str, Any]] = {"host_mode": "buffer_only", "free_order": "lifo", "reporting": "next_poll"}


class L3StoreLanes(_L3Variant):
    """resident L3: two storage lanes, the first held 4 ms per step (persists and fetches complete out of
    order), a persist's objects put one per call, last first; completions reported only at wait (§5, §9.3)."""

    options: ClassVar[dict[str, Any]] = {"host_mode": "resident", "reporting": "at_wait"}
    storage_lanes = 2
    lag = 0.004
    one_put_per_object = True


class L3Combined(_L3Variant, EagerFree):
    """buffer_only L3 with every freedom: renumbered, random staging, two storage and two H2D lanes, objects
    put one per call, reports one poll late, eager frees."""

    options: ClassVar[dict[str, Any]] = {"host_mode": "buffer_only", "numbering": RENUMBERED, "reporting": "next_poll", "free_order": "random", "seed": 5}
    h2d_lanes = 2
    storage_lanes = 2
    lag = 0.004
    one_put_per_object = True


_CLASSES: dict[str, type[_Variant]] = {
    "lifo": Lifo,
    "random_free": RandomFree,
    "renumbered": Renumbered,
    "next_poll": NextPoll,
    "at_wait": AtWait,
    "restores_out_of_order": RestoresOutOfOrder,
    "more_streams": MoreStreams,
    "eager_free": EagerFree,
    "opaque": Opaque,
    "combined": Combined,
    "l3_lifo_staging": L3LifoStaging,
    "l3_store_lanes": L3StoreLanes,
    "l3_combined": L3Combined,
}


@attrs.frozen
class Variant:
    """A legal runtime: its name, the freedom it takes, and the checks it claims to pass."""

    name: str
    how: str
    checks: tuple[str, ...] = ("core", "tiers", "restart", "ordering", "faults")

    @property
    def target(self) -> Target:
        """The factory target that builds this variant."""
        return Target("cacheruntime.conformance.variants:build", (("name", self.name),))


#: The checks a variant with L3 claims: its freedoms are the L3 tier's; the others are the variants above.
L3_CHECKS = ("storage",)

VARIANTS: dict[str, Variant] = {
    name: Variant(name, " ".join((cls.__doc__ or "").split()), *((L3_CHECKS,) if issubclass(cls, _L3Variant) else ())) for name, cls in _CLASSES.items()
}


def build(name: str, **options: Any) -> LocalGPURuntime:
    """Factory: a fresh instance of variant `name` ("lifo", "renumbered", ...)."""
    return _CLASSES[name](**options)
