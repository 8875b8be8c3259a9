"""How often failed transfers leave a GPU-resident tree node below a host-only one (spec/protocol.md §8).

Serves the seeded fault workloads of tests/control/test_faults.py (seeds 1-15, both write
policies, L1 of 40 pages, 10-30% of transfers failed) on the reference model, and the same
workloads with no fault, and counts the scheduler steps after which L1 residency is not
prefix-closed. Run from the repository root:

    PYTHONPATH=src:tests/control python scripts/closure_after_failures.py
"""

from __future__ import annotations

import test_faults  # tests/control: serve_under_faults, faulty_environment

from cacheruntime.control.scheduler import Scheduler
from cacheruntime.control.tree import WritePolicy
from cacheruntime.control.workload import SyntheticConfig, synthetic
from cacheruntime.model import ReferenceModel


def not_closed(tree) -> bool:
    return any(n.l1 and n.parent.parent is not None and not n.parent.l1 for n in tree.nodes()[1:])


def main() -> None:
    counts = {"faults": [0, 0], "no faults": [0, 0]}
    environment = test_faults.faulty_environment

    def counting(model, rng, transfer_rate):
        step = environment(model, rng, transfer_rate)

        def on_step(scheduler):
            step(scheduler)
            counts["faults"][0] += not_closed(scheduler.tree)
            counts["faults"][1] += 1

        return on_step

    test_faults.faulty_environment = counting
    for seed in range(1, 16):
        for policy in WritePolicy:
            test_faults.serve_under_faults(seed, policy, 40)
            model = ReferenceModel(page_size=test_faults.PS, max_requests=4, max_request_tokens=128, l1_pages=40, l2_pages=48)

            def clean(scheduler, model=model):
                while model.completable():
                    for transfer in model.completable():
                        model.complete_transfer(transfer)
                counts["no faults"][0] += not_closed(scheduler.tree)
                counts["no faults"][1] += 1

            Scheduler(model, synthetic(SyntheticConfig(requests=30, seed=seed, arrival_gap=seed % 3)), write_policy=policy).run(on_step=clean)
    for name, (bad, steps) in counts.items():
        print(f"{name}: {bad} of {steps} scheduler steps with a resident node below a host-only one")


if __name__ == "__main__":
    main()
