"""`FileStore`: page objects as files in one directory, the embedded default L3.

Durability rule. A put writes the page to a temporary file in the same directory (a name
starting with '.', which no key has), then renames it over the key's name with
`os.replace`, which is atomic within a directory. So:

- a reader (this process, another runtime sharing the directory, or a restarted one) sees
  either no object or the whole object, never a torn one: a process that crashes mid-put
  leaves at most a temporary file, which no key names;
- every put that answered STORED survives a crash of the process (the bytes are in the
  operating system's page cache and its directory entry is in place);
- a crash of the operating system or a power loss can lose recent objects unless the store
  was opened with `fsync=True`, which syncs the file before the rename and the directory
  after it (then a STORED object survives that too, at the cost of two syncs per put). A
  file that such a crash leaves shorter than the page is reported as `SizeMismatch` on get,
  never as a hit.

Temporary files of crashed writers take space until `sweep_temporaries()` removes them
(call it when no writer shares the directory: it cannot tell a crashed writer's file from a
live one's).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cacheruntime.storage.arguments import byte_views, check_keys
from cacheruntime.storage.errors import SizeMismatch, StoreIOError
from cacheruntime.storage.results import KeyResult, Status, failed

_TEMPORARY = ".tmp-"


class FileStore:
    """A directory of page objects, one file per key; see the module docstring for what survives a crash."""

    name = "file"

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.root.mkdir(parents=True, exist_ok=True)

    def put(self, keys: Sequence[str], sources: Sequence[Any]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        views = byte_views(checked, sources, writable=False)
        return tuple(self._put_one(key, view) for key, view in zip(checked, views))

    def get(self, keys: Sequence[str], targets: Sequence[Any]) -> tuple[KeyResult, ...]:
        checked = check_keys(keys)
        views = byte_views(checked, targets, writable=True)
        return tuple(self._get_one(key, view) for key, view in zip(checked, views))

    def exists(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        results = []
        for key in check_keys(keys):
            try:
                os.stat(self.root / key)
                results.append(KeyResult(key, Status.PRESENT))
            except FileNotFoundError:
                results.append(KeyResult(key, Status.ABSENT))
            except OSError as error:
                results.append(failed(key, StoreIOError(f"stat of {key!r} in {self.root}: {error}")))
        return tuple(results)

    def remove(self, keys: Sequence[str]) -> tuple[KeyResult, ...]:
        results = []
        for key in check_keys(keys):
            try:
                os.unlink(self.root / key)
                results.append(KeyResult(key, Status.REMOVED))
            except FileNotFoundError:
                results.append(KeyResult(key, Status.ABSENT))
            except OSError as error:
                results.append(failed(key, StoreIOError(f"remove of {key!r} in {self.root}: {error}")))
        return tuple(results)

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""

    def sweep_temporaries(self) -> int:
        """Remove the temporary files crashed writers left; how many. Only while no writer is active."""
        swept = 0
        for path in self.root.glob(_TEMPORARY + "*"):
            path.unlink(missing_ok=True)
            swept += 1
        return swept

    def _put_one(self, key: str, view: memoryview) -> KeyResult:
        final = self.root / key
        if final.exists():
            return KeyResult(key, Status.STORED, view.nbytes)
        temporary = self.root / f"{_TEMPORARY}{uuid.uuid4().hex}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, view)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, final)
            if self.fsync:
                _sync_directory(self.root)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            return failed(key, StoreIOError(f"put of {key!r} in {self.root}: {error}"))
        return KeyResult(key, Status.STORED, view.nbytes)

    def _get_one(self, key: str, view: memoryview) -> KeyResult:
        try:
            fd = os.open(self.root / key, os.O_RDONLY)
        except FileNotFoundError:
            return KeyResult(key, Status.MISS)
        except OSError as error:
            return failed(key, StoreIOError(f"open of {key!r} in {self.root}: {error}"))
        try:
            size = os.fstat(fd).st_size
            if size != view.nbytes:
                return failed(key, SizeMismatch(f"object {key!r} has {size} bytes, the buffer {view.nbytes}"))
            _read_all(fd, view)
        except OSError as error:
            return failed(key, StoreIOError(f"read of {key!r} in {self.root}: {error}"))
        finally:
            os.close(fd)
        return KeyResult(key, Status.HIT, view.nbytes)


def _write_all(fd: int, view: memoryview) -> None:
    """Write the whole view (os.write may write less than asked)."""
    done = 0
    while done < view.nbytes:
        done += os.write(fd, view[done:])


def _read_all(fd: int, view: memoryview) -> None:
    """Fill the whole view from the file; a file that shrank under us is an `OSError`."""
    done = 0
    while done < view.nbytes:
        count = os.readv(fd, [view[done:]])
        if count == 0:
            raise OSError(f"the object ended after {done} of {view.nbytes} bytes")
        done += count


def _sync_directory(path: Path) -> None:
    """Make a rename in `path` durable (the directory entry, not only the file's bytes)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
