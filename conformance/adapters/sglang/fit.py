"""Fit probe: does this SGLang still have every constructor, method and attribute the adapter uses?

An SGLang refactor that renames or re-signs one of them is not a contract violation: the
adapter no longer fits, and the gate says so apart from violations, with its own exit code
(`EXIT_NO_FIT`), before the suite runs:

    the adapter does not fit this SGLang: sglang.srt.mem_cache.radix_cache.RadixCache.inc_lock_ref (missing)

`USED` lists what adapter.py, stack.py and regressions.py call, with the parameter names
they pass (a call by keyword needs the name; a positional one only the count). Instance
attributes set in constructors are checked on a stack built as the adapter builds it.

    PYTHONPATH=.:conformance/adapters/sglang/stubs .venv-sglang/bin/python -m conformance.adapters.sglang.fit [--junitxml PATH]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from xml.etree import ElementTree

#: Exit code of a fit failure (the suite's are 0 passed, 1 new violation, 2 usage).
EXIT_NO_FIT = 3

#: (dotted name, parameters the adapter passes by name, positional arguments it passes)
USED: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool", ("size", "max_context_len", "device", "enable_memory_saver"), 0),
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.alloc", (), 1),
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.alloc_rows", (), 1),
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.free", (), 1),
    ("sglang.srt.mem_cache.memory_pool.ReqToTokenPool.write", (), 2),
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool", ("start_layer", "end_layer"), 8),
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.get_device_pool_infos", (), 0),
    ("sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator", ("need_sort",), 5),
    ("sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator.alloc", (), 1),
    ("sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator.free", (), 1),
    ("sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator.free_segment", ("start_pos",), 1),
    ("sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator.available_size", (), 0),
    ("sglang.srt.mem_cache.allocator.PagedTokenToKVPoolAllocator._release_page_ids", (), 1),
    ("sglang.srt.mem_cache.allocator.TokenToKVPoolAllocator", ("need_sort",), 4),
    ("sglang.srt.mem_cache.cache_init_params.CacheInitParams", ("disable", "req_to_token_pool", "token_to_kv_pool_allocator", "page_size"), 0),
    (
        "sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost",
        ("pin_memory", "device", "device_capacity_tokens", "start_layer", "end_layer", "write_back_staging", "host_token_capacity"),
        5,
    ),
    ("sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.alloc", (), 1),
    ("sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.free", (), 1),
    ("sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.available_size", (), 0),
    ("sglang.srt.managers.cache_controller.HiCacheController", ("tp_group", "load_cache_event", "io_backend", "write_policy"), 3),
    ("sglang.srt.managers.cache_controller.HiCacheController.write", (), 1),
    ("sglang.srt.managers.cache_controller.HiCacheController.load", (), 1),
    ("sglang.srt.managers.cache_controller.HiCacheController.start_loading", (), 0),
    ("sglang.srt.managers.cache_controller.HiCacheController.evict_host", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache.insert", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache.match_prefix", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache.inc_lock_ref", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache.dec_lock_ref", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache._delete_leaf", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixCache._split_node", (), 3),
    ("sglang.srt.mem_cache.radix_cache.RadixKey", ("token_ids", "extra_key"), 0),
    ("sglang.srt.mem_cache.radix_cache.RadixKey.__getitem__", (), 1),
    ("sglang.srt.mem_cache.radix_cache.RadixKey.child_key", (), 1),
    ("sglang.srt.mem_cache.base_prefix_cache.InsertParams", ("key", "value"), 0),
    ("sglang.srt.mem_cache.base_prefix_cache.MatchPrefixParams", ("key",), 0),
    ("sglang.srt.mem_cache.base_prefix_cache.IncLockRefResult", ("delta",), 0),
    ("sglang.srt.managers.schedule_batch.ReqKvInfo", (), 0),
    # The unified tree's HiCache (stack.hicache_unified, the adapter's tree_hicache paths, cpu_kernels).
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.init_hicache", (), 2),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._apply_cache_action", (), 1),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._execute_and_commit_kv_backup", ("write_back",), 1),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.flush_pending_backups", (), 0),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.is_backuped", (), 1),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.load_back", (), 1),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.ready_to_load_host_cache", (), 0),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.path_device_indices", (), 1),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.check_hicache_events", (), 0),
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.writing_check", ("write_back",), 0),
    ("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore.demote", (), 1),
    ("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore.build_backup_kv_action", (), 1),
    ("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore.is_full_device_evicted", (), 1),
    ("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore.drop_subtree_no_host", (), 1),
    ("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore.evict_device_leaf", (), 2),
    ("sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.demote", (), 1),
    ("sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.build_backup_kv_action", (), 1),
    ("sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.is_full_device_evicted", (), 1),
    ("sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.drop_subtree_no_host", (), 1),
    ("sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.evict_device_leaf", (), 2),
    (
        "sglang.srt.runtime_context.RuntimeContext.override_server_args",
        ("enable_hierarchical_cache", "hicache_io_backend", "hicache_mem_layout", "hicache_host_memory_mode", "hicache_write_policy", "hicache_ratio"),
        0,
    ),
    ("sglang.srt.mem_cache.pool_host.common.alloc_with_host_register", (), 6),
)

#: Instance attributes read or written, per object of the stack (checked on a built stack).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "req_to_token_pool": ("req_to_token", "req_generation", "free_slots"),
    "allocator": ("page_size",),
    "host_pool": ("slot_used", "release_slots", "num_release_slots"),
    "controller": ("ack_write_queue", "ack_load_queue"),
    "tree": ("root_node", "page_size"),
}


def _resolve(dotted: str):
    """Import the longest importable module prefix of `dotted`, then getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _misfit(dotted: str, by_name: tuple[str, ...], positional: int) -> str | None:
    """Why `dotted` does not fit as the adapter calls it, or None."""
    try:
        obj = _resolve(dotted)
    except (ImportError, AttributeError) as missing:
        return f"missing ({type(missing).__name__}: {missing})"
    if not callable(obj):
        return "not callable"
    if getattr(obj, "__isabstractmethod__", False):  # only an ABC's declaration is left: the class lost its method
        return "missing (only the abstract declaration of a base class)"
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: callable is all that can be said
    return call_misfit(signature, by_name, positional)


def call_misfit(signature: inspect.Signature, by_name: tuple[str, ...], positional: int, caller: str = "the adapter") -> str | None:
    """Why a call with `positional` arguments and then the keywords `by_name` does not bind to `signature`, or None."""
    params = [p for p in signature.parameters.values() if p.name != "self"]
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        missing_names = [n for n in by_name if n not in names]
        if missing_names:
            return f"no parameter {', '.join(missing_names)}"
    positional_params = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional > len(positional_params) and not any(p.kind is p.VAR_POSITIONAL for p in params):
        return f"takes {len(positional_params)} positional arguments, {caller} passes {positional}"
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unfilled = [p.name for p in required[positional:] if p.name not in by_name]
    if unfilled:
        return f"requires {', '.join(unfilled)}, which {caller} does not pass"
    return None


def probe() -> list[tuple[str, str | None]]:
    """(name, why it does not fit or None) for everything the adapter uses, in `USED` order, then the attributes."""
    from .stack import prepare_imports

    prepare_imports()
    results = [(dotted, _misfit(dotted, by_name, positional)) for dotted, by_name, positional in USED]
    if any(why for _, why in results):
        return results
    from .stack import build_stack

    try:
        stack = build_stack()
    except Exception as error:  # a constructor that no longer takes what stack.py passes
        return [*results, ("conformance.adapters.sglang.stack.build_stack", f"raises {type(error).__name__}: {error}")]
    for part, names in ATTRIBUTES.items():
        obj = getattr(stack, part)
        for name in names:
            results.append((f"{type(obj).__module__}.{type(obj).__qualname__}.{name}", None if hasattr(obj, name) else "missing (instance attribute)"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junitxml", metavar="PATH", help="write one testcase per name checked")
    args = parser.parse_args(argv)
    results = probe()
    misfits = [(name, why) for name, why in results if why]
    for name, why in misfits:
        print(f"the adapter does not fit this SGLang: {name} ({why})")
    if args.junitxml:
        suite = ElementTree.Element("testsuite", name="sglang-adapter-fit", tests=str(len(results)), failures=str(len(misfits)))
        for name, why in results:
            case = ElementTree.SubElement(suite, "testcase", classname="sglang-adapter-fit", name=name)
            if why:
                ElementTree.SubElement(case, "failure", message=f"the adapter does not fit this SGLang: {name} ({why})")
        ElementTree.ElementTree(suite).write(args.junitxml, encoding="unicode", xml_declaration=True)
    if misfits:
        return EXIT_NO_FIT
    print(f"fit: the adapter fits this SGLang ({len(results)} constructors, methods and attributes checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
