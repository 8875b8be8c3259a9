"""Copy paths for page size 16, side by side (issue 19 item 3): `python -m benchmarks.diagnostics.copypaths --json OUT.json`.

Each 16-token page of the bench's KV shape (32 layers x 8 KV heads x 128 head dim, bf16) is
2 MiB: in L1 (layer-major, `[layers, 2, pages, ...]`) 64 rows of 32 KiB far apart, in L2
(page-major) one contiguous block. For the same bytes (`--mib`, scattered runs of 1 and 8
pages, as the transfer section lays them out) it times, with CUDA events, the median of
`--reps` repetitions after one warm-up:

- `runtime`: the runtime's own `KVMemory.restore`/`backup`, as it runs today (at run 1 one
  `cudaMemcpy2DAsync` per page, at run 8 the staged DMA: one copy per host run, then a
  scatter (gather) of rows on the device); `runtime dma` and `runtime uva` force the staged
  routine or the zero-copy kernel reading pinned host memory in place (`uva_max_run`, and
  the 2D copy off);
- `baseline`: one pinned contiguous `copy_` of the same bytes (the transfer section's);
  `pieces 32KiB` / `pieces 2MiB`: the same contiguous buffer as that many `copy_` calls
  (what many small copies cost on the host alone);
- `batch rows`: one `cudaMemcpyBatchAsync` (cuda-bindings) of every 32 KiB row, host page
  rows straight into the layer-major L1 rows (no staging);
- `2d rows`: one `cudaMemcpy2DAsync` per page (64 rows of 32 KiB, device pitch the
  distance between layers' rows);
- `page-major copy_` / `page-major batch`: the layout-change estimate, a device pool
  `[pages, page]` where a page is contiguous on both sides: one `copy_` per joint run, or
  those runs in one batch call.

Each path is timed two ways: `live` (events around the host issuing it, what a caller
gets) and `queued` (the stream held by a sleep kernel until the host has issued
everything, so the events time the device's own work); `host` is the issuing time.
Both directions at once: every path's restore of one extent on one stream and its backup
of another on a second stream, issued from one thread, and the transfer section's own
protocol measurement (`benchmarks.transfers._both_directions`) with the runtime's copy
calls instrumented: when each was issued on the host and when it ran on the device.

`cuda-bindings` is optional (the device machine gets it as a carried wheel,
`scripts/gpu_copies.sh`); the probe says whether `cudaMemcpyBatchAsync` exists and copies
correctly, and without it those paths are reported as unavailable. Every path is
checked once before it is timed: its restore must put L2's bytes on the timed pages and its
backup bring them back (bit for bit; the output marks a failure `WRONG BYTES`).

The copy plans (`row_pieces`, `page_2d`, `joint_runs`) are plain byte offsets, applied on
CPU by `apply_pieces`/`apply_2d` (the smoke test compares them with `KVMemory` on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from benchmarks.harness import scattered_runs
from benchmarks.hooks import KVMemory

PAGE_SIZE = 16
RUNS = (1, 8)


# -------------------------------------------------------------------------------------
# Copy plans: byte offsets from the base of each side (CPU and CUDA alike)
# -------------------------------------------------------------------------------------


class Piece(NamedTuple):
    """One 1D copy: `size` bytes from `src` to `dst` (offsets from each side's base)."""

    src: int
    dst: int
    size: int


class Copy2D(NamedTuple):
    """One 2D copy: `height` rows of `width` bytes, each side with its own pitch."""

    src: int
    src_pitch: int
    dst: int
    dst_pitch: int
    width: int
    height: int


def _geometry(mem: KVMemory) -> tuple[int, int, int]:
    """(row bytes, rows per page, L1 pages) of `mem`."""
    row_bytes = mem.l1_rows.shape[1] * mem.l1_rows.element_size()
    return row_bytes, mem.lanes, mem.l1.shape[2]


def row_pieces(mem: KVMemory, host_pages: list[int], device_pages: list[int], restore: bool) -> list[Piece]:
    """Every row of every page as its own copy: host page rows <-> layer-major L1 rows."""
    row_bytes, lanes, l1_pages = _geometry(mem)
    pieces = []
    for h, d in zip(host_pages, device_pages, strict=True):
        for lane in range(lanes):
            host, device = (h * lanes + lane) * row_bytes, (lane * l1_pages + d) * row_bytes
            pieces.append(Piece(host, device, row_bytes) if restore else Piece(device, host, row_bytes))
    return pieces


def page_2d(mem: KVMemory, host_pages: list[int], device_pages: list[int], restore: bool) -> list[Copy2D]:
    """One 2D copy per page: its rows contiguous on the host, one L1 row apart per layer on the device."""
    row_bytes, lanes, l1_pages = _geometry(mem)
    copies = []
    for h, d in zip(host_pages, device_pages, strict=True):
        host, device = h * lanes * row_bytes, d * row_bytes
        if restore:
            copies.append(Copy2D(host, row_bytes, device, l1_pages * row_bytes, row_bytes, lanes))
        else:
            copies.append(Copy2D(device, l1_pages * row_bytes, host, row_bytes, row_bytes, lanes))
    return copies


def joint_runs(src_pages: list[int], dst_pages: list[int], page_bytes: int) -> list[Piece]:
    """Page-major on both sides: one copy per run of pages consecutive on both sides."""
    pieces: list[Piece] = []
    for s, d in zip(src_pages, dst_pages, strict=True):
        last = pieces[-1] if pieces else None
        if last is not None and last.src + last.size == s * page_bytes and last.dst + last.size == d * page_bytes:
            pieces[-1] = last._replace(size=last.size + page_bytes)
        else:
            pieces.append(Piece(s * page_bytes, d * page_bytes, page_bytes))
    return pieces


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1).view(torch.uint8)


def apply_pieces(src: torch.Tensor, dst: torch.Tensor, pieces: list[Piece]) -> None:
    """Run `pieces` with plain tensor copies (the CPU reference of a batch call)."""
    s, d = _bytes(src), _bytes(dst)
    for p in pieces:
        d[p.dst : p.dst + p.size].copy_(s[p.src : p.src + p.size])


def apply_2d(src: torch.Tensor, dst: torch.Tensor, copies: list[Copy2D]) -> None:
    """Run `copies` with plain tensor copies (the CPU reference of cudaMemcpy2D)."""
    s, d = _bytes(src), _bytes(dst)
    for c in copies:
        for row in range(c.height):
            a, b = c.src + row * c.src_pitch, c.dst + row * c.dst_pitch
            d[b : b + c.width].copy_(s[a : a + c.width])


# -------------------------------------------------------------------------------------
# cuda-bindings: the probe and the two DMA calls
# -------------------------------------------------------------------------------------


class CudaCalls:
    """`cudaMemcpyBatchAsync` and `cudaMemcpy2DAsync` through cuda-bindings' runtime module."""

    def __init__(self, cudart: Any, device_index: int):
        self.cudart = cudart
        self.device_index = device_index
        #: Pieces per cudaMemcpyBatchAsync call: all at once, until a call refuses that many.
        self.max_count: int | None = None

    def _check(self, result: Any, what: str) -> None:
        err = result[0] if isinstance(result, tuple) else result
        if err != self.cudart.cudaError_t.cudaSuccess:
            raise RuntimeError(f"{what} returned {err}")

    def _attrs(self, restore: bool) -> Any:
        rt = self.cudart
        attrs = rt.cudaMemcpyAttributes()
        attrs.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        host, device = rt.cudaMemLocationType.cudaMemLocationTypeHost, rt.cudaMemLocationType.cudaMemLocationTypeDevice
        attrs.srcLocHint.type, attrs.srcLocHint.id = (host, 0) if restore else (device, self.device_index)
        attrs.dstLocHint.type, attrs.dstLocHint.id = (device, self.device_index) if restore else (host, 0)
        attrs.flags = 0
        return attrs

    def batch(self, src_base: int, dst_base: int, pieces: list[Piece], restore: bool, stream: torch.cuda.Stream) -> None:
        """All `pieces` in one cudaMemcpyBatchAsync on `stream`."""
        attrs = [self._attrs(restore)]
        step = self.max_count or len(pieces)
        for lo in range(0, len(pieces), step):
            part = pieces[lo : lo + step]
            srcs = [src_base + p.src for p in part]
            dsts = [dst_base + p.dst for p in part]
            sizes = [p.size for p in part]
            result = self.cudart.cudaMemcpyBatchAsync(dsts, srcs, sizes, len(part), attrs, [0], 1, stream.cuda_stream)
            if self.max_count is None and len(part) > 1024 and result[0] != self.cudart.cudaError_t.cudaSuccess:
                print(f"cudaMemcpyBatchAsync refused {len(part)} pieces ({result[0]}): batches of 1024 from now on", flush=True)
                self.max_count = 1024
                self.batch(src_base, dst_base, pieces, restore, stream)
                return
            self._check(result, "cudaMemcpyBatchAsync")

    def copy_2d(self, src_base: int, dst_base: int, copies: list[Copy2D], restore: bool, stream: torch.cuda.Stream) -> None:
        """One cudaMemcpy2DAsync per entry of `copies` on `stream`."""
        rt = self.cudart
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice if restore else rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        handle = stream.cuda_stream
        for c in copies:
            self._check(
                rt.cudaMemcpy2DAsync(dst_base + c.dst, c.dst_pitch, src_base + c.src, c.src_pitch, c.width, c.height, kind, handle), "cudaMemcpy2DAsync"
            )


def probe(device: torch.device) -> tuple[CudaCalls | None, dict[str, Any]]:
    """Whether cuda-bindings imports, has `cudaMemcpyBatchAsync`, and copies 3 pieces right."""
    found: dict[str, Any] = {}
    try:
        import cuda.bindings  # type: ignore[import-not-found]
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]
    except Exception as error:
        found["import"] = f"failed: {error!r}"
        return None, found
    found["cuda_bindings_version"] = getattr(cuda.bindings, "__version__", "?")
    found["cuda_bindings_path"] = getattr(cuda.bindings, "__file__", "?")
    found["runtime_version"] = list(cudart.cudaRuntimeGetVersion())[1:]
    found["driver_version"] = list(cudart.cudaDriverGetVersion())[1:]
    found["has_cudaMemcpyBatchAsync"] = hasattr(cudart, "cudaMemcpyBatchAsync")
    found["has_cudaMemcpy2DAsync"] = hasattr(cudart, "cudaMemcpy2DAsync")
    if not found["has_cudaMemcpyBatchAsync"]:
        return None, found
    calls = CudaCalls(cudart, device.index if device.index is not None else torch.cuda.current_device())
    try:
        host = torch.arange(3 * 4096, dtype=torch.uint8).pin_memory()
        dev = torch.zeros(3 * 4096, dtype=torch.uint8, device=device)
        back = torch.zeros(3 * 4096, dtype=torch.uint8).pin_memory()
        stream = torch.cuda.Stream(device)
        pieces = [Piece(0, 8192, 4096), Piece(4096, 0, 4096), Piece(8192, 4096, 4096)]  # a permutation
        calls.batch(host.data_ptr(), dev.data_ptr(), pieces, True, stream)
        calls.batch(dev.data_ptr(), back.data_ptr(), [Piece(p.dst, p.src, p.size) for p in pieces], False, stream)
        stream.synchronize()
        expected = torch.cat([host[4096:8192], host[8192:], host[:4096]])
        found["batch_works"] = bool(torch.equal(dev.cpu(), expected) and torch.equal(back, host))
    except Exception as error:
        found["batch_works"] = False
        found["batch_error"] = repr(error)
    return (calls if found["batch_works"] else None), found


# -------------------------------------------------------------------------------------
# Timing
# -------------------------------------------------------------------------------------


def _cycles_per_second(device: torch.device) -> float:
    from cacheruntime.runtime.device.streams import CudaStream  # the runtime's own calibration of the sleep kernel

    return CudaStream._calibrate(device)


class Timing(NamedTuple):
    live: float  # device seconds between events around the host issuing the copy
    queued: float  # device seconds with the stream held until everything was issued
    host: float  # host seconds issuing the copy (live run)


def time_path(issue: Callable[[], None], stream: torch.cuda.Stream, reps: int, hz: float) -> Timing:
    """Median `Timing` of `issue()` on `stream` over `reps` repetitions (one warm-up each way)."""
    live, host, queued = [], [], []
    for rep in range(reps + 1):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            t0 = time.perf_counter()
            issue()
            t1 = time.perf_counter()
            end.record(stream)
        end.synchronize()
        if rep:
            live.append(start.elapsed_time(end) / 1e3)
            host.append(t1 - t0)
    hold = max(host) * 2 + 2e-3
    for rep in range(reps + 1):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(hold * hz))
            start.record(stream)
            issue()
            end.record(stream)
        end.synchronize()
        if rep:
            queued.append(start.elapsed_time(end) / 1e3)
    return Timing(statistics.median(live), statistics.median(queued), statistics.median(host))


def time_both(restore: Callable[[], None], backup: Callable[[], None], streams: tuple[Any, Any], reps: int, hz: float) -> dict[str, float]:
    """A restore on streams[0] and a backup on streams[1], issued one after the other from this thread.

    Medians of: the span from the common start to the later end (live, and queued behind a
    sleep on both streams), each direction's device interval from the common start, and the
    host time issuing each.
    """
    a, b = streams
    out: dict[str, list[float]] = {
        k: [] for k in ("span", "restore_start", "restore_end", "backup_start", "backup_end", "host_restore", "host_backup", "span_queued")
    }
    host_max = 0.0
    for queued in (False, True):
        for rep in range(reps + 1):
            torch.cuda.synchronize()
            ev = {k: torch.cuda.Event(enable_timing=True) for k in ("t0", "rs", "re", "bs", "be")}
            with torch.cuda.stream(a):
                if queued:
                    torch.cuda._sleep(int((host_max * 2 + 2e-3) * hz))
                ev["t0"].record(a)
            b.wait_event(ev["t0"])
            t0 = time.perf_counter()
            with torch.cuda.stream(a):
                ev["rs"].record(a)
                restore()
                ev["re"].record(a)
            t1 = time.perf_counter()
            with torch.cuda.stream(b):
                ev["bs"].record(b)
                backup()
                ev["be"].record(b)
            t2 = time.perf_counter()
            torch.cuda.synchronize()
            host_max = max(host_max, t2 - t0)
            if not rep:
                continue
            at = {k: ev["t0"].elapsed_time(e) / 1e3 for k, e in ev.items() if k != "t0"}
            if queued:
                out["span_queued"].append(max(at["re"], at["be"]))
                continue
            out["span"].append(max(at["re"], at["be"]))
            out["restore_start"].append(at["rs"])
            out["restore_end"].append(at["re"])
            out["backup_start"].append(at["bs"])
            out["backup_end"].append(at["be"])
            out["host_restore"].append(t1 - t0)
            out["host_backup"].append(t2 - t1)
    return {k: statistics.median(v) for k, v in out.items()}


# -------------------------------------------------------------------------------------
# The runtime's page index read by a kernel instead of an H2D copy, and device traces
# -------------------------------------------------------------------------------------


_KEEP: list[torch.Tensor] = []  # pinned index lists read by kernels still in flight (a diagnostic: never freed)


def _index_by_kernel() -> Callable[[list[int], torch.dtype, torch.device], torch.Tensor]:
    """A `to_device` whose values a Triton kernel reads from pinned host memory (UVA): no copy-engine work."""
    import triton  # type: ignore[import-not-found]
    import triton.language as tl  # type: ignore[import-not-found]

    @triton.jit
    def load(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    def to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        host = torch.tensor(values, dtype=dtype).pin_memory()
        _KEEP.append(host)
        out = torch.empty(len(values), dtype=dtype, device=device)
        if values:
            load[(triton.cdiv(len(values), 1024),)](host, out, len(values), BLOCK=1024)
        return out

    return to_device


class index_by_kernel:
    """While active, `KVMemory` uploads its page index through `_index_by_kernel` (the hypothesis test)."""

    def __enter__(self) -> None:
        from cacheruntime.runtime.device import memory

        self._module, self._saved = memory, memory.to_device
        setattr(memory, "to_device", _index_by_kernel())  # noqa: B010

    def __exit__(self, *exc: Any) -> None:
        setattr(self._module, "to_device", self._saved)  # noqa: B010


def traced(fn: Callable[[], Any], path: str, mark: str) -> list[dict[str, Any]]:
    """Run `fn` under the torch profiler (chrome trace to `path`); the device ops after the last `mark` annotation."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    marks = [e["ts"] for e in events if e.get("name") == mark and e.get("cat") == "user_annotation"]
    if not marks:
        return []
    t0 = marks[-1]
    ops = []
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["ts"] >= t0:
            args = e.get("args", {})
            ops.append(
                {
                    "stream": args.get("stream"),
                    "what": e["name"][:40],
                    "bytes": args.get("bytes"),
                    "start_ms": round((e["ts"] - t0) / 1e3, 3),
                    "end_ms": round((e["ts"] + e.get("dur", 0) - t0) / 1e3, 3),
                }
            )
    return sorted(ops, key=lambda o: o["start_ms"])


def show_trace(ops: list[dict[str, Any]]) -> None:
    """Device ops in start order, runs of equal ops on one stream folded into one line."""
    folded: list[dict[str, Any]] = []
    for op in ops:
        last = folded[-1] if folded else None
        if last is not None and last["stream"] == op["stream"] and last["what"] == op["what"]:
            last["n"] += 1
            last["end_ms"] = max(last["end_ms"], op["end_ms"])
            last["bytes"] = (last["bytes"] or 0) + (op["bytes"] or 0)
        else:
            folded.append(dict(op, n=1))
    for op in folded:
        size = f" {op['bytes'] / 2**20:.3f} MiB" if op["bytes"] else ""
        print(f"    stream {op['stream']}: {op['n']} x {op['what']}{size}  {op['start_ms']}-{op['end_ms']} ms")


# -------------------------------------------------------------------------------------
# The measurement
# -------------------------------------------------------------------------------------


class Setup(NamedTuple):
    mem: KVMemory
    page_major: torch.Tensor  # the layout-change estimate's device pool: [pages, page elements]
    pages: int
    nbytes: int
    pool: int


def make_setup(device: torch.device, mib: int, layers: int = 32, heads: int = 8, head_dim: int = 128, dtype: torch.dtype = torch.bfloat16) -> Setup:
    page_bytes = layers * 2 * PAGE_SIZE * heads * head_dim * torch.empty((), dtype=dtype).element_size()
    pages = max(max(RUNS), (mib << 20) // page_bytes)
    pages = -(-pages // max(RUNS)) * max(RUNS)
    pool = 4 * pages + 4 * max(RUNS)  # two disjoint extents in scattered runs (every other block)
    mem = KVMemory(device=device, l1_pages=pool, l2_pages=pool, page_size=PAGE_SIZE, layers=layers, heads=heads, head_dim=head_dim, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    mem.l2.view(torch.int16).copy_(torch.randint(-(2**15), 2**15, mem.l2.shape, dtype=torch.int16, generator=gen))
    page_major = torch.zeros(pool, mem.page_elems, dtype=dtype, device=device)
    return Setup(mem, page_major, pages, pages * page_bytes, pool)


def page_lists(setup: Setup, run: int, seed: int) -> dict[str, list[int]]:
    """Two disjoint extents' host and device pages, each in scattered runs of `run` (the transfer section's layout)."""
    rng = random.Random(seed)
    n = setup.pages
    host = scattered_runs(list(range(setup.pool)), run, 2 * n, rng)[: 2 * n]
    dev = scattered_runs(list(range(setup.pool)), run, 2 * n, rng)[: 2 * n]
    return {"host_a": host[:n], "dev_a": dev[:n], "host_b": host[n:], "dev_b": dev[n:]}


def paths(
    setup: Setup, lists: dict[str, list[int]], calls: CudaCalls | None
) -> dict[str, tuple[Callable[[str], Callable[[], None]], Callable[[str], Callable[[], None]]]]:
    """Each path's (restore, backup) issue functions, for extent "a" or "b"."""
    mem, pm = setup.mem, setup.page_major
    default_uva, default_cudart = mem.uva_max_run, mem.cudart
    l1, l2 = mem.l1_rows.data_ptr(), mem.l2_rows.data_ptr()
    pm_ptr, page_bytes = pm.data_ptr(), mem.page_bytes

    def runtime(uva: float, two_d: bool = True) -> tuple[Callable[[str], Callable[[], None]], Callable[[str], Callable[[], None]]]:
        """The runtime's own routine with `uva_max_run` = `uva` for the call, and without its 2D copy
        unless `two_d` (its defaults restored after)."""

        def with_uva(move: Callable[[list[int], list[int]], None], src: list[int], dst: list[int]) -> Callable[[], None]:
            def issue() -> None:
                mem.uva_max_run = uva
                if not two_d:
                    mem.cudart = None
                try:
                    move(src, dst)
                finally:
                    mem.uva_max_run, mem.cudart = default_uva, default_cudart

            return issue

        def restore(x: str) -> Callable[[], None]:
            return with_uva(mem.restore, lists["host_" + x], lists["dev_" + x])

        def backup(x: str) -> Callable[[], None]:
            return with_uva(mem.backup, lists["dev_" + x], lists["host_" + x])

        return restore, backup

    def page_major_copy(x: str, restore: bool) -> Callable[[], None]:
        host, dev = lists["host_" + x], lists["dev_" + x]
        runs = joint_runs(host, dev, page_bytes) if restore else joint_runs(dev, host, page_bytes)
        src, dst = (mem.l2, pm) if restore else (pm, mem.l2)
        src_b, dst_b = _bytes(src), _bytes(dst)
        views = [(dst_b[p.dst : p.dst + p.size], src_b[p.src : p.src + p.size]) for p in runs]

        def issue() -> None:
            for d, s in views:
                d.copy_(s, non_blocking=True)

        return issue

    table: dict[str, tuple[Callable, Callable]] = {
        "runtime": runtime(default_uva),
        "runtime dma": runtime(0.0),
        "runtime uva": runtime(math.inf, two_d=False),
        "page-major copy_": (lambda x: page_major_copy(x, True), lambda x: page_major_copy(x, False)),
    }
    if calls is not None:

        def batch(x: str, restore: bool) -> Callable[[], None]:
            pieces = row_pieces(mem, lists["host_" + x], lists["dev_" + x], restore)
            src, dst = (l2, l1) if restore else (l1, l2)
            return lambda: calls.batch(src, dst, pieces, restore, torch.cuda.current_stream())

        def two_d(x: str, restore: bool) -> Callable[[], None]:
            copies = page_2d(mem, lists["host_" + x], lists["dev_" + x], restore)
            src, dst = (l2, l1) if restore else (l1, l2)
            return lambda: calls.copy_2d(src, dst, copies, restore, torch.cuda.current_stream())

        def pm_batch(x: str, restore: bool) -> Callable[[], None]:
            host, dev = lists["host_" + x], lists["dev_" + x]
            runs = joint_runs(host, dev, page_bytes) if restore else joint_runs(dev, host, page_bytes)
            src, dst = (l2, pm_ptr) if restore else (pm_ptr, l2)
            return lambda: calls.batch(src, dst, runs, restore, torch.cuda.current_stream())

        table["batch rows"] = (lambda x: batch(x, True), lambda x: batch(x, False))
        table["2d rows"] = (lambda x: two_d(x, True), lambda x: two_d(x, False))
        table["page-major batch"] = (lambda x: pm_batch(x, True), lambda x: pm_batch(x, False))
    return table


def verify(setup: Setup, name: str, restore: Callable[[], None], backup: Callable[[], None], lists: dict[str, list[int]]) -> bool:
    """Whether one restore of extent a puts L2's bytes in place, and one backup of it brings them back."""
    mem, page_major = setup.mem, name.startswith("page-major")
    host, dev = lists["host_a"], lists["dev_a"]
    expected = mem.read_l2(host)
    torch.cuda.synchronize()
    mem.l1.zero_()
    setup.page_major.zero_()
    torch.cuda.synchronize()  # the zeroing (default stream) done before the copy on the side stream starts
    side = torch.cuda.Stream(mem.device)  # not the legacy default stream, which cudaMemcpyBatchAsync refuses
    with torch.cuda.stream(side):
        restore()
    torch.cuda.synchronize()
    got = setup.page_major[torch.tensor(dev, device=mem.device)].view(len(dev), *mem.page_shape) if page_major else mem.read_l1(dev)
    same = lambda a, b: torch.equal(a.view(torch.int16), b.view(torch.int16))  # noqa: E731 (bits: random bf16 holds NaNs)
    restored = same(got.cpu(), expected)
    mem.l2[torch.tensor(host)] = 0
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        backup()
    torch.cuda.synchronize()
    backed = same(mem.read_l2(host), expected)
    mem.l2[torch.tensor(host)] = expected.view(len(host), -1)
    return restored and backed


def baselines(setup: Setup, reps: int, hz: float) -> tuple[dict[str, dict[str, Timing]], dict[str, dict[str, float]]]:
    """The pinned contiguous copy, whole and in pieces of 2 MiB and 32 KiB: each way, and both at once."""
    device, n = setup.mem.device, setup.nbytes
    host_in, host_out = (torch.randint(0, 255, (n,), dtype=torch.uint8).pin_memory() for _ in range(2))
    dev_in, dev_out = (torch.empty(n, dtype=torch.uint8, device=device) for _ in range(2))
    stream, other = torch.cuda.Stream(device), torch.cuda.Stream(device)
    single: dict[str, dict[str, Timing]] = {}
    both: dict[str, dict[str, float]] = {}
    for label, piece in (("baseline", n), ("pieces 2MiB", 2 << 20), ("pieces 32KiB", 32 << 10)):
        bounds = [(lo, min(lo + piece, n)) for lo in range(0, n, piece)]
        h2d_views = [(dev_in[lo:hi], host_in[lo:hi]) for lo, hi in bounds]
        d2h_views = [(host_out[lo:hi], dev_out[lo:hi]) for lo, hi in bounds]

        def h2d(views: list = h2d_views) -> None:
            for d, s in views:
                d.copy_(s, non_blocking=True)

        def d2h(views: list = d2h_views) -> None:
            for d, s in views:
                d.copy_(s, non_blocking=True)

        single[label] = {"restore": time_path(h2d, stream, reps, hz), "backup": time_path(d2h, stream, reps, hz)}
        both[label] = time_both(h2d, d2h, (stream, other), reps, hz)
        both[label]["copies_each_way"] = len(bounds)
    return single, both


def protocol_both(reps: int, seed: int, throttle: bool, kernel_index: bool = False, trace: str | None = None) -> dict[str, Any]:
    """The transfer section's own both-directions measurement (ps=16, run=8), the runtime's copy calls instrumented."""
    from benchmarks import add_arguments, harness, hooks, resolve, transfers
    from benchmarks.report import Row
    from cacheruntime.protocol import Restore

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = resolve(parser.parse_args(["--reps", str(reps), "--seed", str(seed)]), cuda=True)
    device, clock = torch.device("cuda"), harness.Clock(torch.device("cuda"))
    page_size, run_len, longest = PAGE_SIZE, 8, max(args.runs)
    page_bytes = transfers._page_bytes(args, page_size)
    pages = -(-max(longest, (args.transfer_mib << 20) // page_bytes) // longest) * longest
    pool = 3 * pages + 2 * longest
    runner = harness.bench_runner(args, device, read_context=False, max_new_tokens=min(pages * page_size, 4096))
    options: dict[str, Any] = {} if throttle else {"d2h_bytes_per_batch": None}
    rt = harness.make_runtime(
        args, device, runner, page_size=page_size, max_requests=2, max_request_tokens=pages * page_size, l1_pages=pool, l2_pages=pool, **options
    )
    calls: list[dict[str, Any]] = []
    marks: list[tuple[float, Any]] = []
    try:
        mem = hooks.memory(rt)
        restore, backup = mem.restore, mem.backup

        def timed(kind: str, fn: Callable[[list[int], list[int]], None]) -> Callable[[list[int], list[int]], None]:
            def call(src: list[int], dst: list[int]) -> None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                fn(src, dst)
                end.record()
                calls.append({"kind": kind, "pages": len(src), "host": (t0, time.perf_counter()), "events": (start, end), "path": mem.last_path})

            return call

        setattr(mem, "restore", timed("restore", restore))  # noqa: B010 (instance attributes: the device layer looks them up per call)
        setattr(mem, "backup", timed("backup", backup))  # noqa: B010
        submit = rt.submit

        def marked_submit(ops: Any) -> Any:
            if any(isinstance(op, Restore) for op in ops):  # the measured Restore + Backup
                ref = torch.cuda.Event(enable_timing=True)
                ref.record(torch.cuda.default_stream())
                marks.append((time.perf_counter(), ref))
                calls.append({"kind": "mark"})
                with torch.profiler.record_function("copypaths mark"):
                    return submit(ops)
            return submit(ops)

        setattr(rt, "submit", marked_submit)  # noqa: B010
        rows: list[Row] = []
        measured = lambda: transfers._both_directions(args, device, clock, rows, rt, page_size, run_len, pages, pages * page_bytes, random.Random(seed))  # noqa: E731
        with index_by_kernel() if kernel_index else contextlib.nullcontext():
            ops = traced(measured, trace, "copypaths mark") if trace else (measured(), [])[1]
        torch.cuda.synchronize()
    finally:
        harness.close_runtime(rt)
    reps_out: list[list[dict[str, Any]]] = []
    mark = -1
    for c in calls:
        if c["kind"] == "mark":
            mark += 1
            reps_out.append([])
            continue
        if mark < 0:
            continue  # the setup's backup
        host0, ref = marks[mark]
        start, end = c["events"]
        reps_out[mark].append(
            {
                "kind": c["kind"],
                "pages": c["pages"],
                "path": c["path"],
                "host_ms": [round((c["host"][0] - host0) * 1e3, 3), round((c["host"][1] - host0) * 1e3, 3)],
                "device_ms": [round(ref.elapsed_time(start), 3), round(ref.elapsed_time(end), 3)],
            }
        )
    row = rows[0]
    return {
        "throttle": throttle,
        "kernel_index": kernel_index,
        "trace_of_last_rep": ops,
        "gbps": row.value,
        "baseline_gbps": row.baseline,
        "ratio": row.value / row.baseline,
        "calls_per_rep": reps_out[1:],
    }


def split_backup(setup: Setup, lists: dict[str, list[int]], streams: tuple[Any, Any], reps: int, hz: float) -> dict[str, dict[str, float]]:
    """The runtime's restore of extent a beside its backup of extent b split as the D2H throttle
    splits it (the first 16 pages, then the rest), with the page index copied (as today) or read by a kernel."""
    mem, hb, db = setup.mem, lists["host_b"], lists["dev_b"]

    def restore() -> None:
        mem.restore(lists["host_a"], lists["dev_a"])

    def split() -> None:
        mem.backup(db[:16], hb[:16])
        mem.backup(db[16:], hb[16:])

    def whole() -> None:
        mem.backup(db, hb)

    found = {"runtime run=8 backup 16+240": time_both(restore, split, streams, reps, hz)}
    with index_by_kernel():
        found["runtime run=8 backup 16+240 index by kernel"] = time_both(restore, split, streams, reps, hz)
        found["runtime run=8 index by kernel"] = time_both(restore, whole, streams, reps, hz)
    return found


def measure(device: torch.device, mib: int, reps: int, seed: int, trace_dir: str) -> dict[str, Any]:
    hz = _cycles_per_second(device)
    calls, found = probe(device)
    print("cuda-bindings probe:", json.dumps(found), flush=True)
    setup = make_setup(device, mib)
    result: dict[str, Any] = {"probe": found, "page_size": PAGE_SIZE, "pages": setup.pages, "bytes": setup.nbytes, "reps": reps, "paths": {}, "both": {}}
    nbytes = setup.nbytes
    gbps = lambda seconds: nbytes / seconds / 1e9  # noqa: E731
    single, both = baselines(setup, reps, hz)
    base = {k: gbps(single["baseline"][k].live) for k in ("restore", "backup")}
    base_both = 2 * nbytes / both["baseline"]["span"] / 1e9
    result["baseline_gbps"] = dict(base, both=base_both)
    print(
        f"\npage size {PAGE_SIZE}, {setup.pages} pages, {nbytes >> 20} MiB each way; baseline restore {base['restore']:.1f} GB/s, backup {base['backup']:.1f} GB/s, both at once {base_both:.1f} GB/s"
    )
    header = f"{'path':<20} {'run':>3} {'dir':<8} {'live GB/s':>9} {'ratio':>6} {'queued GB/s':>11} {'host ms':>8} {'device ms':>9}"

    def show(name: str, run: Any, kind: str, t: Timing, extra: str = "") -> None:
        live = gbps(t.live)
        print(
            f"{name:<20} {run!s:>3} {kind:<8} {live:9.1f} {live / base[kind]:6.3f} {gbps(t.queued):11.1f} {t.host * 1e3:8.2f} {t.queued * 1e3:9.2f} {extra}",
            flush=True,
        )
        result["paths"].setdefault(name, {}).setdefault(str(run), {})[kind] = dict(
            t._asdict(), gbps_live=live, gbps_queued=gbps(t.queued), ratio=live / base[kind]
        )

    print(header)
    for label, timings in single.items():
        for kind in ("restore", "backup"):
            show(label, "-", kind, timings[kind])
    stream, other = torch.cuda.Stream(device), torch.cuda.Stream(device)
    for run in RUNS:
        lists = page_lists(setup, run, seed)
        for name, (restore, backup) in paths(setup, lists, calls).items():
            try:
                ok = verify(setup, name, restore("a"), backup("a"), lists)
            except Exception as error:
                print(f"{name:<20} {run:>3} failed: {error!r}", flush=True)
                result["paths"].setdefault(name, {})[str(run)] = {"error": repr(error)}
                continue
            for kind, issue in (("restore", restore("a")), ("backup", backup("a"))):
                show(name, run, kind, time_path(issue, stream, reps, hz), "" if ok else "WRONG BYTES")
                result["paths"][name][str(run)]["correct"] = ok
                if name == "runtime":
                    result["paths"][name][str(run)][kind + "_routine"] = setup.mem.last_path
            both[f"{name} run={run}"] = time_both(restore("a"), backup("b"), (stream, other), reps, hz)
        if run == 8:
            both.update(split_backup(setup, lists, (stream, other), reps, hz))
    print("\nboth directions at once (restore on one stream, backup on another, issued from one thread): ms from the common start")
    print(f"{'path':<26} {'GB/s':>6} {'ratio':>6} {'queued GB/s':>11} {'restore dev':>15} {'backup dev':>15} {'host restore':>12} {'host backup':>11}")
    for name, b in both.items():
        g = 2 * nbytes / b["span"] / 1e9
        result["both"][name] = dict(b, gbps=g, gbps_queued=2 * nbytes / b["span_queued"] / 1e9, ratio=g / base_both)
        print(
            f"{name:<26} {g:6.1f} {g / base_both:6.3f} {result['both'][name]['gbps_queued']:11.1f} "
            f"{b['restore_start'] * 1e3:6.2f}-{b['restore_end'] * 1e3:6.2f} {b['backup_start'] * 1e3:6.2f}-{b['backup_end'] * 1e3:6.2f} "
            f"{b['host_restore'] * 1e3:12.2f} {b['host_backup'] * 1e3:11.2f}",
            flush=True,
        )
    del setup
    torch.cuda.empty_cache()
    result["protocol_both"] = []
    variants = (
        (True, False, None),
        (False, False, None),
        (True, True, None),
        (True, False, "trace-throttle.json"),
        (True, True, "trace-throttle-kernel-index.json"),
    )
    for throttle, kernel_index, trace in variants:
        found_p = protocol_both(reps, seed, throttle, kernel_index, trace and f"{trace_dir}/{trace}")
        result["protocol_both"].append(found_p)
        print(
            f"\nprotocol restore + backup at once ps=16 run=8 (the transfer section's code), D2H throttle {'on (default)' if throttle else 'off'}"
            f"{', page index read by a kernel' if kernel_index else ''}{', traced' if trace else ''}: {found_p['gbps']:.1f} GB/s against {found_p['baseline_gbps']:.1f} ({found_p['ratio']:.3f})"
        )
        if trace:
            print("  the last rep's device ops from the submit (torch profiler):")
            show_trace(found_p["trace_of_last_rep"])
        print("  per rep, each copy call: kind pages routine host issue [ms] device run [ms], from the submit")
        for i, rep in enumerate(found_p["calls_per_rep"]):
            print(
                f"  rep {i}: "
                + "; ".join(
                    f"{c['kind']} {c['pages']} {c['path']} host {c['host_ms'][0]}-{c['host_ms'][1]} dev {c['device_ms'][0]}-{c['device_ms'][1]}" for c in rep
                )
            )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.copypaths", description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--mib", type=int, default=512, help="bytes per measurement (512 MiB, the transfer section's)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up (5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-dir", default=".", help="where the profiler traces of the protocol runs go (.)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("copypaths: CUDA is not available; the copy plans are checked on CPU by tests/bench/test_copypaths.py")
        return 0
    found = measure(torch.device("cuda"), args.mib, args.reps, args.seed, args.trace_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
