"""The `situation` mutants' shape, their tables, and the machine-made mutants' equivalence rule.

The mutants' kills are the conformance suite's business (the mutant kill test runs every
registered mutant); here: that each is built on a public seam, that the tables name only
registered mutants and cover every operation's error classes, and that the rule which sets
machine-made mutants aside as equivalent takes exactly the syntactic classes it states.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import attrs
import pytest

from cacheruntime import protocol
from cacheruntime.conformance.mutants import MUTANTS, situations
from cacheruntime.protocol import (
    Backup,
    BatchItem,
    BatchPlan,
    CacheRuntimeError,
    Close,
    Demote,
    Drop,
    OutOfPages,
    PageRun,
    Release,
    Restore,
)
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.local import LocalGPURuntime

ROOT = Path(__file__).resolve().parents[2]


def private_overrides(cls: type) -> list[str]:
    return [f"{cls.__name__}.{name}" for name in vars(cls) if name.startswith("_") and not name.startswith("__") and callable(vars(cls)[name])]


def test_no_situation_mutant_overrides_a_private_method():
    found = []
    for name, mutant in situations.MUTANTS.items():
        found += private_overrides(mutant)
        for part in mutant.parts.values():
            found += private_overrides(part)
        assert mutant.__doc__ and mutant.invariant, name
    assert not found, f"mutants override private methods: {found}"


def test_the_tables_name_registered_mutants_only():
    named = {n for errors in situations.OPERATION_ERRORS.values() for names in errors.values() for n in names}
    named |= {n for names in situations.SITUATIONS.values() for n in names}
    named |= {f"situation.{n}" for n in situations.SITUATION_SURVIVORS}
    measured = situations.SITUATION_SURVIVORS.keys() | situations.SITUATION_KILLED_BY.keys()
    assert measured == situations.MUTANTS.keys() and not situations.SITUATION_SURVIVORS.keys() & situations.SITUATION_KILLED_BY.keys()
    assert set(situations.SITUATION_KILLED_BY.values()) <= {"core", "tiers", "restart", "ordering"}
    assert named - MUTANTS.keys() == set()
    assert {f"situation.{n}" for n in situations.MUTANTS} <= named, "every situation mutant has its cell or situation"


def test_every_operation_and_error_class_of_the_spec_has_its_cell():
    """Each operation of spec/protocol.md section 4 is a row; every error class of section 3 is raised by some row."""
    spec = (ROOT / "spec" / "protocol.md").read_text()
    operations = re.findall(r"^### 4\.\d+ `(\w+)\(", spec, flags=re.M)
    assert set(operations) == set(situations.OPERATION_ERRORS)
    quoted = set(re.findall(r"`(\w+)(?:\([^`]*\))?`", spec.split("**Errors**")[1].split("**Holders.**")[0]))
    errors = {name for name in quoted if isinstance(getattr(protocol, name, None), type) and issubclass(getattr(protocol, name), protocol.CacheRuntimeError)}
    errors -= {"CacheRuntimeError"}
    assert {"InvalidArgument", "OutOfPages", "ComputeFailed"} <= errors  # the section is still where this reads it
    covered = {e for row in situations.OPERATION_ERRORS.values() for e in row}
    assert errors - covered == set()
    for (operation, error), why in situations.UNREACHABLE.items():
        assert error in situations.OPERATION_ERRORS[operation] and why


def machine_mutants():
    spec = importlib.util.spec_from_file_location("machine_mutants", ROOT / "scripts" / "machine_mutants.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SNIPPET = '''
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    LIMIT = 1 + 2
def need(count: int = 1 + 1) -> int:
    """Pages needed."""
    if count > 3:
        raise ValueError(f"need {count + 1} pages")
    return count - 1
'''


@pytest.mark.parametrize(
    ("start", "end", "verdict"),
    [
        ((4, 12), (4, 17), "type-checking"),  # 1 + 2 under TYPE_CHECKING
        ((5, 22), (5, 27), None),  # the default value 1 + 1 runs
        ((5, 32), (5, 35), "annotation"),  # -> int
        ((6, 4), (6, 23), "text"),  # the docstring
        ((7, 7), (7, 16), None),  # count > 3
        ((8, 33), (8, 42), "text"),  # {count + 1} inside the error's f-string
        ((9, 11), (9, 20), None),  # count - 1
    ],
)
def test_the_equivalence_rule_takes_only_text_annotations_and_type_checking(start, end, verdict):
    assert machine_mutants().equivalence_class(SNIPPET, start, end) == verdict


def test_the_rule_sets_aside_what_cosmic_ray_makes_in_error_texts_and_nothing_that_runs():
    """cosmic-ray's own mutants of the snippet: those in the f-string are set aside, the rest run."""
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.plugins import get_operator

    rule = machine_mutants().equivalence_class
    verdicts: dict[str | None, int] = {}
    for name in ("core/ReplaceBinaryOperator_Add_Sub", "core/ReplaceComparisonOperator_Gt_Lt", "core/NumberReplacer"):
        operator = get_operator(name)()
        for node in ast_nodes(get_ast(SNIPPET)):
            for start, end in operator.mutation_positions(node):
                verdict = rule(SNIPPET, tuple(start), tuple(end))
                verdicts[verdict] = verdicts.get(verdict, 0) + 1
    assert verdicts.get(None, 0) >= 3  # count > 3, 1 + 1, count - 1, the numbers that run
    assert verdicts.get("text", 0) >= 1 and verdicts.get("type-checking", 0) >= 1


# -- each mutant is a real bug: a directed call sequence tells it from the landed runtime ------
#
# Independent of the suite: if the suite misses a mutant, these show that the miss is the
# suite's reach, not an equivalent mutant. Each scenario drives a runtime through public
# calls and records what came back (values' fixed parts, error classes, free counts, tags).


class Log:
    """The calls' outcomes, as the contract fixes them."""

    def __init__(self, rt):
        self.rt, self.seen = rt, []

    def __call__(self, operation, *args):
        try:
            value = getattr(self.rt, operation)(*args)
        except CacheRuntimeError as error:
            fields = (error.tier, error.needed, error.free) if isinstance(error, OutOfPages) else ()
            self.seen.append((operation, type(error).__name__, *fields))
            return None
        except Exception as error:  # a crash is an outcome too
            self.seen.append((operation, "crash", type(error).__name__))
            return None
        self.seen.append((operation, "ok"))
        return value

    def note(self, what):
        self.seen.append(what)

    def pools(self):
        state = self.rt.probe()
        self.note(tuple((p.tier.name, len(p.free), len(p.deferred)) for p in state.pools))
        return state


def prefill(do, request, tokens, intents=()):
    batch = do("prepare_batch", BatchPlan(items=(BatchItem(request, tuple(range(1, tokens + 1))),), intents=tuple(intents)))
    return batch and do("execute_batch", batch)


def parked(do, tokens):
    """An extent over a fresh row's full pages, backed up and demoted: its pages live on the host only."""
    request = do("open_request")
    prefill(do, request, tokens)
    extent = do("publish", request, 0, tokens // 2)
    do("submit", (Backup(extent),))
    do("wait_completions")
    do("close_request", request)
    do("submit", (Demote(extent),))
    return extent


def published(do, tokens, first=0, count=None):
    request = do("open_request")
    prefill(do, request, tokens)
    return request, do("publish", request, first, tokens // 2 - first if count is None else count)


def s_origin(do):
    request = do("open_request")
    do("close_request", attrs.evolve(request, runtime_id="other"))


def s_batch_origin(do):
    request = do("open_request")
    batch = do("prepare_batch", BatchPlan(items=(BatchItem(request, (1,)),)))
    do("execute_batch", attrs.evolve(batch, runtime_id="other"))


def s_unknown_batch(do):
    request = do("open_request")
    batch = do("prepare_batch", BatchPlan(items=(BatchItem(request, (1,)),)))
    do("cancel_batch", attrs.evolve(batch, batch_id=batch.batch_id + 7))


def s_future_generation(do):
    request = do("open_request")
    do("close_request", attrs.evolve(request, generation=request.generation + 1))


def s_two_generations_stale(do):
    old = do("open_request")
    do("close_request", old)
    do("close_request", do("open_request"))
    do("open_request")
    do("close_request", old)
    do.note(tuple((s.generation, s.live) for s in do.rt.probe().slots))


def s_slot_range(do):
    request = do("open_request")
    do("close_request", attrs.evolve(request, slot_id=4))


def s_missing_extent(do):
    _, extent = published(do, 4)
    do("retain", attrs.evolve(extent, generation=extent.generation + 9))


def s_runs_sorted(do):
    a, b = do("open_request"), do("open_request")
    do("execute_batch", do("prepare_batch", BatchPlan(items=(BatchItem(a, (1, 2)), BatchItem(b, (1, 2))))))
    prefill(do, a, 2)
    extent = do("publish", a, 0, 2)  # names 0 and 2: two runs
    do("retain", attrs.evolve(extent, page_runs=tuple(reversed(extent.page_runs))))


def s_runs_as_pages(do):
    _, extent = published(do, 4)  # one run of two pages
    (run,) = extent.page_runs
    do("retain", attrs.evolve(extent, page_runs=(PageRun(run.first_page, 1), PageRun(run.first_page + 1, 1))))


def s_retain_old_epoch(do):
    _, old = published(do, 4)
    do("restart")
    published(do, 4)  # the new epoch's first extent: same generation, same runs
    do("retain", old)
    do.note(tuple(e.refcount for e in do.rt.probe().extents))


def s_close_intent_busy(do):
    request = do("open_request")
    first = do("prepare_batch", BatchPlan(items=(BatchItem(request, (1, 2)),), intents=(Close(request),)))
    do("prepare_batch", BatchPlan(items=(BatchItem(request, (3,)),)))
    do("execute_batch", first)


def s_cancel_executed(do):
    request = do("open_request")
    batch = do("prepare_batch", BatchPlan(items=(BatchItem(request, (1,)),)))
    do("execute_batch", batch)
    do("cancel_batch", batch)


def s_publish_negative(do):
    request = do("open_request")
    prefill(do, request, 6)
    do("publish", request, -1, 1)


def s_split_shared(do):
    _, extent = published(do, 4)
    do("retain", extent)
    do("split", extent, 1)


def s_split_at_zero(do):
    _, extent = published(do, 4)
    do("split", extent, 0)


def s_split_three_pages(do):
    _, extent = published(do, 6)
    halves = do("split", extent, 2)
    do.note(tuple(e.pages for e in do.rt.probe().extents))
    for half in halves or ():
        do("release", half)
    do.pools()


def s_submit_release(do):
    _, extent = published(do, 4)
    do("submit", (Release(extent),))


def s_demote_first_page(do):
    request, first = published(do, 4, 0, 1)
    do("submit", (Backup(first),))
    do("wait_completions")
    both = do("publish", request, 0, 2)
    do("close_request", request)
    do("submit", (Demote(both),))


def s_drop_first_page(do):
    request, second = published(do, 4, 1, 1)
    both = do("publish", request, 0, 2)
    do("submit", (Backup(both),))
    do("wait_completions")
    do("close_request", request)
    do("submit", (Demote(second),))
    do("submit", (Drop(both),))


def s_plan_backup_full_host(do):
    for _ in range(4):
        parked(do, 10)  # 20 of 24 host pages in use
    request, extent = published(do, 10)
    batch = do("prepare_batch", BatchPlan(items=(BatchItem(request, (1,)),), intents=(Backup(extent),)))
    do("execute_batch", batch)  # 5 more host pages, 4 free
    do.pools()


def s_submit_restore_resident(do):
    _, extent = published(do, 10)  # 5 resident pages
    prefill(do, do("open_request"), 12)  # 6 more: 1 free
    do("submit", (Restore(extent),))


def s_plan_needed(do):
    extent = parked(do, 10)
    prefill(do, do("open_request"), 20)  # 10 of 12 device pages
    do("prepare_batch", BatchPlan(items=(BatchItem(do("open_request"), (1,), attach=(extent,)),), intents=(Restore(extent),)))


def s_plan_restore_resident(do):
    _, extent = published(do, 10)
    prefill(do, do("open_request"), 12)
    do("prepare_batch", BatchPlan(items=(BatchItem(do("open_request"), (1,)),), intents=(Restore(extent),)))


def s_attach_counts(do):
    request, extent = published(do, 10)
    do("close_request", request)
    prefill(do, do("open_request"), 12)
    do("prepare_batch", BatchPlan(items=(BatchItem(do("open_request"), (1,), attach=(extent,)),)))


def s_restart_in_flight(do):
    _, extent = published(do, 4)
    do("submit", (Backup(extent),))
    do("restart")
    do.pools()


def s_restart_generations(do):
    do("restart")
    do.note(do("open_request").generation)


def s_many_host_pages(do):
    extents = [parked(do, 10) for _ in range(4)]  # 20 host pages, taken in order: pages 16.. too
    do.note(tuple(p.l2_tags for p in do.rt.probe().pages))
    do.note(tuple(p.l2 for p in do.rt.probe().pages))
    do.note(len(extents))


def s_release_under_restore(do):
    """A Drop during the restore keeps the host copy (DROPPING, issue 17): nothing is freed yet.
    The release that ends the page names while the restore still reads them must defer the host
    pages' free until the H2D has read them (O3)."""
    extent = parked(do, 4)
    do("submit", (Restore(extent),))
    do("submit", (Drop(extent),))
    do.pools()
    do("release", extent)
    do.pools()


SCENARIOS = {
    "origin_ignores_runtime_id": s_origin,
    "batch_found_before_origin": s_batch_origin,
    "unknown_batch_not_prepared": s_unknown_batch,
    "future_generation_stale": s_future_generation,
    "generation_compared_low_bit": s_two_generations_stale,
    "slot_range_inclusive": s_slot_range,
    "missing_extent_stale": s_missing_extent,
    "runs_compared_sorted": s_runs_sorted,
    "runs_compared_as_pages": s_runs_as_pages,
    "retain_without_epoch": s_retain_old_epoch,
    "close_intent_ignores_busy": s_close_intent_busy,
    "cancel_executed_not_prepared": s_cancel_executed,
    "publish_negative_first_page": s_publish_negative,
    "split_shared_off_by_one": s_split_shared,
    "split_at_zero_accepted": s_split_at_zero,
    "split_tail_from_second_page": s_split_three_pages,
    "submit_accepts_release": s_submit_release,
    "demote_checks_first_page_backed": s_demote_first_page,
    "drop_checks_first_page_resident": s_drop_first_page,
    "plan_backup_unchecked": s_plan_backup_full_host,
    "submit_restore_counts_resident": s_submit_restore_resident,
    "plan_needed_without_restores": s_plan_needed,
    "plan_restore_counts_resident": s_plan_restore_resident,
    "attach_counts_attached_pages": s_attach_counts,
    "restart_refuses_in_flight": s_restart_in_flight,
    "restart_leaks_in_flight_pages": s_restart_in_flight,
    "restart_bumps_every_slot": s_restart_generations,
    "host_pool_sized_as_device": s_many_host_pages,
    "host_window_16": s_many_host_pages,
    "restore_readers_unprotected": s_release_under_restore,
}


def run_scenario(rt, scenario):
    do = Log(rt)
    try:
        scenario(do)
    finally:
        rt.close()
    return do.seen


def test_every_situation_mutant_has_its_scenario():
    assert SCENARIOS.keys() == situations.MUTANTS.keys()


@pytest.mark.parametrize("name", sorted(situations.MUTANTS))
def test_a_directed_call_sequence_tells_the_mutant_from_the_runtime(name):
    scenario = SCENARIOS[name]
    landed = run_scenario(LocalGPURuntime(**CONFORMANCE_OPTIONS), scenario)
    broken = run_scenario(situations.MUTANTS[name](), scenario)
    assert not any(entry[1:2] == ("crash",) for entry in landed if isinstance(entry, tuple)), landed
    assert broken != landed, f"{name}: the scenario cannot tell it from the landed runtime:\n{landed}"
