"""The reference model dressed as a runtime under test, so the suite can test itself.

`ModelRuntime` is the model plus an environment clock: a transfer completes on its own
`latency` successful calls after the call that started it, at the end of that call,
in dependency order. The suite then meets what real runtimes do (completions that
happen between calls and are reported later) and must stay in step by feeding the
runtime's completions into its own model. `set_transfer_delay(s > 0)` stops the clock,
so transfers complete only when compute or `wait_completions` needs them: the
deterministic race of the ordering check.

The mutants in `cacheruntime.conformance.mutants` break this runtime one invariant at
a time; the suite must kill each.
"""

from __future__ import annotations

import functools

from cacheruntime.model import ReferenceModel
from cacheruntime.protocol import Capability, TransferKind
from cacheruntime.recording import BOUNDARY_OPERATIONS

#: The boundary operations; each advances the environment clock when it succeeds.
OPERATIONS = tuple(name for name in BOUNDARY_OPERATIONS if name != "info")


def _ticking(name: str):
    @functools.wraps(getattr(ReferenceModel, name))
    def operation(self: ModelRuntime, *args, **kwargs):
        result = getattr(super(ModelRuntime, self), name)(*args, **kwargs)
        self._tick()
        return result

    return operation


class ModelRuntime(ReferenceModel):
    """A `ReferenceModel` whose transfers complete on their own, `latency` calls after they start."""

    def __init__(self, *, latency: int = 1, **sizes):
        super().__init__(**sizes)
        self.latency = latency
        self.delayed = False
        self._started: dict[int, int] = {}  # transfer id -> clock when first seen
        self._clock = 0

    @property
    def capabilities(self) -> frozenset[Capability]:
        """Everything the model claims, plus the delay knob."""
        return super().capabilities | {Capability.DELAY_KNOB}

    def set_transfer_delay(self, seconds: float, kind: TransferKind | None = None) -> None:
        """Any delay stops the clock: transfers then complete only when something waits for them."""
        self.delayed = seconds > 0

    def _tick(self) -> None:
        self._clock += 1
        in_flight = self.state.transfers
        self._started = {t: self._started.get(t, self._clock) for t in in_flight}
        if self.delayed:
            return
        due = True
        while due:
            due = [t for t in self.completable() if self._clock - self._started[t] >= self.latency]
            if due:
                self.complete_transfer(due[0])

    for _name in OPERATIONS:
        locals()[_name] = _ticking(_name)
    del _name


def model_runtime(
    runtime_id: str = "selftest",
    latency: int = 1,
    page_size: int = 4,
    max_requests: int = 4,
    max_request_tokens: int = 32,
    l1_pages: int = 16,
    l2_pages: int = 16,
) -> ModelRuntime:
    """Factory for `--runtime cacheruntime.conformance.selftest:model_runtime`."""
    return ModelRuntime(
        latency=latency,
        runtime_id=runtime_id,
        page_size=page_size,
        max_requests=max_requests,
        max_request_tokens=max_request_tokens,
        l1_pages=l1_pages,
        l2_pages=l2_pages,
    )
