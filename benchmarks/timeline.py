"""The timeline: profiler traces of a few two-phase batches, as Chrome/Perfetto JSON and a PNG.

Each trace holds the host's `bench: prepare N` / `bench: execute N` markers and every CUDA
kernel and copy with its stream. `spans` reads a Chrome trace back into lanes (the host,
then one lane per CUDA stream, named by what runs on it: compute kernels, H2D or D2H
copies); `render` draws one panel per trace with matplotlib when it is installed, and
otherwise writes the PNG itself (rectangles only, no text) with `write_png`.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import defaultdict
from typing import Any

COLORS = {
    "kernel": (68, 119, 170),
    "HtoD": (34, 136, 51),
    "DtoH": (238, 102, 119),
    "other copy": (170, 170, 170),
    "prepare": (204, 187, 68),
    "execute": (102, 204, 238),
}


def _kind(event: dict[str, Any]) -> str:
    cat, name = event.get("cat", ""), event.get("name", "")
    if cat == "kernel":
        return "kernel"
    if "HtoD" in name:
        return "HtoD"
    if "DtoH" in name:
        return "DtoH"
    return "other copy"


def spans(trace: dict[str, Any], label: str | None = None, tail_us: float = 50_000.0) -> dict[str, list[tuple[float, float, str]]]:
    """Lanes -> [(start_us, duration_us, kind)], times relative to the first span.

    With `label`, only the host markers `bench: {label} ...` and the GPU work from the
    first of them to `tail_us` after the last. GPU events without a timestamp (a profiler
    session that lost them) are left out.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e and "dur" in e]
    prefix = f"bench: {label} " if label else "bench: "
    host = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(prefix)]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and float(e["ts"]) > 0]
    if host:
        lo = min(float(e["ts"]) for e in host)
        hi = max(float(e["ts"]) + float(e["dur"]) for e in host) + tail_us
        gpu = [e for e in gpu if lo <= float(e["ts"]) <= hi]
    if not gpu and not host:
        return {}
    t0 = min(float(e["ts"]) for e in gpu + host)
    by_stream: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in gpu:
        by_stream[str(e.get("tid"))].append((float(e["ts"]) - t0, float(e["dur"]), _kind(e)))
    lanes: dict[str, list[tuple[float, float, str]]] = {}
    lanes["host (control)"] = [(float(e["ts"]) - t0, float(e["dur"]), "prepare" if "prepare" in e["name"] else "execute") for e in host]
    for stream, items in sorted(by_stream.items(), key=lambda kv: -sum(d for _, d, _ in kv[1])):
        busy: dict[str, float] = defaultdict(float)
        for _, d, k in items:
            busy[k] += d
        role = {"kernel": "compute/kernels", "HtoD": "H2D", "DtoH": "D2H", "other copy": "copies"}[max(busy, key=busy.get)]
        lanes[f"{role} (stream {stream})"] = sorted(items)
    return lanes


def render(panels: list[tuple[str, dict[str, list[tuple[float, float, str]]]]], path: str) -> str:
    """Draw the panels to `path`; returns which renderer drew it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        write_png(path, raster(panels))
        return "builtin"
    heights = [max(1, len(lanes)) for _, lanes in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(16, 1.2 + 0.55 * sum(heights)), gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (title, lanes) in zip(axes[:, 0], panels):
        names = list(lanes)
        for y, name in enumerate(names):
            for kind in COLORS:
                bars = [(s / 1e3, max(d / 1e3, 0.002)) for s, d, k in lanes[name] if k == kind]
                if bars:
                    ax.broken_barh(bars, (len(names) - 1 - y - 0.4, 0.8), facecolors=tuple(c / 255 for c in COLORS[kind]))
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(list(reversed(names)), fontsize=8)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlabel("ms", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(facecolor=tuple(c / 255 for c in rgb), label=k) for k, rgb in COLORS.items()]
    fig.legend(handles=handles, loc="lower right", ncol=len(COLORS), fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


def raster(panels: list[tuple[str, dict[str, list[tuple[float, float, str]]]]], width: int = 1600, lane: int = 22) -> list[bytearray]:
    """RGB rows: per panel a grey header bar, then one lane per stream, spans as colored boxes."""
    rows: list[bytearray] = []
    for _, lanes in panels:
        end = max((s + d for items in lanes.values() for s, d, _ in items), default=1.0) or 1.0
        rows += [bytearray(b"\x60" * (3 * width)) for _ in range(6)]
        for items in lanes.values():
            band = [bytearray(b"\xff" * (3 * width)) for _ in range(lane)]
            for s, d, kind in items:
                x0 = int(s / end * (width - 1))
                x1 = max(x0 + 1, int((s + d) / end * (width - 1)))
                pixel = bytes(COLORS[kind])
                for r in band[3 : lane - 3]:
                    r[3 * x0 : 3 * x1] = pixel * (x1 - x0)
            rows += band
    return rows or [bytearray(b"\xff" * (3 * width))]


def write_png(path: str, rows: list[bytearray]) -> None:
    """A truecolor PNG from RGB rows (each `3 * width` bytes), with zlib and nothing else."""
    height, width = len(rows), len(rows[0]) // 3

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(r) for r in rows)
    with open(path, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n")
        fh.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        fh.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        fh.write(chunk(b"IEND", b""))


def export(traces: dict[str, tuple[Any, list[str]]], directory: str) -> dict[str, str]:
    """Write each profiler's Chrome trace and one PNG with a panel per label; returns the paths.

    `traces`: name -> (profiler, labels of the `bench: {label} ...` markers in it).
    """
    import os

    os.makedirs(directory, exist_ok=True)
    written, panels = {}, []
    for name, (prof, labels) in traces.items():
        path = os.path.join(directory, f"trace-{name}.json")
        prof.export_chrome_trace(path)
        written[f"trace_{name}"] = path
        with open(path) as fh:
            trace = json.load(fh)
        for label in labels:
            title = f"{label}: two-phase steps, prepare_batch(N+1) (restore of N+1's prefix) before execute_batch(N)"
            panels.append((title, spans(trace, label)))
    if panels:
        png = os.path.join(directory, "timeline.png")
        written["renderer"] = render(panels, png)
        written["png"] = png
    return written
