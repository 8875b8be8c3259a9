"""SGLang's own scheduler-side invariant checks, switched on and run on the adapter's stack.

SGLang 0.5.23 checks its pools in the scheduler (`managers/scheduler_components/
invariant_checker.py`, `SchedulerInvariantChecker`), not in the cache classes:

- idle (on by default; strict by default, `SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE`):
  when no request runs, `Scheduler.on_idle` calls `_check_all_pools` (available + evictable +
  protected == total), `_report_leak` on a leak, and `_check_req_pool` (every request row free);
- busy (`SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY`, off by default): after each batch,
  `self_check_during_busy` (the same conservation, counting each running request's private
  KV) and, with `SGLANG_CHECK_KV_PAGE_INVARIANTS`, `_check_kv_page_invariants`: no page on the
  free list twice (double free) and no page a request row names on the free list
  (use-after-free).

`Checks` builds SGLang's own `SchedulerInvariantChecker` and `SchedulerPoolStatsObserver`
over the adapter's stack with all three switches on, and runs them where the scheduler
does: the idle checks after a boundary call that leaves no request open, the busy checks
after one that leaves a request open (the scheduler's running batch: the open requests).
A failure of theirs (SGLang raises ValueError, strict, or AssertionError) is raised from
the boundary call as `SGLangCheckFailed` under the check's id (`CHECK_IDS`), so the suite
reports `crashes with SGLangCheck[<id>]` in the call where it happened.

What the adapter supplies, translation only: the Req shells' `rid`, and
`kv.cache_protected_len`, the tokens of the row the tree holds (its pages that a tree entry
names; SGLang's scheduler sets it to the prefix it matched or inserted). The adapter checks
nothing itself here: each verdict is SGLang's.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

# SGLang's message -> the check's id (the first prefix that matches).
CHECK_IDS = (
    ("KV double free", "kv-page-double-free"),
    ("KV page use-after-free", "kv-page-use-after-free"),
    ("Full Pool Mem Leak Detected", "busy-pool-leak"),
    ("pool memory leak detected", "idle-pool-leak"),
    ("req_to_token_pool memory leak detected", "idle-req-pool-leak"),
)
SWITCHES = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
}


class SGLangCheckFailed(AssertionError):
    """One of SGLang's scheduler-side invariant checks failed; `check_id` says which."""

    check_id = "?"


_KINDS: dict[str, type[SGLangCheckFailed]] = {}


def failure(check_id: str, message: str) -> SGLangCheckFailed:
    """The exception for `check_id`: its class name carries the id into the suite's signature."""
    kind = _KINDS.get(check_id)
    if kind is None:
        kind = _KINDS[check_id] = type(f"SGLangCheck[{check_id}]", (SGLangCheckFailed,), {"check_id": check_id})
    return kind(f"SGLang's {check_id} check: {message}")


def classify(error: BaseException) -> str:
    text = str(error)
    for prefix, check_id in CHECK_IDS:
        if prefix in text:
            return check_id
    # The bare assert of _check_kv_page_invariants' _add_owner: committed <= allocated <= row width.
    return "kv-len-order" if isinstance(error, AssertionError) else "unclassified"


class Checks:
    """SGLang's SchedulerInvariantChecker over one adapter's stack."""

    def __init__(self, runtime) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
        from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver

        os.environ.update(SWITCHES)  # read at each check (envs.X.get())
        sg = runtime.sg
        self.runtime = runtime
        total = sg.allocator.size
        self.batch = SimpleNamespace(reqs=[])  # the running batch: the open requests
        observer = SchedulerPoolStatsObserver(
            tree_cache=sg.tree,
            token_to_kv_pool_allocator=sg.allocator,
            req_to_token_pool=sg.req_to_token_pool,
            session_controller=SimpleNamespace(sessions={}),
            hisparse_coordinator=None,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hisparse=False,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=total,
        )
        self.observer = observer
        self.checker = SchedulerInvariantChecker(
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            disaggregation_mode=DisaggregationMode.NULL,
            page_size=sg.page_size,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=total,
            tree_cache=sg.tree,
            token_to_kv_pool_allocator=sg.allocator,
            req_to_token_pool=sg.req_to_token_pool,
            pool_stats_observer=observer,
            get_last_batch=lambda: self.batch if self.batch.reqs else None,
            get_running_batch=lambda: None,
            scheduler_stage_metrics=None,  # no stage timing (scheduler_stage_method runs the check as is)
        )

    def _protected_len(self, record, tree_pages: set[int]) -> int:
        ps = self.runtime.page_size
        pool = self.runtime.sg.req_to_token_pool
        n = record.req.kv.kv_allocated_len
        if not n:
            return 0
        pages = (pool.req_to_token[record.row, :n:ps] // ps).tolist()
        return ps * sum(1 for p in pages if p in tree_pages)

    def run(self) -> None:
        """The idle checks with no request open, else the busy ones; a failure raises SGLangCheckFailed."""
        from sglang.srt.runtime_context import get_parallel

        rt = self.runtime
        live = [rt.requests[h] for h in rt.live_slots.values()]
        try:
            # No parallel config is published on CPU: state the one-rank value the scheduler
            # of a single GPU publishes (no decode context parallelism); the pool check reads it.
            if not live:
                self.batch.reqs = []
                with get_parallel().override(dcp_enabled=False):
                    has_leak, messages = self.checker._check_all_pools(self.observer.get_pool_stats())
                if has_leak:
                    self.checker._report_leak("pool", "\n".join(messages))
                self.checker._check_req_pool()
                return
            tree_pages = rt._named_elsewhere(rows=False)
            for record in live:
                record.req.kv.cache_protected_len = self._protected_len(record, tree_pages)
            self.batch.reqs = [record.req for record in live]
            with get_parallel().override(dcp_enabled=False):
                self.checker.self_check_during_busy()
        except (AssertionError, ValueError) as error:
            raise failure(classify(error), str(error).splitlines()[0] if str(error) else type(error).__name__) from error
