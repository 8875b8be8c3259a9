"""D1 on real bytes: the tiny decoder's served tokens equal recomputation without a cache.

A request's prefix is computed once, published, backed up to L2, demoted and restored
into other device pages, and attached by new requests; every next token the runtime
serves must equal `reference_next_token` of the full sequence. A KV page read stale, torn
or from the wrong place changes the attention inputs and, with overwhelming probability
over a few dozen greedy steps, some token.
"""

from __future__ import annotations

import random

import pytest

from cacheruntime.invariants import check_state
from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Restore, Tier, Unsupported
from cacheruntime.runtime.factories import conformance, local

PAGE = 4


class Served:
    """A request served by the runtime, with the token sequence it has seen so far."""

    def __init__(self, rt, tokens: list[int], attach=()):
        self.rt, self.handle, self.tokens, self.attach = rt, rt.open_request(), list(tokens), tuple(attach)
        self.pending = list(tokens)
        self.outputs: list[tuple[int, int]] = []  # (served, reference)

    def item(self) -> BatchItem:
        new, self.pending = tuple(self.pending), []
        attach, self.attach = self.attach, ()
        return BatchItem(self.handle, new, attach, append_previous_output=not new)

    def record(self, result) -> None:
        self.outputs.append((result.next_token, self.rt.reference_next_token(self.tokens)))
        self.tokens.append(result.next_token)


def step(rt, requests: list[Served], intents=()):
    done = rt.execute_batch(rt.prepare_batch(BatchPlan(tuple(r.item() for r in requests), tuple(intents))))
    for request, result in zip(requests, done.items):
        request.record(result)
    return done


@pytest.mark.parametrize("delay", [0.0, 0.02])
def test_served_tokens_equal_recomputation_across_backup_demote_restore(device, delay):
    # 12 device pages: the free list wraps, so the restore lands on pages other requests wrote
    rt = local(device, page_size=PAGE, max_requests=4, max_request_tokens=64, l1_pages=12, l2_pages=24, seed=1)
    rt.set_transfer_delay(delay)
    rng = random.Random(7)
    prompt = [rng.randrange(97) for _ in range(3 * PAGE + 1)]

    first = Served(rt, prompt)
    step(rt, [first])
    for _ in range(3):
        step(rt, [first])  # decode: append the previous output
    prefix = rt.publish(first.handle, 0, 3)
    rt.submit((Backup(prefix),))

    # prefix reuse from L1 while the backup is in flight
    resident = Served(rt, prompt[: 3 * PAGE] + [rng.randrange(97) for _ in range(5)], attach=(prefix,))
    resident.pending = resident.tokens[3 * PAGE :]
    step(rt, [resident, first])

    rt.close_request(resident.handle)
    rt.close_request(first.handle)
    rt.wait_completions()  # the backup lands: the demote frees the device pages at once (in flight, it would keep them)
    rt.submit((Demote(prefix),))
    filler = Served(rt, [rng.randrange(97) for _ in range(16)])  # reuses pages the closed requests wrote
    step(rt, [filler])

    # prefix reuse from L2: restored into other device pages, then decode
    restored = Served(rt, prompt[: 3 * PAGE] + [rng.randrange(97) for _ in range(2)], attach=(prefix,))
    restored.pending = restored.tokens[3 * PAGE :]
    step(rt, [restored], intents=(Restore(prefix),))
    for _ in range(4):
        step(rt, [restored, filler])
    rt.wait_completions()
    check_state(rt.probe())

    outputs = [pair for r in (first, resident, filler, restored) for pair in r.outputs]
    assert len(outputs) == 16
    mismatches = [(served, reference) for served, reference in outputs if served != reference]
    assert not mismatches, f"served tokens differ from recomputation: {mismatches}"
    assert len({served for served, _ in outputs}) > 3, "the decoder must not be degenerate"
    l1 = dict(next(p for p in rt.probe().pools if p.tier is Tier.L1).mapped)
    prefix_phys = {phys for phys, name in l1.items() if name in (0, 1, 2)}
    assert prefix_phys and not prefix_phys & {0, 1, 2}, "the prefix was restored into other device pages"
    rt.close()


def test_recomputation_sees_a_wrong_prefix(device):
    """The comparison above can fail: a prefix computed for other tokens gives other outputs."""
    rt = local(device, page_size=PAGE, max_requests=2, max_request_tokens=64, l1_pages=16, l2_pages=0, seed=1)
    rng = random.Random(3)
    a = Served(rt, [rng.randrange(97) for _ in range(2 * PAGE)])
    step(rt, [a])
    prefix = rt.publish(a.handle, 0, 2)
    liar = Served(rt, [rng.randrange(97) for _ in range(2 * PAGE)] + [5, 6], attach=(prefix,))
    liar.pending = [5, 6]
    for _ in range(6):
        step(rt, [liar])
    assert any(served != reference for served, reference in liar.outputs)
    rt.close()


def test_reference_needs_the_tiny_runner():
    with pytest.raises(Unsupported):
        conformance().reference_next_token([1, 2, 3])
