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

Which of them run (`RUN`, per tree configuration; notes.md says why, per id): a check runs only
where the adapter's use of SGLang satisfies it on today's SGLang, so that each failure reports
SGLang, not the adapter. The two pool-conservation checks (`busy-pool-leak`, `idle-pool-leak`:
available + evictable + protected (+ uncached) == total) count a page once per tree entry that
holds it; the protocol's extents may overlap (two publishes of one page, a split's parts), which
the adapter can only show as two tree entries naming one page (SGLang's scheduler never makes
that), and on the legacy tree a Demote leaves RadixCache's protected count with the entry
(HiRadixCache's own demote is not what runs). They fire on those adapter limitations in every
configuration, so by default they do not run. On the legacy tree the page invariants
(`kv-page-use-after-free`, and with it the double-free and length checks of the same SGLang
function) do not run either: the adapter's Demote there is its own stand-in for a tree-side
demotion that 0.5.23's legacy tree does not have (HiRadixCache is gone; the unified tree
demotes only unlocked nodes), `allocator.free` of the entry's pages, which frees a page a live
row maps (V6) where SGLang's tree would not, and SGLang's use-after-free check reports that.
The unified configurations have no tier moves (no host tier), so they run the page
invariants. `sglang_checks="all"` runs every group (to see the above, or on a scenario without
overlap and Demote), `sglang_checks=False` none.

What the adapter supplies, translation only: the Req shells' `rid`, and
`kv.cache_protected_len`, the tokens of the row the tree holds (its pages that a tree entry
names; SGLang's scheduler sets it to the prefix it matched or inserted). The adapter checks
nothing itself here: each verdict is SGLang's.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

# SGLang's message -> the check's id (the first prefix that matches).
# _check_req_pool's message contains _report_leak's ("pool memory leak detected"): it goes first.
CHECK_IDS = (
    ("KV double free", "kv-page-double-free"),
    ("KV page use-after-free", "kv-page-use-after-free"),
    ("Full Pool Mem Leak Detected", "busy-pool-leak"),
    ("req_to_token_pool memory leak detected", "idle-req-pool-leak"),
    ("pool memory leak detected", "idle-pool-leak"),
)
#: The groups of SGLang's checks, each one SGLang function (the ids it reports): the adapter
#: runs a group whole or not at all.
GROUPS: dict[str, tuple[str, ...]] = {
    # Scheduler.on_idle: SchedulerInvariantChecker._check_all_pools, then _report_leak on a leak.
    "idle-conservation": ("idle-pool-leak",),
    # Scheduler.on_idle: SchedulerInvariantChecker._check_req_pool (every request row free).
    "idle-req-pool": ("idle-req-pool-leak",),
    # self_check_during_busy up to its conservation asserts (_get_total_uncached_sizes, _check_full_pool).
    "busy-conservation": ("busy-pool-leak",),
    # self_check_during_busy's tail with SGLANG_CHECK_KV_PAGE_INVARIANTS: _check_kv_page_invariants.
    "busy-page-invariants": ("kv-len-order", "kv-page-double-free", "kv-page-use-after-free"),
}
#: The groups the default (`sglang_checks=True`) runs, per tree configuration (stack.TREES):
#: not the two conservation checks, which the adapter's overlapping extents (all configurations)
#: and the legacy tree's Demote fail, and on the legacy tree not the page invariants either,
#: whose use-after-free check fails on the adapter's Demote (module docstring, notes.md).
RUN: dict[str, tuple[str, ...]] = {
    "radix": ("idle-req-pool",),
    "unified-rust": ("idle-req-pool", "busy-page-invariants"),
    "unified-python": ("idle-req-pool", "busy-page-invariants"),
}
#: With a host tier, where it differs from RUN: on the unified trees the Demote is the tree's own
#: (`tree_core.demote`), which SGLang's eviction walk calls only on unlocked entries and which
#: makes no lock check; a protocol extent's reference is a lock, so the adapter demotes a locked
#: entry, whose pages a live row may still map (V6), and the use-after-free check reports that.
RUN_L2: dict[str, tuple[str, ...]] = {
    "unified-rust": ("idle-req-pool",),
    "unified-python": ("idle-req-pool",),
}
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


def selected(option: bool | str, tree: str, l2: bool = False) -> tuple[str, ...]:
    """The groups the adapter option `sglang_checks` selects on `tree`: True RUN[tree] (RUN_L2 with a host tier), "all" every group, False none."""
    if option is True:
        return RUN_L2.get(tree, RUN[tree]) if l2 else RUN[tree]
    if option == "all":
        return tuple(GROUPS)
    if option is False:
        return ()
    raise ValueError(f"sglang_checks={option!r}: True (the checks the adapter satisfies on this tree), 'all' or False")


class Checks:
    """SGLang's SchedulerInvariantChecker over one adapter's stack, running the selected groups."""

    def __init__(self, runtime, groups: tuple[str, ...]) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
        from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver

        os.environ.update(SWITCHES)  # read at each check (envs.X.get())
        sg = runtime.sg
        self.runtime = runtime
        unknown = set(groups) - set(GROUPS)
        if unknown:
            raise ValueError(f"unknown SGLang check group(s) {sorted(unknown)}; known: {list(GROUPS)}")
        # self_check_during_busy runs the page invariants after its conservation (switch on):
        # a selection with the busy conservation has the page invariants too.
        assert "busy-conservation" not in groups or "busy-page-invariants" in groups, groups
        self.groups = frozenset(groups)
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
        """The idle checks with no request open, else the busy ones (the groups selected); a failure raises SGLangCheckFailed."""
        from sglang.srt.runtime_context import get_parallel

        rt, groups = self.runtime, self.groups
        live = [rt._request(h) for h in rt.live_slots.values()]
        try:
            # No parallel config is published on CPU: state the one-rank value the scheduler
            # of a single GPU publishes (no decode context parallelism); the pool check reads it.
            if not live:
                self.batch.reqs = []
                if "idle-conservation" in groups:
                    with get_parallel().override(dcp_enabled=False):
                        has_leak, messages = self.checker._check_all_pools(self.observer.get_pool_stats())
                    if has_leak:
                        self.checker._report_leak("pool", "\n".join(messages))
                if "idle-req-pool" in groups:
                    self.checker._check_req_pool()
                return
            if "busy-conservation" in groups:
                tree_pages = rt._named_elsewhere(rows=False)
                for record in live:
                    record.req.kv.cache_protected_len = self._protected_len(record, tree_pages)
            self.batch.reqs = [record.req for record in live]
            if "busy-conservation" in groups:  # SGLang's own method: the conservation, then (switch on) the page invariants
                with get_parallel().override(dcp_enabled=False):
                    self.checker.self_check_during_busy()
            elif "busy-page-invariants" in groups:  # what self_check_during_busy runs after its conservation asserts
                self.checker._check_kv_page_invariants()
        except (AssertionError, ValueError) as error:
            raise failure(classify(error), str(error).splitlines()[0] if str(error) else type(error).__name__) from error
