"""`LocalMooncake`: a Mooncake cluster on loopback for tests, CI and `cacheruntime run --l3 mooncake`.

Two processes from the `[mooncake]` wheel: `mooncake_master` (placement, leases, and an
embedded HTTP metadata server) and `mooncake_client` as a segment holder, which mounts the
memory the objects live in. Clients of the runtime mount nothing, so the objects outlive
them, as a restarted server needs.

Both start on free loopback ports and `start()` returns only once they answer: the master's
`/health` is up and the holder's segment is mounted (the master's `/metrics` counts its
capacity). Waiting is bounded (`READY_SECONDS`); a process that exits or never answers
raises `MooncakeStartError` with the end of its log. A port taken between choosing and
binding it is retried with new ports (`attempts`).

`python -m cacheruntime.storage.master` starts a cluster, stores and reads back one
object, and stops it: CI's check that Mooncake runs on the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from cacheruntime.storage.mooncake import MooncakeConfig

#: how long each process may take to answer before start() gives up on it
READY_SECONDS = 30.0
#: how long stop() waits for a process to exit on SIGTERM before it kills it
STOP_SECONDS = 10.0
_POLL_SECONDS = 0.05
_CAPACITY = re.compile(r"^master_total_capacity_bytes\s+([0-9.e+]+)$", re.MULTILINE)


class MooncakeStartError(RuntimeError):
    """The Mooncake master or segment holder did not start; the message has the end of its log."""


def free_port() -> int:
    """A loopback TCP port free now (the OS may hand it out again before it is bound: see attempts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalMooncake:
    """A master and a segment holder on loopback; use as a context manager or call start()/stop()."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None, *, lease_ms: int = 1000, segment_bytes: int = 64 << 20, attempts: int = 3) -> None:
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="mooncake-"))
        self.lease_ms = lease_ms
        self.segment_bytes = segment_bytes
        self.attempts = attempts
        self._processes: list[subprocess.Popen[bytes]] = []
        self.master_address = ""
        self.metadata_url = ""
        self.admin_url = ""

    def config(self) -> MooncakeConfig:
        """A client configuration for this cluster: a pure client, whose objects outlive it."""
        return MooncakeConfig(master_address=self.master_address, metadata_url=self.metadata_url)

    def start(self) -> LocalMooncake:
        """Start both processes and wait until they answer; `MooncakeStartError` if they cannot."""
        failures = []
        for attempt in range(self.attempts):
            try:
                self._start_master(attempt)
                self._start_holder(attempt)
                return self
            except MooncakeStartError as error:
                failures.append(str(error))
                self.stop()
        raise MooncakeStartError(f"Mooncake did not start in {self.attempts} attempts:\n" + "\n".join(failures))

    def stop(self) -> None:
        """Stop the holder, then the master (SIGTERM, then SIGKILL after STOP_SECONDS)."""
        while self._processes:
            process = self._processes.pop()
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def __enter__(self) -> LocalMooncake:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        self.stop()

    def _start_master(self, attempt: int) -> None:
        rpc, metadata, admin = free_port(), free_port(), free_port()
        self.master_address = f"127.0.0.1:{rpc}"
        self.metadata_url = f"http://127.0.0.1:{metadata}/metadata"
        self.admin_url = f"http://127.0.0.1:{admin}"
        log = self.workdir / f"master-{attempt}.log"
        flags = [
            f"--rpc_port={rpc}",
            "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={metadata}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={admin}",
            f"--default_kv_lease_ttl={self.lease_ms}",
        ]
        process = self._spawn("mooncake.cli", flags, log)
        self._wait("mooncake_master", process, log, "the master's /health", lambda: _http(self.admin_url + "/health") is not None)

    def _start_holder(self, attempt: int) -> None:
        log = self.workdir / f"holder-{attempt}.log"
        flags = [
            "--host=127.0.0.1",
            f"--port={free_port()}",
            f"--master_server_address={self.master_address}",
            f"--metadata_server={self.metadata_url}",
            f"--global_segment_size={self.segment_bytes}",
            "--protocol=tcp",
        ]
        process = self._spawn("mooncake.cli_client", flags, log)
        self._wait("mooncake_client", process, log, "the holder's segment in the master's /metrics", self._segment_mounted)

    def _spawn(self, module: str, flags: list[str], log: Path) -> subprocess.Popen[bytes]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-m", module, *flags], cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT)
        self._processes.append(process)
        return process

    def _segment_mounted(self) -> bool:
        metrics = _http(self.admin_url + "/metrics")
        found = _CAPACITY.search(metrics or "")
        return found is not None and float(found.group(1)) >= self.segment_bytes

    def _wait(self, name: str, process: subprocess.Popen[bytes], log: Path, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise MooncakeStartError(f"{name} exited with {process.returncode} before {what} answered; log {log}:\n{_tail(log)}")
            if ready():
                return
            time.sleep(_POLL_SECONDS)
        raise MooncakeStartError(f"{name} did not answer ({what}) within {READY_SECONDS}s; log {log}:\n{_tail(log)}")


def _http(url: str) -> str | None:
    """The body of a 200 answer, or None if nothing answers (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            body: bytes = answer.read()
            return body.decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    """Start a cluster, store and read back one page, stop it; exit 1 with the reason if that fails."""
    parser = argparse.ArgumentParser(prog="python -m cacheruntime.storage.master", description=__doc__.splitlines()[0])
    parser.add_argument("--lease-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    from cacheruntime.storage.mooncake import MooncakeStore
    from cacheruntime.storage.results import Status

    try:
        with LocalMooncake(lease_ms=args.lease_ms) as cluster:
            store = MooncakeStore(cluster.config())
            page = bytearray(os.urandom(4096))
            back = bytearray(4096)
            stored = store.put(["check"], [page])[0].status
            got = store.get(["check"], [back])[0].status
            store.close()
    except (MooncakeStartError, ImportError) as error:
        print(f"mooncake check: {error}", file=sys.stderr)
        return 1
    if stored is not Status.STORED or got is not Status.HIT or back != page:
        print(f"mooncake check: put answered {stored.name}, get {got.name}, bytes equal: {back == page}", file=sys.stderr)
        return 1
    print(f"mooncake check: master {cluster.master_address} stored and served a 4096-byte page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
