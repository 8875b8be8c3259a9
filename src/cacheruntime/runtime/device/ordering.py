"""The ordering points between streams (O1, O2, scenario 1): each one is what a mutant leaves out.

A missing wait here is a real race on CUDA and on the CPU streams alike (their workers
run concurrently), and the test-only delay knob makes it a sure one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cacheruntime.runtime.device.deadstreams import StreamDead
from cacheruntime.runtime.device.streams import Event, Stream


class Ordering:
    """Where one stream waits for another's event."""

    def wait_kv_ready(self, compute: Stream, restores: Iterable[Event]) -> None:
        """O1: compute starts only after the H2D of every restored page it reads (KV_READY)."""
        for event in restores:
            compute.wait(event)

    def failed_reads(self, restores: dict[int, Any]) -> list[int]:
        """KV_READY on a failed copy: which of the restores compute waited for failed (their
        results are in once the waits are done; one not run yet is not a failed one, which
        only a runtime that skipped the wait can meet). Compute does not run over them."""
        failed = []
        for transfer_id, result in restores.items():
            error = result._error if hasattr(result, "_error") else None
            if isinstance(error, StreamDead):
                raise error  # the machinery is gone, not the copy
            if error is not None:
                failed.append(transfer_id)
        return failed

    def wait_compute(self, stream: Stream, compute_event: Event | None) -> None:
        """O2: a D2H reads device pages only after the compute that wrote them."""
        if compute_event is not None:
            stream.wait(compute_event)

    def wait_transfer_deps(self, stream: Stream, sources: Iterable[Event]) -> None:
        """A restore reads a host copy only after the backup filling it (scenario 1)."""
        for event in sources:
            stream.wait(event)
