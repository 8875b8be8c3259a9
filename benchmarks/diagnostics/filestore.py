"""Raw file-store get throughput, the baseline for the L3 fetch rows: `python -m benchmarks.diagnostics.filestore [DIR]`.

Fills a `FileStore` (in DIR, default a temporary directory) with page objects, then reads
every page back in batches into preallocated page buffers (as staging pages would be), two
ways over the same files:

- **store get**: `FileStore.get`, what the storage worker runs;
- **plain read**: `open` + `readinto` + `close` per file, the floor any file store pays;

each from a **warm** page cache (the files just read) and a **cold** one (each file's pages
dropped with `posix_fadvise(DONTNEED)` first: no root needed and nothing outside these
files is touched, unlike /proc/sys/vm/drop_caches; on a VM the host may still cache them). Prints one row per object size, way and
cache state: GB/s as the median of the repeats, and the repeats' spread.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from cacheruntime.storage import FileStore, Status

#: object sizes: 64 KiB and 1 MiB pages
SIZES = (64 << 10, 1 << 20)
TOTAL_BYTES = 128 << 20
BATCH = 64
REPEATS = 5


def drop_cache(root: Path) -> None:
    for path in root.iterdir():
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def store_get(store: FileStore, keys: list[str], buffers: list[bytearray]) -> None:
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        results = store.get(batch, buffers[: len(batch)])
        assert all(r.status is Status.HIT for r in results)


def plain_read(root: Path, keys: list[str], buffers: list[bytearray]) -> None:
    for start in range(0, len(keys), BATCH):
        for key, buffer in zip(keys[start : start + BATCH], buffers):
            with open(root / key, "rb", buffering=0) as file:
                file.readinto(buffer)


def main(argv: list[str]) -> None:
    base = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="filestore-bench-"))
    print(f"{'object':>8} {'way':>10} {'cache':>5} {'GB/s':>6} {'min-max':>11}   ({TOTAL_BYTES >> 20} MiB per pass, batches of {BATCH}, median of {REPEATS})")
    for size in SIZES:
        root = base / f"objects-{size}"
        store = FileStore(root)
        keys = [f"{i:08x}" for i in range(TOTAL_BYTES // size)]
        for start in range(0, len(keys), BATCH):
            batch = keys[start : start + BATCH]
            store.put(batch, [os.urandom(size) for _ in batch])
        buffers = [bytearray(size) for _ in range(BATCH)]
        for way, read in (("store get", partial(store_get, store, keys, buffers)), ("plain read", partial(plain_read, root, keys, buffers))):
            for cache in ("warm", "cold"):
                rates = []
                read()  # warm the cache (and the code)
                for _ in range(REPEATS):
                    if cache == "cold":
                        drop_cache(root)
                    began = time.perf_counter()
                    read()
                    rates.append(TOTAL_BYTES / (time.perf_counter() - began) / 1e9)
                print(f"{size >> 10:>6}Ki {way:>10} {cache:>5} {statistics.median(rates):>6.2f} {min(rates):>5.2f}-{max(rates):<5.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
