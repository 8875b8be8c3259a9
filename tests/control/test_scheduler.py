"""The scheduler against the reference model: invariants after every step, pages, B1, B2."""

import subprocess
import sys

import pytest

from cacheruntime.control.scheduler import MAX_STEP_CALLS, STEP_CALLS, Scheduler
from cacheruntime.control.tree import WritePolicy
from cacheruntime.control.workload import SyntheticConfig, synthetic
from cacheruntime.invariants import B2_plain_values
from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import BatchPlan, OutOfPages


def environment(model):
    """Act as the hardware after each step (transfers land), then judge the model's state."""

    def on_step(_scheduler):
        while model.completable():
            for transfer in model.completable():
                model.complete_transfer(transfer)
        model.check_invariants()

    return on_step


def serve(requests, *, l1_pages=48, l2_pages=128, new_tokens=(4, 10), policy=WritePolicy.WRITE_THROUGH, seed=1, plans=None, **options):
    model = ReferenceModel(page_size=4, max_requests=4, max_request_tokens=128, l1_pages=l1_pages, l2_pages=l2_pages)
    if plans is not None:  # record every plan that crosses
        prepare = model.prepare_batch
        model.prepare_batch = lambda plan: (plans.append(plan), prepare(plan))[1]
    scheduler = Scheduler(model, synthetic(SyntheticConfig(requests=requests, new_tokens=new_tokens, seed=seed)), write_policy=policy, **options)
    stats = scheduler.run(on_step=environment(model))
    model.check_invariants()
    return model, scheduler, stats


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_serves_everything_with_hits_in_both_tiers(policy):
    plans = []
    model, scheduler, stats = serve(24, policy=policy, plans=plans)
    assert stats.requests == 24 and not scheduler.running and not scheduler.waiting
    assert stats.hit_tokens_l1 > 0 and stats.hit_tokens_l2 > 0 and stats.restored_pages > 0
    assert stats.prompt_tokens == stats.hit_tokens_l1 + stats.hit_tokens_l2 + stats.computed_prompt_tokens
    assert all(not slot.live for slot in model.probe().slots)  # every request was closed
    kinds = {type(i).__name__ for plan in plans for i in plan.intents}
    assert {"Publish", "Close", "Restore", "Demote"} <= kinds  # they ride in the plan
    assert any(item.append_previous_output for plan in plans for item in plan.items)
    assert all(not B2_plain_values(plan) for plan in plans)  # B2: only protocol values cross


def test_without_prefix_cache_every_prompt_is_computed_and_served_the_same():
    """The e2e bench's recompute baseline: nothing is published, so nothing is hit; the outputs are the cached run's."""
    plans = []
    _, _, cached = serve(24, plans=[])
    _, scheduler, stats = serve(24, plans=plans, prefix_cache=False)
    assert stats.requests == 24 and not scheduler.running
    assert stats.hit_tokens_l1 == stats.hit_tokens_l2 == 0 and stats.computed_prompt_tokens == stats.prompt_tokens == cached.prompt_tokens
    assert stats.generated_tokens == cached.generated_tokens
    assert not any(type(i).__name__ in ("Publish", "Restore", "Backup") for plan in plans for i in plan.intents)


def test_one_phase_executes_each_batch_in_the_step_that_prepares_it():
    """`lookahead=False`: prepare and execute alternate (restores start right before their compute)."""
    model = ReferenceModel(page_size=4, max_requests=4, max_request_tokens=128, l1_pages=48, l2_pages=128)
    order: list[str] = []
    for name in ("prepare_batch", "execute_batch"):
        call = getattr(model, name)
        setattr(model, name, lambda *a, _call=call, _name=name: (_call(*a), order.append(_name))[0])  # calls that succeeded
    scheduler = Scheduler(model, synthetic(SyntheticConfig(requests=24, seed=1)), lookahead=False)
    stats = scheduler.run(on_step=environment(model))
    assert stats.requests == 24 and stats.restored_pages > 0
    assert order == ["prepare_batch", "execute_batch"] * (len(order) // 2)
    _, _, two_phase = serve(24)
    assert (stats.prompt_tokens, stats.generated_tokens) == (two_phase.prompt_tokens, two_phase.generated_tokens)


def test_out_of_pages_is_handled_by_eviction():
    """An L1 that fits little more than one request: prepare runs out and the ladder evicts."""
    model, scheduler, stats = serve(12, l1_pages=24, l2_pages=16)
    assert stats.out_of_pages > 0
    assert stats.requests == 12 and stats.generated_tokens >= 12


def test_a_failed_prepare_changes_nothing_and_the_retry_succeeds():
    """Scenario 6 from control's side: the scheduler sees OutOfPages and the model is unchanged."""
    model = ReferenceModel(page_size=4, max_requests=4, max_request_tokens=128, l1_pages=24, l2_pages=16)
    seen = []
    prepare = model.prepare_batch

    def watched(plan: BatchPlan):
        before = model.probe()
        try:
            return prepare(plan)
        except OutOfPages:
            assert model.probe() == before
            seen.append(plan)
            raise

    model.prepare_batch = watched
    scheduler = Scheduler(model, synthetic(SyntheticConfig(requests=12, seed=1)))
    stats = scheduler.run(on_step=environment(model))
    assert seen and stats.requests == 12 and stats.out_of_pages == len(seen)


def test_boundary_calls_per_batch_do_not_grow_with_tokens():
    """B1: more than five times the tokens, the same bounded calls per step."""
    _, small, small_stats = serve(8, new_tokens=(3, 4), l1_pages=96)
    _, large, large_stats = serve(20, new_tokens=(8, 10), l1_pages=96)
    assert large_stats.generated_tokens > 5 * small_stats.generated_tokens
    for scheduler, stats in ((small, small_stats), (large, large_stats)):
        assert max(stats.step_calls) <= MAX_STEP_CALLS
        per_request = sum(n for op, n in scheduler.runtime.calls.items() if op not in STEP_CALLS) / stats.requests
        assert per_request <= 4  # open_request, and a split or release now and then: never per token
        assert scheduler.runtime.calls["execute_batch"] == stats.batches
    # the usual step is exactly prepare, execute, poll, at both sizes
    assert small_stats.step_calls.most_common(1)[0][0] == 3 == large_stats.step_calls.most_common(1)[0][0]


def test_control_imports_without_torch():
    """B2: the control side runs with torch unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import cacheruntime.control, cacheruntime.control.tree, cacheruntime.control.scheduler\n"
        "import cacheruntime.control.policy, cacheruntime.control.workload\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
