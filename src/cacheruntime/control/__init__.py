"""Control: the scheduler and the prefix tree, holding only opaque protocol values (B2).

`tree` is TreeCore (radix tree, locks, eviction into intents), `policy` the lock and
eviction decisions it runs (proved with Z3), `scheduler` builds and runs batch plans,
`workload` supplies requests. Nothing here imports torch.
"""

from cacheruntime.control.scheduler import Scheduler, Stats
from cacheruntime.control.tree import TreeCore, WritePolicy
from cacheruntime.control.workload import RequestSpec, SyntheticConfig, read_trace, synthetic

__all__ = ["RequestSpec", "Scheduler", "Stats", "SyntheticConfig", "TreeCore", "WritePolicy", "read_trace", "synthetic"]
