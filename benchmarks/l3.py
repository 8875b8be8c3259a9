"""L3: the runtime's fetch and persist through a store, against raw I/O of the same bytes on the same store.

Run with `--only l3` (an opt-in section). For each store in `--l3-stores` (`file`: a
`FileStore` in `--l3-dir`, default a temporary directory; `mooncake`: a `LocalMooncake`
cluster on loopback started for the section, where the [mooncake] extra is installed), on a
runtime in `buffer_only` host mode (host pages only stage between the device and L3, §9.1):

- **fetch**: `prepare_batch` of a plan whose item fetches `l3_mib` worth of page objects
  (`Fetch`: store -> staging -> device), its completion polled, from the prepare until the
  FETCH completion is reported; against a raw read of the same objects in the same run (the
  file store: a plain `open` + `readinto` + `close` of each object's file into a host page
  buffer, the floor any file store pays; Mooncake: the store's own batched `get`). The file
  store is measured warm (the files just read) and cold (each file dropped from the page cache
  with `posix_fadvise(DONTNEED)` before each side, as `benchmarks/diagnostics/filestore.py`
  does: no root needed, nothing else touched; the VM's host may still cache the bytes, so a
  cold figure may be better than the disk's). Both sides alternate in each repetition; the
  median of `--reps`. Target (file store): ratio >= 0.90. The fetch's two steps are also timed
  apart (the store's get alone, the staging -> device copy alone), in the row's name and
  details: where the time goes. Also the host time `prepare_batch`
  blocked issuing the fetch, against the fetch's time (a fetch started at prepare must not
  hold the host: <= 5%).
- **persist**: `submit((Persist(extent, keys),))` + `wait_completions()` of an extent on the
  device (buffer_only: a D2H into staging after the compute that wrote it, then the store
  write), fresh keys each repetition; against a raw write of the same bytes from a host buffer
  (plain `open` + `write` + `close` of new files in the store's directory; Mooncake: the
  store's own `put`). Writes land in the page cache (the store's default, `fsync=False`). No
  target: the ratio is what the staging copy and the store's temporary-file-and-rename cost.
- **exposed**: decode steps (the bench model, as the overlap section's) that each admit one
  request whose prefix of `l3_step_pages` pages is (a) attached from L1, no L3 traffic: step
  time `Tc`; (b) fetched from the store by a `Fetch` in the plan, prepared one step ahead
  (two-phase): `Tf`; (c) attached from L1 while each plan also persists an extent of the same
  size under fresh keys: `Tp`. The compute is the same in all three. With the transfer alone
  (`Tx`: fetch or persist on an idle runtime), the exposed fraction is (T - Tc) / Tx: how
  much of the store I/O lands on the compute's critical path. Measured from step times (host
  clock) on CPU and CUDA alike, so it also sees host time the issue costs. Target: exposed
  <= 5%, printed as the step-time ratio's bound 1 + 0.05 * Tx / Tc. A fetch prepared one step
  ahead has one step to land before the batch that reads it computes, so the default size
  (16 objects of 2 MiB on the full run) keeps Tx below Tc, printed as transfer/compute: a
  fetch longer than a step is on the critical path by construction, whatever the runtime does.

The object size (the KV page's bytes at `--l3-page-size` tokens) is in every row's name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks import hooks
from benchmarks.decode import Decode, timed
from benchmarks.harness import Clock, NullRunner, close_runtime, make_runtime, median, steady_gc
from benchmarks.report import Row
from cacheruntime.protocol import BatchItem, BatchPlan, Close, Fetch, Persist, Tier, TransferKind
from cacheruntime.storage import FileStore, Status, Store

SECTION = "l3"
FLOOR = 1e-3
#: seconds between two polls while a fetch is in flight (its completion is polled, never waited for)
POLL_SECONDS = 2e-4
TARGET_FETCH = 0.90
TARGET_EXPOSED = 0.05


def run(args: Any, device: torch.device, rows: list[Row], guard: Any) -> None:
    base = Path(args.l3_dir) if args.l3_dir else Path(tempfile.mkdtemp(prefix="l3-bench-"))
    for kind in args.l3_stores:
        with guard(SECTION, f"store={kind}"), _store(kind, base, args) as store:
            _throughput(args, device, rows, guard, kind, store)
            _exposed(args, device, rows, guard, kind, store)
    if not args.l3_dir:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _store(kind: str, base: Path, args: Any) -> Iterator[Store]:
    """The store under test: a FileStore in a fresh folder under `base` (removed after), or a
    Mooncake cluster on loopback sized for the section (stopped after)."""
    if kind == "file":
        root = base / f"objects-{uuid.uuid4().hex[:8]}"
        try:
            yield FileStore(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    if kind != "mooncake":
        raise ValueError(f"unknown L3 store {kind!r}: choose file or mooncake")
    if importlib.util.find_spec("mooncake") is None:
        raise ImportError("--l3-stores mooncake needs the [mooncake] extra: pip install 'cacheruntime[mooncake]'")
    from cacheruntime.storage.master import LocalMooncake
    from cacheruntime.storage.mooncake import MooncakeStore

    segment = 4 * (args.l3_mib << 20) + 2 * (args.steps + 8) * args.l3_step_pages * _page_bytes(args, args.overlap_page_size) + (64 << 20)
    with LocalMooncake(base / f"mooncake-{uuid.uuid4().hex[:8]}", segment_bytes=segment) as cluster:
        store = MooncakeStore(cluster.config())
        try:
            yield store
        finally:
            store.close()


def _page_bytes(args: Any, page_size: int) -> int:
    """The bytes of one KV page (one object) at `page_size` tokens in the bench's KV shape."""
    return args.layers * 2 * page_size * args.kv_heads * args.head_dim * torch.empty((), dtype=getattr(torch, args.dtype)).element_size()


def _keys(count: int) -> tuple[str, ...]:
    """Fresh object keys (so a persist really writes: a stored key answers STORED without writing)."""
    tag = uuid.uuid4().hex[:12]
    return tuple(f"bench-{tag}-{i:06d}" for i in range(count))


def drop_cache(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (`posix_fadvise(DONTNEED)`; the VM's host may still cache them)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _host_pages(count: int, page_bytes: int, device: torch.device) -> list[Any]:
    """`count` host page buffers (pinned on CUDA, as staging is), as writable byte arrays."""
    block = torch.zeros(count, page_bytes, dtype=torch.uint8)
    if device.type == "cuda":
        block = block.pin_memory()
    return [block[i].numpy() for i in range(count)]


def _object_size(page_bytes: int) -> str:
    return f"{page_bytes >> 10} KiB objects" if page_bytes < 1 << 20 else f"{page_bytes / (1 << 20):g} MiB objects"


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


# -- fetch and persist throughput ---------------------------------------------------------


def _throughput(args: Any, device: torch.device, rows: list[Row], guard: Any, kind: str, store: Store) -> None:
    ps = args.l3_page_size
    page_bytes = _page_bytes(args, ps)
    pages = max(1, (args.l3_mib << 20) // page_bytes)
    nbytes = pages * page_bytes
    rt = make_runtime(
        args,
        device,
        NullRunner(device),
        page_size=ps,
        max_requests=2,
        max_request_tokens=(pages + 1) * ps,
        l1_pages=2 * pages + 4,
        l2_pages=pages + 2,
        l3=store,
        host_mode="buffer_only",
    )
    try:
        request = rt.open_request()
        rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1,) * (pages * ps)),))))
        extent = rt.publish(request, 0, pages)
        rt.close_request(request)
        detail = {"store": kind, "host_mode": "buffer_only", "page_size": ps, "object_bytes": page_bytes, "objects": pages, "bytes": nbytes}
        label = f"{kind} store, {pages} x {_object_size(page_bytes)}"
        with guard(SECTION, f"persist {label}"):
            _persist_rows(args, device, rows, rt, store, kind, extent, pages, page_bytes, label, detail)
        keys = _keys(pages)
        rt.submit((Persist(extent, keys),))
        failed = [done for done in rt.wait_completions() if done.failure is not None]
        if failed:
            raise RuntimeError(f"the {kind} store failed the persist the fetches read: {failed}")
        for cache in ("warm", "cold") if kind == "file" else ("memory",):
            with guard(SECTION, f"fetch {label} {cache}"):
                _fetch_rows(args, device, rows, rt, store, kind, keys, page_bytes, cache, label, detail)
        rt.release(extent)
        rt.wait_completions()
    finally:
        close_runtime(rt)


def _runtime_fetch(rt: Any, keys: tuple[str, ...]) -> tuple[float, float]:
    """One fetch of `keys` through the protocol: (seconds from prepare to its reported completion, seconds prepare_batch held the host)."""
    request = rt.open_request()
    t0 = time.perf_counter()
    handle = rt.prepare_batch(BatchPlan((BatchItem(request, (1,)),), (Fetch(request, keys),)))
    prepared = time.perf_counter() - t0
    while True:
        done = [c for c in rt.poll_completions() if c.ticket.kind is TransferKind.FETCH]
        if done:
            break
        time.sleep(POLL_SECONDS)
    seconds = time.perf_counter() - t0
    if done[0].failure is not None:
        raise RuntimeError(f"the fetch failed: {done[0].failure}")
    rt.cancel_batch(handle)
    rt.close_request(request)
    rt.wait_completions()
    return seconds, prepared


def _raw_read(store: Store, kind: str, keys: tuple[str, ...], buffers: list[Any]) -> Callable[[], None]:
    """The raw read of the same objects: plain open/readinto/close of each file, or the store's own get."""
    if kind == "file":
        root = store.root  # type: ignore[attr-defined]

        def read() -> None:
            for key, buffer in zip(keys, buffers):
                with open(root / key, "rb", buffering=0) as file:
                    if file.readinto(buffer) != len(buffer):
                        raise RuntimeError(f"short read of {key}")

        return read

    def get() -> None:
        results = store.get(keys, buffers)
        if not all(r.status is Status.HIT for r in results):
            raise RuntimeError(f"the raw get did not hit every object: {[r.status.name for r in results]}")

    return get


def _fetch_rows(args, device, rows, rt, store, kind, keys, page_bytes, cache, label, detail) -> None:
    buffers = _host_pages(len(keys), page_bytes, device)
    raw = _raw_read(store, kind, keys, buffers)
    files = [store.root / key for key in keys] if kind == "file" else []  # type: ignore[attr-defined]
    runtime_s, raw_s, prepare_s = [], [], []
    for rep in range(args.reps + 1):  # the first repetition warms the cache and the code: not counted
        for side in ("runtime", "raw") if rep % 2 == 0 else ("raw", "runtime"):
            if cache == "cold":
                drop_cache(files)
            if side == "runtime":
                seconds, prepared = _runtime_fetch(rt, keys)
                if rep:
                    runtime_s.append(seconds)
                    prepare_s.append(prepared)
            else:
                seconds = timed(raw)
                if rep:
                    raw_s.append(seconds)
    nbytes = len(keys) * page_bytes
    parts = _fetch_parts(args, device, rt, store, keys, buffers, files if cache == "cold" else [])
    value, baseline = _gbps(nbytes, median(runtime_s)), _gbps(nbytes, median(raw_s))
    baseline_name = "plain open/readinto" if kind == "file" else "the store's own get"
    target = ("ratio", ">=", TARGET_FETCH) if kind == "file" else (None, None, None)
    extra = {"cache": cache, "seconds_per_rep": runtime_s, "raw_seconds_per_rep": raw_s, "poll_interval_s": POLL_SECONDS, **parts}
    if cache == "cold":
        extra["cold"] = "posix_fadvise(DONTNEED) of each file before each side; the VM's host may still cache them"
    apart = f"apart: store get {parts['store_get_alone_s'] * 1e3:.1f} ms + staging->device {parts['staging_to_device_alone_s'] * 1e3:.1f} ms"
    rows.append(Row(SECTION, f"l3 fetch L3->L1, {label}, {cache} ({apart})", "GB/s", value, baseline, baseline_name, *target, dict(detail, **extra)))
    rows.append(
        Row(
            SECTION,
            f"l3 host blocked in prepare_batch issuing the fetch, {label}, {cache}",
            "ms",
            max(median(prepare_s), 1e-6) * 1e3,
            median(runtime_s) * 1e3,
            "the fetch's time",
            "ratio",
            "<=",
            TARGET_EXPOSED,
            dict(detail, cache=cache, prepare_seconds_per_rep=prepare_s),
        )
    )


def _fetch_parts(args: Any, device: torch.device, rt: Any, store: Store, keys: tuple[str, ...], buffers: list[Any], cold: list[Path]) -> dict[str, float]:
    """The fetch's two steps timed apart (median of `reps`, after one warm-up), so a row shows
    where its time goes: the store's get of the objects into host pages (on the caller's thread,
    from the same cache state: the files in `cold` dropped first), and the runtime's staging -> device copy of as many pages
    (`KVMemory.restore` between free host and device pages; device time on CUDA)."""
    mem, clock = hooks.memory(rt), Clock(device)
    staging, device_pages = list(hooks.free_list(rt, Tier.L2))[: len(keys)], list(hooks.free_list(rt, Tier.L1))[: len(keys)]
    gets, copies = [], []
    for _ in range(args.reps + 1):
        drop_cache(cold)
        gets.append(timed(lambda: store.get(keys, buffers)))
        copies.append(clock.gpu(lambda: mem.restore(staging, device_pages)))
    return {"store_get_alone_s": median(gets[1:]), "staging_to_device_alone_s": median(copies[1:])}


def _persist_rows(args, device, rows, rt, store, kind, extent, pages, page_bytes, label, detail) -> None:
    sources = _host_pages(pages, page_bytes, device)
    for source in sources:
        source[:] = 7  # the bytes written (any: the raw side writes as many)
    runtime_s, raw_s = [], []
    root = getattr(store, "root", None)

    def runtime_persist() -> float:
        keys = _keys(pages)
        t0 = time.perf_counter()
        rt.submit((Persist(extent, keys),))
        done = rt.wait_completions()
        seconds = time.perf_counter() - t0
        if any(c.failure is not None for c in done):
            raise RuntimeError(f"the persist failed: {done}")
        store.remove(keys)
        return seconds

    def raw_write() -> float:
        keys = _keys(pages)
        t0 = time.perf_counter()
        if kind == "file":
            for key, source in zip(keys, sources):
                fd = os.open(root / f"raw-{key}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    if os.write(fd, source) != page_bytes:
                        raise RuntimeError(f"short write of raw-{key}")
                finally:
                    os.close(fd)
            seconds = time.perf_counter() - t0
            for key in keys:
                os.unlink(root / f"raw-{key}")
            return seconds
        results = store.put(keys, sources)
        seconds = time.perf_counter() - t0
        if not all(r.status is Status.STORED for r in results):
            raise RuntimeError(f"the raw put failed: {[r.status.name for r in results]}")
        store.remove(keys)
        return seconds

    for rep in range(args.reps + 1):
        for side in ("runtime", "raw") if rep % 2 == 0 else ("raw", "runtime"):
            seconds = runtime_persist() if side == "runtime" else raw_write()
            if rep:
                (runtime_s if side == "runtime" else raw_s).append(seconds)
    nbytes = pages * page_bytes
    rows.append(
        Row(
            SECTION,
            f"l3 persist L1->L3, {label}",
            "GB/s",
            _gbps(nbytes, median(runtime_s)),
            _gbps(nbytes, median(raw_s)),
            "plain open/write" if kind == "file" else "the store's own put",
            None,
            None,
            None,
            dict(detail, seconds_per_rep=runtime_s, raw_seconds_per_rep=raw_s, writes="to the page cache (fsync=False, the store's default)"),
        )
    )


# -- exposed store I/O under decode steps -------------------------------------------------


class ExposedLoop:
    """Decode steps that each admit one request over a prefix of `pages` pages: attached from L1,
    fetched from L3 (prepared a step ahead), or attached while the plan persists another extent."""

    def __init__(self, decode: Decode, store: Store, pages: int, prefixes: int):
        self.d, self.rt, self.store, self.pages = decode, decode.rt, store, pages
        rt, ps = self.rt, decode.page_size
        self.extents = []
        for _ in range(prefixes):
            request = rt.open_request()
            rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1,) * (pages * ps)),))))
            self.extents.append(rt.publish(request, 0, pages))
            rt.close_request(request)
        self.fetch_keys = [_keys(pages) for _ in self.extents]
        rt.submit(tuple(Persist(x, keys) for x, keys in zip(self.extents, self.fetch_keys)))
        failed = [c for c in rt.wait_completions() if c.failure is not None]
        if failed:
            raise RuntimeError(f"the store failed the persists the fetches read: {failed}")
        self.written: list[tuple[str, ...]] = []  # keys the persist loops wrote, removed after

    def _plan(self, i: int, mode: str) -> BatchPlan:
        rt, xs = self.rt, self.extents
        new = rt.open_request()
        intents: list[Any] = []
        if mode == "fetch":
            intents.append(Fetch(new, self.fetch_keys[i % len(xs)]))
            item = BatchItem(new, (1,))
        else:
            item = BatchItem(new, (1,), attach=(xs[i % len(xs)],))
        intents.append(Close(new))
        if mode == "persist":
            keys = _keys(self.pages)
            self.written.append(keys)
            intents.append(Persist(xs[(i + 1) % len(xs)], keys))
        return BatchPlan((*self.d.decode_items(), item), tuple(intents))

    def run(self, steps: int, mode: str) -> float:
        """Seconds per step of `steps` two-phase steps in `mode` ("compute", "fetch", "persist")."""
        rt = self.rt
        self.d.sync()

        def loop() -> None:
            handle = rt.prepare_batch(self._plan(0, mode))
            for i in range(steps):
                ahead = rt.prepare_batch(self._plan(i + 1, mode))
                rt.execute_batch(handle)
                rt.poll_completions()
                handle = ahead
            self._tail = handle

        seconds = timed(loop)
        rt.execute_batch(self._tail)  # the batch prepared ahead, untimed
        failed = [c for c in rt.wait_completions() if c.failure is not None]
        if failed:
            raise RuntimeError(f"{mode}: L3 transfers failed in the loop: {failed}")
        return seconds / steps

    def fetch_alone(self) -> float:
        self.d.sync()
        return _runtime_fetch(self.rt, self.fetch_keys[0])[0]

    def persist_alone(self) -> float:
        keys = _keys(self.pages)
        self.written.append(keys)
        self.d.sync()
        return timed(lambda: (self.rt.submit((Persist(self.extents[0], keys),)), self.rt.wait_completions()))

    def remove_written(self) -> None:
        for keys in self.written:
            self.store.remove(keys)
        self.written = []


def _exposed(args: Any, device: torch.device, rows: list[Row], guard: Any, kind: str, store: Store) -> None:
    pages, prefixes = args.l3_step_pages, 3
    steps = args.steps
    growth = 8 * (steps + 2) + 64
    # staging: a fetch a step ahead and one being read, or a persist per step still writing
    d = Decode(
        args,
        device,
        extents=0,
        extent_pages=pages,
        growth=growth,
        l1_extra=(prefixes + 3) * pages,
        l2_extra=(steps + 4) * pages,
        width_mult=args.overlap_width_mult,
        runtime_options={"l3": store, "host_mode": "buffer_only"},
    )
    try:
        with guard(SECTION, f"exposed {kind}"):
            loop = ExposedLoop(d, store, pages, prefixes)
            for mode in ("compute", "fetch", "persist"):  # warm every path once
                loop.run(2, mode)
            loop.remove_written()
            with steady_gc():
                compute = loop.run(steps, "compute")
                fetch = loop.run(steps, "fetch")
                persist = loop.run(steps, "persist")
                compute2 = loop.run(steps, "compute")
            loop.remove_written()
            tc = (compute + compute2) / 2  # bracket the L3 loops
            fetch_alone = median([loop.fetch_alone() for _ in range(args.reps + 1)][1:])
            persist_alone = median([loop.persist_alone() for _ in range(args.reps + 1)][1:])
            loop.remove_written()
            page_bytes = d.page_bytes
            assert page_bytes == _page_bytes(args, d.page_size), "the KV page the store holds is the page the bench sized"
            label = f"{kind} store, {pages} x {_object_size(page_bytes)} per step"
            for what, step, alone in (("fetch in flight, prepared a step ahead", fetch, fetch_alone), ("persist in flight", persist, persist_alone)):
                exposed = (step - tc) / alone
                rows.append(
                    Row(
                        SECTION,
                        f"l3 step time, {what} ({label}; exposed {max(exposed, FLOOR):.3f} of the transfer, transfer/compute={alone / tc:.2f})",
                        "ms",
                        step * 1e3,
                        tc * 1e3,
                        "same steps, no L3 traffic",
                        "ratio",
                        "<=",
                        round(1 + TARGET_EXPOSED * alone / tc, 4),
                        {
                            "store": kind,
                            "method": "step time (with L3 - without) / the transfer alone on an idle runtime",
                            "exposed_fraction": exposed,
                            "transfer_alone_s": alone,
                            "compute_only_step_s": [compute, compute2],
                            "step_s": step,
                            "pages_per_step": pages,
                            "object_bytes": page_bytes,
                            "bytes_per_step": pages * page_bytes,
                            "decode_batch": args.decode_batch,
                            "context": args.context,
                            "steps": steps,
                        },
                    )
                )
    finally:
        d.close()
