"""SGLang regressions: defects injected into SGLang's live objects, each a runtime factory like the adapter's.

Each regression replaces one method of one of the objects `stack.build_stack` made (the
instance attribute shadows the class's, so nothing else in the process changes) with
SGLang's own method plus the defect; the adapter is unchanged. A regression is *killed*
when the gate fails on it: a conformance check finds a violation whose signature is not
in the shipped expected-failures file. A crash (`crashes with ...`) does not count; the
search then sets it aside and goes on, as the suite does with known violations.

The search runs with SGLang's own scheduler checks off (`sglang_checks=False`; checks.py):
a kill is then a contract violation the suite's checks and probe() find, never a crash. With
them on, as the gate's conformance stage runs them (checks.RUN), a regression they see
crashes the call where it acts (`free_req_keeps_row`, `row_reused_while_live`:
`SGLangCheck[idle-req-pool-leak]` at the first close that leaves no request open; on the
unified trees `alloc_keeps_pages_free`: `SGLangCheck[kv-page-use-after-free]` at its first
allocation), and a search that sets crashes aside would find little behind it; the gate fails
on that crash all the same, since no expected-failures entry is a check of SGLang's that the
adapter's use fails (tests/sglang/test_trees.py shows these checks under their ids).

Out of reach on SGLang's synchronous CPU path (every copy has finished when the call
returns, `io_backend="direct"`), so not injected rather than faked: a load-back that does
not wait for its backup, an ack reported before its copy finished, a device page reused
while a D2H copy still reads it (S7 shows SGLang never defers that free; on CPU the copy is
already done), a layer read before `layer_done_counter` says it is loaded.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .adapter import SGLangRuntime
from .stack import Stack

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected-failures.toml"
FACTORY = "conformance.adapters.sglang.regressions:make_runtime"


@dataclass(frozen=True)
class Regression:
    """One injected defect: what it breaks (the invariant a scheduler relies on) and how."""

    invariant: str
    about: str
    inject: Callable[[Stack], None]


def _alloc_keeps_pages_free(s: Stack) -> None:
    allocator, alloc, release = s.allocator, s.allocator.alloc, s.allocator._release_page_ids

    def defective(need_size, *args, **kwargs):
        out = alloc(need_size, *args, **kwargs)
        if out is not None:  # the pages handed out stay on the free list: two requests share a page
            release(out[:: allocator.page_size] // allocator.page_size)
        return out

    allocator.alloc = defective


def _free_drops_pages(s: Stack) -> None:
    s.allocator.free = lambda free_index: None  # a leak: freed pages never return


def _free_segment_drops_pages(s: Stack) -> None:
    s.allocator.free_segment = lambda free_index, *, start_pos: None  # the tree's evictions leak


def _alloc_rows_no_generation(s: Stack) -> None:
    pool = s.req_to_token_pool
    alloc_rows = pool.alloc_rows

    def defective(need_size):
        rows = alloc_rows(need_size)
        if rows:
            pool.req_generation[rows] -= 1  # req_generation no longer bumped at hand-out
        return rows

    pool.alloc_rows = defective


def _row_reused_while_live(s: Stack) -> None:
    pool = s.req_to_token_pool
    alloc_rows = pool.alloc_rows

    def defective(need_size):
        rows = alloc_rows(need_size)
        if rows:
            pool.free_slots.extend(rows)  # the row stays on the free list: handed out again while live
        return rows

    pool.alloc_rows = defective


def _free_req_keeps_row(s: Stack) -> None:
    pool = s.req_to_token_pool

    def defective(req):
        assert req.kv.holds_kv, "request must have req_pool_idx"
        req.kv.req_pool_idx = None  # the row is never put back: rows leak

    pool.free = defective


def _dec_lock_ref_noop(s: Stack) -> None:
    tree = s.tree
    tree.dec_lock_ref = lambda node, params=None: None  # a lock ref not decremented: entries never evicted


def _dec_lock_ref_twice(s: Stack) -> None:
    tree, dec = s.tree, s.tree.dec_lock_ref

    def defective(node, params=None):
        dec(node, params)
        return dec(node, params)  # one release drops two locks: a locked entry is evicted

    tree.dec_lock_ref = defective


def _inc_lock_ref_noop(s: Stack) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import IncLockRefResult

    s.tree.inc_lock_ref = lambda node: IncLockRefResult(delta=0)  # eviction of a node a request holds


def _insert_frees_its_pages(s: Stack) -> None:
    tree, insert, allocator = s.tree, s.tree.insert, s.allocator

    def defective(params):
        result = insert(params)
        if params.value is not None and len(params.value):
            allocator.free(params.value)  # a free of pages still referenced by the tree
        return result

    tree.insert = defective


def _host_free_twice(s: Stack) -> None:
    host = s.host_pool
    free = host.free

    def defective(indices):
        n = free(indices)
        host.release_slots.append(indices.cpu())  # the host index goes on the free list twice
        host.num_release_slots += len(indices)
        return n

    host.free = defective


def _host_alloc_in_use(s: Stack) -> None:
    host = s.host_pool
    alloc = host.alloc

    def defective(need_size):
        out = alloc(need_size)
        if out is not None:  # the indices handed out stay free: the next alloc returns them again
            host.slot_used[out] = False
            host.release_slots.append(out.clone())
            host.num_release_slots += len(out)
        return out

    host.alloc = defective


def _match_returns_evicted(s: Stack) -> None:
    tree, delete = s.tree, s.tree._delete_leaf

    def defective(node):
        delete(node)
        node.parent.children[node.key.child_key(tree.page_size)] = node  # the evicted node stays matchable

    tree._delete_leaf = defective


def _split_loses_lock(s: Stack) -> None:
    tree, split = s.tree, s.tree._split_node

    def defective(key, child, split_len):
        new = split(key, child, split_len)
        new.lock_ref = 0  # the new parent forgets the locks through it: evictable while held
        return new

    tree._split_node = defective


REGRESSIONS: dict[str, Regression] = {
    "alloc_keeps_pages_free": Regression("R2", "PagedTokenToKVPoolAllocator.alloc leaves the pages it hands out on the free list", _alloc_keeps_pages_free),
    "free_drops_pages": Regression("R1", "PagedTokenToKVPoolAllocator.free drops the pages (leak)", _free_drops_pages),
    "free_segment_drops_pages": Regression("R1", "PagedTokenToKVPoolAllocator.free_segment drops the pages (tree evictions leak)", _free_segment_drops_pages),
    "alloc_rows_no_generation": Regression("H2", "ReqToTokenPool.alloc_rows no longer bumps req_generation", _alloc_rows_no_generation),
    "row_reused_while_live": Regression("H3", "ReqToTokenPool.alloc_rows leaves the row on the free list (a row reused while live)", _row_reused_while_live),
    "free_req_keeps_row": Regression("R1", "ReqToTokenPool.free(req) never returns the row (rows leak)", _free_req_keeps_row),
    "dec_lock_ref_noop": Regression("E4", "RadixCache.dec_lock_ref does not decrement (entries never evicted)", _dec_lock_ref_noop),
    "dec_lock_ref_twice": Regression("E1", "RadixCache.dec_lock_ref decrements twice (a locked entry is evicted)", _dec_lock_ref_twice),
    "inc_lock_ref_noop": Regression("E1", "RadixCache.inc_lock_ref does not lock (eviction of a node a request holds)", _inc_lock_ref_noop),
    "insert_frees_its_pages": Regression("R3", "RadixCache.insert frees the pages it inserts (a free of pages the tree references)", _insert_frees_its_pages),
    "host_free_twice": Regression("R4", "host pool free puts a host index on the free list twice", _host_free_twice),
    "host_alloc_in_use": Regression("R2", "host pool alloc returns indices already in use", _host_alloc_in_use),
    "match_returns_evicted": Regression("E2", "RadixCache._delete_leaf leaves the node matchable (a match returns an evicted node)", _match_returns_evicted),
    "split_loses_lock": Regression("E1", "RadixCache._split_node drops the lock count of the new parent", _split_loses_lock),
}


#: Regressions the gate does not catch today, and why. With INTROSPECTION (probe() read off
#: SGLang's allocator, rows, tree and host pool, issue 16 item 3) an aliased, leaked or
#: doubly freed page breaks R1/R2/R4 at the call where it happens. The two that changed only
#: a request's generation or row (`alloc_rows_no_generation`, `row_reused_while_live`)
#: survived while the adapter's handles carried the row's own generation under a slot name
#: (report F6, whose expected signatures they matched); since handles name SGLang's pair
#: (row, req_generation) and F6's signatures are gone, both die (`H2 open_request`,
#: `probe:slots open_request`).
SURVIVORS: dict[str, str] = {}

#: The baseline: today's SGLang, nothing injected. The search must find nothing new on it,
#: or a "kill" could be a violation today's SGLang has too, reached by another search path.
BASELINE = "none"


def make_runtime(regression: str, **options) -> SGLangRuntime:
    """The adapter over a stack with `regression` injected into SGLang's live objects (`none`: nothing)."""
    if regression != BASELINE and regression not in REGRESSIONS:
        raise ValueError(f"unknown SGLang regression {regression!r}; known: {BASELINE}, {', '.join(REGRESSIONS)}")
    rt = SGLangRuntime(**options)
    if regression != BASELINE:
        REGRESSIONS[regression].inject(rt.sg)
    return rt


#: The adapter configurations the gate runs (scripts/gate_sglang.sh CONFIGS, kept equal by
#: tests/sglang/test_gate.py): the default sizes, and small pools, where running out of
#: rows, device and host pages is common, so leaks and double frees change what is refused.
CONFIGURATIONS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("l1_pages", 16), ("l2_pages", 32), ("page_size", 4)),
    (("l1_pages", 6), ("l2_pages", 6), ("max_requests", 3)),
)

#: Distinct violations a kill search sets aside (expected ones, then crashes) before it gives up.
MAX_SEARCH = 8


def new_violations(name: str, checks=("core", "tiers"), crashes: bool = False):
    """Yield (check, violation) for each violation not in the expected-failures file that the search meets with `name` injected.

    Per configuration and check, every signature of the expected-failures file is set
    aside from the start (so the search looks only for new ones); each one found is set
    aside in turn and the search goes on. Crashes are yielded only with `crashes`, since a
    crash does not count as a kill.
    """
    from cacheruntime.conformance import expected as expected_file
    from cacheruntime.conformance.profiles import profile
    from cacheruntime.conformance.runner import _run_once
    from cacheruntime.conformance.target import Target

    settings = profile("ci", shrink=False)
    known = frozenset(e.signature for e in expected_file.load(str(EXPECTED)))
    for options in CONFIGURATIONS:
        target = Target(FACTORY, tuple(sorted((("regression", name), ("sglang_checks", False), *options))))
        for check in checks:
            aside = known
            for _ in range(MAX_SEARCH):
                found = _run_once(target, check, settings, aside)
                if found is None or str(found.signature) in aside:
                    break
                crash = found.signature.kind.startswith("crashes with") or "crash" in found.signature.ids
                if crashes or not crash:
                    yield f"{check} ({' '.join(f'{k}={v}' for k, v in options)})", found
                aside |= {str(found.signature)}


def first_new_violation(name: str, checks=("core", "tiers")):
    """The first violation, not a crash, that would fail the gate with `name` injected: (check, violation), or None."""
    return next(new_violations(name, checks), None)


def main(argv: list[str]) -> int:
    if argv == ["--baseline"]:  # today's SGLang: every signature the search meets that the file lacks, as refresh_expected.py reads them
        found = [str(v.signature) for _, v in new_violations(BASELINE, crashes=True)]
        for signature in dict.fromkeys(found):
            print(f"  NEW      {signature}")
        print(f"baseline: {len(found)} signature(s) missing from {EXPECTED.name}")
        return 1 if found else 0
    names = argv or list(REGRESSIONS)
    print(f"{'regression':26} {'id':3} {'killed':6} {'seconds':>7}  signature (new to the expected-failures file), check (configuration)")
    survivors = []
    for name in [BASELINE, *names]:
        started = time.monotonic()
        found = first_new_violation(name)
        seconds = time.monotonic() - started
        check, violation = found if found else ("-", None)
        if name == BASELINE:
            print(f"{name:26} {'-':3} {'KILLED' if found else 'passes':6} {seconds:7.1f}  (the baseline must pass) {violation.signature if violation else ''}")
            if found:
                print("today's SGLang fails the search: the expected-failures file misses a signature (refresh it with --baseline)")
                return 2
            continue
        if found is None:
            survivors.append(name)
        print(f"{name:26} {REGRESSIONS[name].invariant:3} {'yes' if found else 'NO':6} {seconds:7.1f}  {violation.signature if violation else '-'}, {check}")
    print(f"{len(names) - len(survivors)}/{len(names)} SGLang regressions fail the gate; survivors: {', '.join(survivors) or 'none'}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
