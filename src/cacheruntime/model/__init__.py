"""The executable reference model: the whole contract as a pure-Python state machine.

The model has no compute and no bytes. Instead every token written gets a version tag
(a counter that never resets, not even across restarts), each copy of a page records
the tags it holds, and a transfer copies tags when it completes. D1 is then a plain
equality: every valid copy holds the tags last written. With the same tagging, a
runtime that claims TAGGED_COMPUTE returns `tag_digest` of the tags compute read as
each item's next token, and so does the model.

Transfers are abstract pending events. They complete when the environment says so
(`complete_transfer`, the TLA+ action CompleteTransfer), when compute needs them
(`execute_batch` waits for the restores its pages need: O1), or at
`wait_completions`. A transfer never completes before the transfers it waits for.

One module per section, as the runtime's ledger has them, so the two read file for
file: `records` (the state), `handles` (handle checks), `pages` (page names and
pools), `extents` (extents and intents), `batches` (prepare, execute, cancel),
`transfers` (start, complete, await, report), and `machine` (`ReferenceModel`, which
composes the sections and holds the operations).
"""

from cacheruntime.model.machine import ReferenceModel, operation
from cacheruntime.model.records import (
    Batch,
    Copy,
    Extent,
    Page,
    Pool,
    Slot,
    State,
    Transfer,
    fresh_state,
)

__all__ = [
    "Batch",
    "Copy",
    "Extent",
    "Page",
    "Pool",
    "ReferenceModel",
    "Slot",
    "State",
    "Transfer",
    "fresh_state",
    "operation",
]
