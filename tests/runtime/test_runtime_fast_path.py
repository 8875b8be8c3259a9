"""The decode fast path (`ledger/decode.py`) equals the general route on random plans.

Two runtimes take the same seeded random calls: one with the shipped ledger, one whose
ledger has `fast_path = False` (every plan checked item by item, every tag journaled,
no handle memo). Every return value, every error type and the whole abstract state must
be equal after each call. Plans are reused as immutable tuples (the memo's case), rebuilt
as equal lists (the memo must not apply), and mix decode steps, prefill, attach, append
and restores; slots open and close between steps (the memo's invalidation).
"""

from __future__ import annotations

import random

import pytest
from runtimekit import comparable

from cacheruntime.protocol import Backup, BatchItem, BatchPlan, CacheRuntimeError, Demote, Restore
from cacheruntime.runtime.factories import CONFORMANCE_OPTIONS
from cacheruntime.runtime.ledger import Ledger
from cacheruntime.runtime.local import LocalGPURuntime

SEEDS = range(24)
STEPS = 80


class GeneralRoute(Ledger):
    """The reference route: no memo, no short cut, everything journaled as in the general case."""

    fast_path = False


def outcome(call, *args):
    """(value, None) or (None, error type): what a call gave control."""
    try:
        return call(*args), None
    except CacheRuntimeError as error:
        return None, type(error)


class Walk:
    """Random calls, drawn once per step and applied to both runtimes."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.fast = LocalGPURuntime(**CONFORMANCE_OPTIONS)
        self.general = LocalGPURuntime(**CONFORMANCE_OPTIONS, ledger_class=GeneralRoute)
        self.handles: list = []  # (fast handle, general handle) pairs of open requests
        self.extents: list = []
        self.prepared: list = []
        self.decode_plan: tuple | None = None  # (fast plan, general plan): a reused immutable tuple

    def both(self, name, *args_pair):
        """Call `name` on both runtimes with their own arguments; their outcomes must agree."""
        fast_args = [a[0] for a in args_pair]
        general_args = [a[1] for a in args_pair]
        fast = outcome(getattr(self.fast, name), *fast_args)
        general = outcome(getattr(self.general, name), *general_args)
        assert fast[1] is general[1], (name, fast, general)
        assert fast[0] == general[0], (name, fast, general)
        return fast[0], general[0]

    def plan(self, *, reuse: bool):
        if reuse and self.decode_plan is not None:
            return self.decode_plan
        rng, chosen = self.rng, self.rng.sample(self.handles, self.rng.randint(1, len(self.handles)))
        specs = []
        for _ in chosen:
            n = 1 if rng.random() < 0.7 else rng.randint(0, 5)
            attach = rng.choice(self.extents) if self.extents and rng.random() < 0.15 else None
            specs.append((n, attach, rng.random() < 0.1))
        restore = rng.choice(self.extents) if self.extents and rng.random() < 0.2 else None

        def build(side: int, container):
            items = container(BatchItem(h[side], tuple(range(1, n + 1)), (x[side],) if x else (), append) for h, (n, x, append) in zip(chosen, specs))
            return BatchPlan(items, (Restore(restore[side]),) if restore else ())

        immutable = all(n == 1 and not x and not a for n, x, a in specs) and not restore
        pair = (build(0, tuple), build(1, tuple)) if immutable or rng.random() < 0.5 else (build(0, list), build(1, list))
        if immutable:
            self.decode_plan = pair
        return pair

    def step(self):
        rng = self.rng
        action = rng.random()
        if action < 0.15 or not self.handles:
            handle = self.both("open_request")
            if handle[0] is not None:
                self.handles.append(handle)
        elif action < 0.55:
            batch = self.both("prepare_batch", self.plan(reuse=rng.random() < 0.6))
            if batch[0] is not None:
                self.prepared.append(batch)
        elif action < 0.75 and self.prepared:
            self.both("execute_batch", self.prepared.pop(0))
        elif action < 0.8 and self.prepared:
            self.both("cancel_batch", self.prepared.pop())
        elif action < 0.88:
            handle = rng.choice(self.handles)
            extent = self.both("publish", handle, (0, 0), (1, 1))
            if extent[0] is not None:
                self.extents.append(extent)
                self.both("submit", ((Backup(extent[0]),), (Backup(extent[1]),)))
        elif action < 0.92 and self.extents:
            extent = rng.choice(self.extents)
            self.both("submit", ((Demote(extent[0]),), (Demote(extent[1]),)))
        elif action < 0.96:
            self.both("wait_completions")
        else:
            handle = self.handles.pop(rng.randrange(len(self.handles)))
            self.both("close_request", handle)
        assert comparable(self.fast.probe()) == comparable(self.general.probe())

    def close(self):
        self.fast.close()
        self.general.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fast_path_equals_the_general_route(seed):
    walk = Walk(seed)
    try:
        for number in range(STEPS):
            try:
                walk.step()
            except AssertionError as error:
                raise AssertionError(f"seed {seed}, step {number}: {error}") from None
    finally:
        walk.close()


def test_the_walk_reaches_the_fast_path():
    """The walk is not vacuous: decode steps reuse the memo and open pages on the fast path."""
    walk = Walk(0)
    reused = opened = 0
    try:
        for _ in range(STEPS):
            before = walk.fast.ledger.validated
            walk.step()
            reused += before is not None and walk.fast.ledger.validated is before
            opened += walk.fast.ledger.state.next_page
    finally:
        walk.close()
    assert reused > 0 and opened > 0
