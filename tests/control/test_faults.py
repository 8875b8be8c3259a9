"""Control under faults (issue 17, item 7): failed transfers and failed compute lose nothing.

On the reference model the environment fails transfers and compute at random (seeded) and
the model's invariants, F1 and F2 among them, are judged after every step; at the end the
tree's beliefs (which nodes are on L1, on L2) are compared with the model's copies. On
LocalGPURuntime `cacheruntime run` injects faults at high rates and every served token is
checked against recomputation (D1).
"""

import json
import random

import pytest

from cacheruntime.cli import main
from cacheruntime.control.scheduler import MAX_STEP_CALLS, Scheduler
from cacheruntime.control.tree import TreeCore, WritePolicy
from cacheruntime.control.workload import SyntheticConfig, synthetic
from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import BatchItem, BatchPlan, Close, CopyState, FaultKind, Publish, TransferKind

PS = 4


def faulty_environment(model, rng, transfer_rate):
    """Act as failing hardware after each step: each transfer fails with `transfer_rate`, else
    lands; then judge the model's state (its invariants include F1 and F2)."""

    def on_step(_scheduler):
        while model.completable():
            for transfer in model.completable():
                if rng.random() < transfer_rate:
                    model.fail_transfer(transfer)
                else:
                    model.complete_transfer(transfer)
        model.check_invariants()

    return on_step


def tree_matches_runtime(tree, model):
    """Every tree node is on L1 (L2) exactly when each of its pages has a readable device (host) copy
    (a node whose intent still waits in the outbox is what the tree will make it, not yet so)."""
    state = model.probe()
    pages = {p.page: p for p in state.pages}
    extents = {e.generation: e.pages for e in state.extents}
    readable = (CopyState.VALID, CopyState.DROPPING)
    queued = {intent.extent.generation for intent in tree.outbox}
    for node in tree.nodes()[1:]:
        if node.ref.generation in queued:
            continue
        names = extents[node.ref.generation]
        assert node.l1 == all(pages[n].l1 in readable for n in names), f"node {node.ref.generation}: tree says l1={node.l1}"
        assert node.l2 == all(pages[n].l2 in readable for n in names), f"node {node.ref.generation}: tree says l2={node.l2}"
    assert tree.l2_used == sum(n.pages for n in tree.nodes()[1:] if n.l2)


def serve_under_faults(seed, policy, l1_pages):
    """30 turns on the model with failures everywhere, seeded: compute faults and some backup
    and restore faults injected (they also strike inside wait_completions and execute), and
    every transfer the environment finishes fails with a rate of 10-30%."""
    model = ReferenceModel(page_size=PS, max_requests=4, max_request_tokens=128, l1_pages=l1_pages, l2_pages=48)
    rng = random.Random(seed)
    for kind, count, gap in ((FaultKind.COMPUTE, 12, 12), (FaultKind.BACKUP, 4, 8), (FaultKind.RESTORE, 4, 4)):
        position = 0
        for _ in range(count):  # each injection counts from now: seeded increasing positions
            position += rng.randint(1, gap)
            model.inject_fault(kind, position)
    source = synthetic(SyntheticConfig(requests=30, seed=seed, arrival_gap=seed % 3))
    scheduler = Scheduler(model, source, write_policy=policy)
    stats = scheduler.run(on_step=faulty_environment(model, rng, transfer_rate=0.1 + 0.1 * (seed % 3)))
    model.check_invariants()
    assert stats.turns_served + stats.turns_abandoned + stats.turns_never_started == source.total == 30
    assert not scheduler.running and not scheduler.waiting and not scheduler.retries
    assert max(stats.step_calls) <= MAX_STEP_CALLS
    assert all(not slot.live for slot in model.probe().slots)  # every turn's row was closed, served or not
    tree_matches_runtime(scheduler.tree, model)
    return stats


#: Seeds 15, 25 (write-through) and 20 (write-back) found, in the slow sweep below, undone
#: intents returned behind newer ones (L2 OutOfPages at execute) and a page ladder defeated
#: by failed backups (SchedulerStuck).
CASES = [
    (1, WritePolicy.WRITE_THROUGH, 40),
    (2, WritePolicy.WRITE_BACK, 40),
    (15, WritePolicy.WRITE_THROUGH, 40),
    (25, WritePolicy.WRITE_THROUGH, 64),
    (20, WritePolicy.WRITE_BACK, 32),
]


@pytest.mark.parametrize(("seed", "policy", "l1_pages"), CASES)
def test_scheduler_on_the_model_under_failed_transfers_and_compute(seed, policy, l1_pages):
    """Failures on every path: every turn is served or abandoned, the model's invariants hold
    after every step, and the tree's beliefs match the copies at the end."""
    stats = serve_under_faults(seed, policy, l1_pages)
    print(f"seed {seed} {policy.value} L1 {l1_pages}: {stats}")
    assert stats.failed_backups + stats.failed_restores and stats.compute_failures and stats.retries  # seeds 1, 2: both kinds
    assert stats.turns_served > stats.turns_abandoned


@pytest.mark.slow
def test_scheduler_fault_sweep_on_the_model():
    """342 seeded runs of the above (seeds 3-59, both policies, L1 of 32, 40 and 64 pages;
    about 2 minutes): PYTHONPATH=src python -m pytest -q -m slow tests/control/test_faults.py -k sweep"""
    for seed in range(3, 60):
        for policy in WritePolicy:
            for l1_pages in (32, 40, 64):
                serve_under_faults(seed, policy, l1_pages)


def test_a_prepare_that_meets_a_restore_failed_since_planning_is_given_up_and_retried():
    """Half the restores fail right after the step that started them: a plan built before the
    scheduler polled that failure attaches the node as resident and prepare refuses it
    (NotResident); the plan is undone, the node restored again by a later one."""
    model = ReferenceModel(page_size=PS, max_requests=4, max_request_tokens=128, l1_pages=40, l2_pages=64)
    rng = random.Random(4)

    def on_step(_scheduler):
        while model.completable():
            kinds = {t.transfer_id: t.kind for t in model.probe().transfers}
            for transfer in model.completable():
                if kinds[transfer] is TransferKind.RESTORE and rng.random() < 0.5:
                    model.fail_transfer(transfer)
                else:
                    model.complete_transfer(transfer)
        model.check_invariants()

    source = synthetic(SyntheticConfig(requests=30, seed=4, arrival_gap=0))
    scheduler = Scheduler(model, source, write_policy=WritePolicy.WRITE_BACK)
    stats = scheduler.run(on_step=on_step)
    assert stats.unresident_prepares > 0 and stats.failed_restores > 0
    assert stats.turns_served + stats.turns_abandoned + stats.turns_never_started == source.total
    tree_matches_runtime(scheduler.tree, model)


def test_a_failed_write_back_backup_leaves_the_node_on_l1_and_not_on_l2():
    """The demote that rode with the backup is undone: the tree has the node resident again."""
    model = ReferenceModel(page_size=PS, max_requests=4, max_request_tokens=64, l1_pages=32, l2_pages=32)
    tree = TreeCore(model, page_size=PS, l2_pages=32, write_policy=WritePolicy.WRITE_BACK)
    request = model.open_request()
    tokens = tuple(range(8))
    completion = model.execute_batch(model.prepare_batch(BatchPlan((BatchItem(request, tokens),), (Publish(request, 0, 2), Close(request)))))
    node = tree.insert(tokens, 0, completion.published[0]).node
    assert tree.evict(2) == 2 and not node.l1 and node.l2
    intents = tree.take_intents()
    assert [type(i).__name__ for i in intents] == ["Backup", "Demote"]
    (ticket,) = model.submit(intents)
    tree.intents_applied(intents)
    model.fail_transfer(ticket.transfer_id)
    (done,) = model.poll_completions()
    assert done.failure is not None and tree.transfers_done([done]) == set()
    assert node.l1 and not node.l2 and tree.l2_used == 0 and not node.in_flight
    tree_matches_runtime(tree, model)
    assert tree.match_prefix(tokens + (9,)).l1_pages == 2  # a hit on L1, no restore needed


def run_job(tmp_path, *args):
    out = tmp_path / "summary.json"
    code = main(["run", "--quiet", "--json", str(out), *args])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_job_under_injected_faults_serves_correct_tokens(tmp_path, policy):
    """The CI-sized soak on LocalGPURuntime: high fault rates, 0 mismatches among the served tokens.

    Seed 3 arms the first backup, restore and compute faults at the 9th, 23rd and 41st of
    their kind, well inside this run whatever the threads' timing: each kind fires.
    """
    code, summary = run_job(tmp_path, "--transfer-fault-rate", "0.2", "--compute-fault-rate", "0.05", "--write-policy", policy.value, "--seed", "3")
    print(json.dumps(summary))
    assert code == 0 and summary["output_check"] == "reference_next_token" and summary["output_mismatches"] == 0
    assert summary["turns_served"] + summary["turns_abandoned"] + summary["turns_never_started"] == summary["turns"] == 36
    assert summary["turns_served"] > 0 and summary["retries"] > 0
    seen = summary["faults_seen"]
    injected = summary["faults_injected"]
    assert seen["failed_backups"] == injected["backup"] > 0 and seen["failed_restores"] == injected["restore"] > 0
    assert seen["compute_failures"] >= injected["compute"] > 0
    assert summary["boundary_calls_per_batch"] <= summary["boundary_calls_per_batch_bound"]


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_job_restarts_a_lost_runtime_and_serves_correct_tokens(tmp_path, policy):
    """Stream workers die (LOST) mid-step on LocalGPURuntime: every call raises RuntimeFault
    until control restarts the runtime and rebuilds; every turn is served or abandoned, and
    every served token (those computed again after a restart included) equals recomputation."""
    code, summary = run_job(tmp_path, "--lost-fault-rate", "0.05", "--transfer-fault-rate", "0.05", "--write-policy", policy.value, "--seed", "3")
    print(json.dumps(summary))
    assert code == 0 and summary["output_check"] == "reference_next_token" and summary["output_mismatches"] == 0
    assert summary["turns_served"] + summary["turns_abandoned"] + summary["turns_never_started"] == summary["turns"] == 36
    assert summary["faults_seen"]["runtime_faults"] == summary["faults_injected"]["lost"] > 0
    assert summary["recomputed_tokens"] > 0 and summary["turns_served"] > summary["turns_abandoned"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--lost-fault-rate", "2"),
        ("--transfer-fault-rate", "1.5"),
        ("--transfer-fault-rate", "-0.1"),
        ("--compute-fault-rate", "often"),
        ("--compute-fault-rate", "nan"),
    ],
)
def test_bad_fault_rates_are_one_line_errors_naming_the_option(capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", option, value])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and option in error and "between 0 and 1" in error


def test_fault_rates_need_the_local_runtime(capsys):
    assert main(["run", "--runtime", "model", "--transfer-fault-rate", "0.1"]) == 2
    assert "--runtime local" in capsys.readouterr().err


@pytest.mark.slow
def test_fault_soak(tmp_path):
    """The fault soak of issue 17, item 7: faults in about 1 of 1,000 transfers and 1 of 10,000
    computes, and a stream worker dying in about 1 of 10,000 launches (the runtime restarted),
    over at least 100,000 boundary operations; every served token checked (D1).

    Two request slots, so that most steps carry one or two items: the boundary operations
    (three a step) grow faster than the tokens the output check recomputes. Run it (about
    5 minutes on a loaded 2-core machine)::

        PYTHONPATH=src python -m pytest -q -s -m slow tests/control/test_faults.py::test_fault_soak

    or the job itself::

        cacheruntime run --quiet --requests 4200 --turns 4 --new-tokens 8 16 --l1-pages 48 --max-requests 2 \\
            --transfer-fault-rate 0.001 --compute-fault-rate 0.0001 --lost-fault-rate 0.0001 --seed 7 --json soak.json
    """
    code, summary = run_job(
        tmp_path,
        *("--requests", "4200", "--turns", "4", "--new-tokens", "8", "16", "--l1-pages", "48", "--max-requests", "2"),
        *("--transfer-fault-rate", "0.001", "--compute-fault-rate", "0.0001", "--lost-fault-rate", "0.0001", "--seed", "7"),
    )
    print(json.dumps(summary, indent=1))
    assert code == 0 and summary["output_mismatches"] == 0
    assert summary["boundary_operations"] >= 100_000
    assert summary["turns_served"] + summary["turns_abandoned"] + summary["turns_never_started"] == summary["turns"]
    assert sum(summary["faults_injected"].values()) > 0


def test_eviction_after_failures_takes_resident_nodes_only(monkeypatch):
    """Failed transfers leave resident nodes below host-only ones (L1 not prefix-closed); the
    tree evicts on the policy's resident closure (proved in Z3: e2_closure_evicts_only_resident,
    e3_closure_frees_enough). Here: such evictions happen, each one queues intents for nodes
    that were on L1 only, never for a host-only ancestor, and a node goes only with every
    resident node below it (leaves first: evicting on the raw residency breaks this)."""
    seen = {"evictions": 0, "not_closed": 0}
    evict = TreeCore.evict

    def checked_evict(tree, pages_needed):
        nodes = tree.nodes()[1:]
        resident = {n.ref.generation for n in nodes if n.l1}
        below = {n.ref.generation: {d.ref.generation for d in tree._subtree(n)[1:]} for n in nodes}
        not_closed = any(n.l1 and n.parent.parent is not None and not n.parent.l1 for n in nodes)
        before = len(tree.outbox)
        queued = evict(tree, pages_needed)
        seen["evictions"] += 1
        if not_closed and queued:
            seen["not_closed"] += 1
            evicted = {i.extent.generation for i in tree.outbox[before:]}
            victims = evicted & set(tree.by_generation)  # host-only nodes below a released victim left the tree with it
            for generation in victims:
                assert generation in resident, f"evicted host-only node {generation}"
                left = {d for d in below[generation] & resident if d not in evicted and d in tree.by_generation}
                assert not left, f"evicted node {generation} before the resident nodes {left} below it"
        return queued

    monkeypatch.setattr(TreeCore, "evict", checked_evict)
    for seed, policy, l1_pages in CASES:
        serve_under_faults(seed, policy, l1_pages)
    assert seen["not_closed"] > 0, seen


def serve_losing_the_runtime(policy, lose_at):
    """The workload on the model, whose machinery is lost after the steps in `lose_at`. The
    model's tokens digest its copies' write versions, not only the context, so its outputs
    are checked by its invariants (D1 among them) after every step, not against a clean run."""
    model = ReferenceModel(page_size=PS, max_requests=4, max_request_tokens=128, l1_pages=40, l2_pages=48)

    def on_step(scheduler):
        while model.completable():
            for transfer in model.completable():
                model.complete_transfer(transfer)
        model.check_invariants()
        if scheduler.stats.steps in lose_at:
            model.lose()

    source = synthetic(SyntheticConfig(requests=30, seed=5, arrival_gap=1))
    scheduler = Scheduler(model, source, write_policy=policy)
    stats = scheduler.run(on_step=on_step)
    model.check_invariants()
    assert stats.turns_served + stats.turns_abandoned + stats.turns_never_started == source.total == 30
    assert not scheduler.running and not scheduler.waiting
    assert all(not slot.live for slot in model.probe().slots)
    tree_matches_runtime(scheduler.tree, model)
    return stats


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_a_lost_runtime_is_restarted_and_every_turn_served(policy):
    """RuntimeFault (spec §4.15) in the middle of serving: control restarts the runtime,
    rebuilds on the new epoch and retries the running turns from their prompts. Every turn
    is served once (tokens computed again are counted apart); `cacheruntime run
    --lost-fault-rate` checks the served tokens against recomputation on LocalGPURuntime."""
    clean = serve_losing_the_runtime(policy, lose_at=set())
    lost = serve_losing_the_runtime(policy, lose_at={6, 19, 33, 50})
    assert lost.runtime_faults == 4 and clean.runtime_faults == 0
    assert lost.turns_served == clean.turns_served == 30
    assert lost.recomputed_tokens > 0 and lost.retries >= 4
    assert lost.generated_tokens == clean.generated_tokens and lost.requests == clean.requests
    assert lost.prompt_tokens == clean.prompt_tokens
