"""A decode workload through the boundary: B requests with a context, stepping one token each.

Used by the overlap and the inter-token-latency measurements. Every step is one
`prepare_batch` + `execute_batch` + `poll_completions`, the three calls B1 allows.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.harness import bench_runner, close_runtime, make_runtime
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote


class Decode:
    """B decoding requests of `context` tokens, plus `extents` backed-up, demoted prefixes of `extent_pages`."""

    def __init__(
        self,
        args: Any,
        device: torch.device,
        *,
        extents: int,
        extent_pages: int,
        growth: int,
        l2_extra: int = 0,
        l1_extra: int = 0,
        width_mult: int | None = None,
        runtime_options: dict | None = None,
    ):
        self.args, self.device = args, device
        ps = self.page_size = args.overlap_page_size
        batch, context = args.decode_batch, args.context
        row_tokens = context + growth
        max_tokens = max(row_tokens, extent_pages * ps + 4 * ps)
        l1 = batch * -(-row_tokens // ps) + (extents + 4) * (extent_pages + 2) + l1_extra + 64
        l2 = extents * extent_pages + l2_extra + 64
        #: the bench model the runtime runs (its `marks` record compute events)
        self.runner = bench_runner(args, device, read_context=True, max_new_tokens=256, width_mult=width_mult)
        self.rt = rt = make_runtime(
            args,
            device,
            self.runner,
            page_size=ps,
            max_requests=batch + 4,
            max_request_tokens=max_tokens,
            l1_pages=l1,
            l2_pages=l2,
            **(runtime_options or {}),
        )
        try:
            self.requests = [rt.open_request() for _ in range(batch)]
            rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(BatchItem(r, (1,) * context) for r in self.requests))))
            self.extents = []
            for _ in range(extents):
                request = rt.open_request()
                rt.execute_batch(rt.prepare_batch(BatchPlan((BatchItem(request, (1,) * (extent_pages * ps)),))))
                self.extents.append(rt.publish(request, 0, extent_pages))
                rt.close_request(request)
            if self.extents:
                rt.submit(tuple(Backup(x) for x in self.extents))
                rt.wait_completions()
                rt.submit(tuple(Demote(x) for x in self.extents))
        except BaseException:
            close_runtime(rt)
            raise
        self.page_bytes = rt.info().page_bytes

    def decode_items(self) -> tuple[BatchItem, ...]:
        return tuple(BatchItem(r, (1,)) for r in self.requests)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        close_runtime(self.rt)


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
