"""Rewrite expected-failures.toml from a conformance run of the SGLang adapter.

    PYTHONPATH=.:conformance/adapters/sglang/stubs .venv-sglang/bin/python -m cacheruntime.cli conformance \
        --runtime conformance.adapters.sglang.adapter:make_runtime --no-shrink > run.txt
    python conformance/adapters/sglang/refresh_expected.py run.txt [run2.txt ...]

One run per gate configuration (scripts/gate_sglang.sh: the legacy tree at two sizes, the
unified tree on the Rust and on the Python TreeCore); the file is the union of their
signatures.

Every check keeps going past each violation it finds, so the run's `NEW` lines are every
signature the CI profile reaches; which ones it reaches can move when the suite's
strategies change, and then the file is refreshed with this script. Each signature gets
the reason of the finding of docs/sglang-report.md it belongs to (`FINDINGS`, matched by
prefix); a signature no finding covers stops the script, so a new kind of violation is
looked at before it is ever tolerated.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (a part of the signature, the reason) for SGLang's own invariant checks (checks.py), which
#: show under any id and operation: looked up before FINDINGS. Only an SGLang defect may be
#: listed here: a check that fails because of an adapter limitation (the pool conservation,
#: `busy-pool-leak` / `idle-pool-leak`, on overlapping extents and the legacy tree's Demote)
#: does not run in the gate's configurations (checks.RUN), and a run that has it is refused below.
CHECK_FINDINGS: list[tuple[str, str]] = []
#: SGLang's checks that the gate's configurations do not run (checks.RUN): their failures report the adapter.
ADAPTER_LIMITED_CHECKS = ("SGLangCheck[busy-pool-leak]", "SGLangCheck[idle-pool-leak]")

#: (signature prefixes, the reason every signature starting with one of them is tolerated)
FINDINGS: list[tuple[tuple[str, ...], str]] = [
    (
        (
            "H1 release: crashes with KeyError",
            "H1 retain: crashes with KeyError",
            "H1 release: crashes with RuntimeError",
            "H1 retain: crashes with RuntimeError",
        ),
        "F3 (where the check lives, UnifiedRadixCache): both TreeCores refuse a lock or unlock of an entry they evicted (the node id is gone: "
        "KeyError, unified_tree_core.py node_by_id / the Rust binding), a second unlock of a live one (lock_ref=0) and an unlock with no "
        "receipt of the holder's own (the receipt check, _assert_receipt_anchor, unified_tree_core.py:745-751): AssertionError in the Python "
        "core, a panic raised as RuntimeError by the Rust core, which then refuses every later call (mutex poisoned); a rejection, untyped, "
        "where the legacy RadixCache underflows (F2)",
    ),
    (
        (
            "contract:prepare_batch prepare_batch: raises OutOfPages where the model returns",
            "contract:prepare_batch prepare_batch: raises OutOfPages where the model raises OutOfPages",
        ),
        "F14 (adapter limitation, seen as running out without probe()): SGLang frees a device page only with the tree entry that holds it; a "
        "split's first part is the parent node and a page two publishes put in two entries stays with the other, so the pool runs out "
        "sooner than the contract's (on the unified trees, which claim no INTROSPECTION, this is where F14 shows)",
    ),
    (
        (
            "contract:poll_completions poll_completions: reports a transfer the model does not have",
            "contract:wait_completions wait_completions: reports a transfer the model does not have",
        ),
        "F16 with F12 (the unified tree's HiCache, write-back configuration): a plan whose Drop is refused (Unsupported, F16) after its "
        "Backup already reached HybridCacheController.write: nothing undoes the started backup (no batch layer, F12), so the failed "
        "execute_batch's transfer is reported later, a transfer the contract's failed batch never started",
    ),
    (
        ("H1 execute_batch: changes state when it raises",),
        "F12 (where the check lives, seen through probe()): SGLang's cache classes have no batch layer, so nothing undoes a batch's compute "
        "(its rows' token counts) when one of the plan's tier moves then runs out (HiCacheController.write returns None, managers/cache_controller.py)",
    ),
    (
        ("probe:free release", "probe:free close_request", "probe:pages,probe:free submit", "probe:pages,probe:free release"),
        "F14 (adapter limitation, seen through probe()): SGLang frees a device page only with the tree entry that holds it, and an entry only "
        "as an unlocked leaf (RadixCache.evict, radix_cache.py:552-580); a split's first part is the parent node, so its pages stay while the "
        "rest lives, and a page two publishes put in two entries stays with the other; the contract frees a page when its last holder goes",
    ),
    (
        ("contract:prepare_batch prepare_batch: crashes with TypeError where the model returns", "contract:split split: crashes with TypeError"),
        "F11 (adapter limitation, CPU setup): the legacy RadixCache's match_prefix gathers the device value of every node on the path "
        "(radix_cache.py:409-416) and _split_node slices the child's value (:686); both fail on a demoted entry (value None, as "
        "HiRadixCache._evict_backuped leaves it, the adapter's Demote stand-in); HiRadixCache's match stops at evicted nodes instead",
    ),
    (
        ("H1 close_request: crashes with AssertionError", "H1 execute_batch: crashes with AssertionError"),
        "F1 (where the check lives): ReqToTokenPool.free(req) refuses a Req that holds no row (a stale or double close, also as a plan's Close) "
        "with a bare `assert req.kv.holds_kv` (sglang/srt/mem_cache/memory_pool.py:462-463) before it changes anything: the check exists, as "
        "an assert, not a typed error (python -O removes it)",
    ),
    (
        ("H1 release: crashes with AssertionError",),
        "F2 (SGLang defect, legacy RadixCache): a second release of an extent reaches its tree entry unchanged (entries carry no generation): "
        "dec_lock_ref underflows to -1 (radix_cache.py:597-616); an entry left unlocked is evicted again, free_segment puts its pages on the "
        "free list a second time (allocator/paged.py:340-357, no double-free check) and only then _delete_leaf asserts (radix_cache.py:780-783). "
        "On the unified trees the same signature is F3: the Python TreeCore's asserts refuse the unlock (lock_ref=0, or a holder with no receipt left)",
    ),
    (
        ("H1 release: returns", "H1 retain: returns", "H1 prepare_batch: returns"),
        "F4 (where the check lives): a stale extent ref whose tree entry is still in the tree (a split's original, whose node is the rest's; "
        "a released ref whose entry another holder locks) reaches inc_lock_ref/dec_lock_ref of that node (radix_cache.py:582-616: a node, no "
        "generation) and is accepted: retain takes a lock no holder gives back, release drops another holder's lock (the legacy tree takes no "
        "receipt), a plan's Release of it is prepared; the scheduler owns each lock it takes and drops it once (common.py:434-435)",
    ),
    (
        ("H1 ",),
        "F5 (where the check lives): a finished request's handle still names its Req, whose row is a bare index (ReqToTokenPool.write, "
        "memory_pool.py:413-414); the tree's insert takes a key and a value, no request (radix_cache.py:428-448), so publish inserts for it, and "
        "prepare_batch and execute_batch write or read the old row; SGLang's scheduler never acts for a finished Req",
    ),
    (
        (
            "contract:retain retain: raises UnknownHandle where the model raises StaleHandle",
            "contract:release release: raises UnknownHandle where the model raises StaleHandle",
        ),
        "F4's adapter side (adapter limitation; not reached in docs/sglang-report.md's run): tree entries carry no generation, so the adapter "
        "matches a ref's page runs against what its entry names now, before it asks whether the entry is still live; after a split the entry "
        "names fewer pages, and a stale ref to it, or a ref with other runs to an extent already released, reads as never issued "
        "(UnknownHandle) where the contract says StaleHandle",
    ),
    (
        (
            "contract:submit submit: crashes with RuntimeError",
            "contract:submit submit: crashes with AssertionError",
            "contract:execute_batch execute_batch: crashes with RuntimeError where the model raises ExtentInUse",
            "contract:execute_batch execute_batch: crashes with RuntimeError where the model raises NotBackedUp",
        ),
        "F15 (where the check lives, the unified tree's HiCache): a protocol extent's reference is a lock, so its Demote is "
        "tree_core.demote of a locked entry, which SGLang's eviction never makes (_evict_components demotes leaves its walk picks, "
        "unified_radix_cache.py:952-1058; the walk skips locked nodes). demote itself checks only `not node.evicted and node.backuped` "
        "(unified_tree_core.py:2077-2098): the Python TreeCore demotes the locked entry and its evictable size goes negative; the Rust "
        "TreeCore panics (`dec_evictable_size: Full evictable size underflow`, raised as RuntimeError) and then refuses every call; a Demote "
        "of an entry demoted already is refused by the Python core's assert (AssertionError) where the contract's Demote moves nothing",
    ),
    (
        ("contract:submit submit: raises Unsupported", "contract:execute_batch execute_batch: raises Unsupported"),
        "F16 (adapter limitation, the unified tree's HiCache): 0.5.23's unified tree has no per-entry host drop: evict_host(num_tokens) "
        "(unified_radix_cache.py:1433-1445) evicts the least recently used host leaves (tree_core.drive_host_eviction), and the TreeCores' "
        "host-leaf eviction (_evict_host_leaf) is private, so the adapter refuses a Drop before any SGLang call (Unsupported)",
    ),
    (
        ("contract:submit submit: returns where the model raises OutOfPages",),
        "F8 on the legacy tree (adapter limitation, CPU setup: a Backup after a same-call Backup and Drop reuses the dropped host page the "
        "contract still holds); F18 on the unified tree's HiCache (where the work happens): a backup short of host room evicts other "
        "entries' host copies first (_execute_kv_backup -> evict_host(needed), unified_radix_cache.py:1737-1757, least recently used "
        "host leaves), so a Backup the contract refuses with OutOfPages(L2) (its host tier is freed only by Drop and Release) succeeds",
    ),
    (
        ("contract:submit submit: returns another value",),
        "F17 (where the work happens, the unified tree's HiCache with write_through): the tree backs an entry up when it is inserted "
        "(write_through_threshold 1, unified_radix_cache.py:558-560; the insert's BackupKV action, :1409-1413), so a protocol Backup of a "
        "published extent finds its host copy made and moves 0 pages where the contract moves them at the Backup",
    ),
    (
        ("contract:submit submit: returns where the model raises OutOfPages"),
        'F8 (adapter limitation, CPU setup): HiCacheController.write finishes the copy inside the call on io_backend="direct" '
        "(managers/cache_controller.py:864-926), so the pages a backup in flight holds in the contract are free already: a Restore after a "
        "same-call Backup and Demote counts pages the contract still has on the device (the model keeps a demoted page's device copy until "
        "the backup lands), and a Backup after a same-call Backup and Drop reuses the dropped host page the contract still holds",
    ),
    (
        (
            "contract:submit ",
            "contract:execute_batch execute_batch: returns where the model raises ExtentInUse",
            "contract:execute_batch execute_batch: returns where the model raises WouldLoseData",
            "contract:execute_batch execute_batch: returns where the model raises NotBackedUp",
        ),
        "F7 (where the check lives): Demote = allocator.free of the device pages (mem_cache/allocator/paged.py:328-338), Drop = "
        "HiCacheController.evict_host (managers/cache_controller.py:1071-1076), with no host-copy, in-use or last-copy check; the guards are "
        "the tree's (unified_tree_core.py:2090-2098 demotes only backed-up, unevicted nodes; :2195-2210 eviction skips locked ones), not the "
        "runtime classes'",
    ),
    (
        (
            "contract:publish ",
            "contract:execute_batch execute_batch: returns where the model raises InvalidPageRun",
            "contract:split split: returns where the model raises InvalidPageRun",
        ),
        "F9: publish goes SGLang's insert path (RadixCache._insert_cache, radix_cache.py:450-483): the computed tokens' key cut by "
        "RadixKey.page_aligned and the row's req_to_token slice as long as the key, and split the tree's match of the first part's key; "
        "a slice clamps, so an empty, out-of-row or partly computed range is inserted short instead of refused with InvalidPageRun",
    ),
    (
        ("contract:close_request ", "contract:execute_batch execute_batch: returns where the model raises RequestBusy"),
        "F13 (where the check lives): close_request (or a plan's Close) of a request in a prepared, unexecuted batch frees its row "
        "(ReqToTokenPool.free, memory_pool.py:462-465, has no busy state)",
    ),
    (
        ("contract:prepare_batch ", "O4 ", "contract:cancel_batch ", "contract:execute_batch "),
        "F12 (where the check lives): SGLang's cache classes have no batch layer (ScheduleBatch in managers/schedule_batch.py and the "
        "scheduler's PrefillAdder are the scheduler's): empty plans, appends without an output, executing twice or out of order (a Close or "
        "Release then reaching SGLang's asserts), cancelling an executed, unprepared or depended-on batch are not refused",
    ),
    (
        ("contract:split ",),
        "F10 (adapter limitation): split = the tree's node split (match_prefix of the first part, _split_node, radix_cache.py:677-700, which "
        "copies lock_ref to the new parent): SGLang has no extent references to count, so it splits an entry other references lock",
    ),
]

HEADER = """\
# Known contract violations of SGLang 0.5.23 through conformance/adapters/sglang/adapter.py,
# in the suite's format (src/cacheruntime/conformance/expected.py): one [[expected]] per
# violation, named by its signature (`ids operation: kind`, as the suite prints it on a
# NEW line), `reason` = the finding of docs/sglang-report.md it belongs to.
#
#   cacheruntime conformance --runtime conformance.adapters.sglang.adapter:make_runtime \\
#       --expected conformance/adapters/sglang/expected-failures.toml [--no-shrink]
#
# exits 0 on today's SGLang. Each check keeps going past every violation it finds, so this
# is every signature the CI profile reaches on core and tiers, and a new kind of violation,
# even under an id or in an operation already listed, fails the gate. Written by
# refresh_expected.py from a run; refresh it the same way when the suite's strategies change.
"""


def reason(signature: str) -> str:
    if any(check in signature for check in ADAPTER_LIMITED_CHECKS):
        raise SystemExit(f"{signature!r}: a check the adapter's limitations fail (checks.RUN); the gate does not run it, so no entry may tolerate it")
    for part, why in CHECK_FINDINGS:
        if part in signature:
            return why
    for prefixes, why in FINDINGS:
        if signature.startswith(prefixes):
            return why
    raise SystemExit(f"no finding covers {signature!r}: look at it (docs/sglang-report.md) before tolerating it")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: refresh_expected.py RUN_OUTPUT [RUN_OUTPUT ...]")
    signatures = sorted({s for run in sys.argv[1:] for s in re.findall(r"^  (?:NEW|expected)\s+(.+?)(?:  \(.*\))?$", Path(run).read_text(), flags=re.M)})
    if not signatures:
        raise SystemExit(f"{sys.argv[1:]} name no violation: are they the output of `cacheruntime conformance`?")
    body = "".join(f"\n[[expected]]\nsignature = {json.dumps(s)}\nreason = {json.dumps(reason(s))}\n" for s in signatures)
    (HERE / "expected-failures.toml").write_text(HEADER + body)
    print(f"{len(signatures)} signatures written to {HERE / 'expected-failures.toml'}")


if __name__ == "__main__":
    main()
