"""A Hypothesis state machine over the reference model, with an independent oracle.

It drives valid and invalid calls (stale, foreign and unknown handles, double release,
bad split points, out-of-range publish, execute twice, execute unprepared or cancelled,
demote of in-use extents, cancel with dependents, the environment's `complete_transfer`,
poll, wait, restart) and checks, after every step:

- every state invariant (`check_invariants`), H3 over every request handle issued, and a
  shadow of the contract-visible state (slot generations and liveness, extent reference
  counts, batch states, epoch) kept by this test from spec/protocol.md alone;
- per call: the transition invariants (`check_transition`), B2 on the returned value,
  and, for a call that raised, deep equality of the model state and of `probe()`;
- per call: the outcome the spec prescribes, computed here from the shadow and the
  previous `probe()` (handle checks in §3 order, then the operation's preconditions).

`MUTANTS` below are deliberately broken models; `test_mutants_are_caught` checks that this
machine catches each one quickly (see `ModelMachine.model_factory`).
"""

from __future__ import annotations

import copy

import attrs
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from cacheruntime.invariants import B2_plain_values, H3_one_live_handle, check_transition
from cacheruntime.model import ReferenceModel
from cacheruntime.pageruns import expand
from cacheruntime.protocol import (
    AlreadyExecuted,
    Backup,
    BatchDependency,
    BatchItem,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    Close,
    ComputeFailed,
    CopyState,
    Demote,
    Drop,
    ExtentInUse,
    ExtentShared,
    ForeignRuntime,
    InvalidPageRun,
    InvalidPlan,
    NoL2,
    NotBackedUp,
    NotPrepared,
    NotResident,
    OutOfOrder,
    OutOfPages,
    OutOfSlots,
    PageRun,
    PreparedBatchHandle,
    Publish,
    Release,
    RequestBusy,
    RequestRuntimeHandle,
    Restore,
    RowFull,
    StaleHandle,
    Tier,
    UnknownHandle,
    WouldLoseData,
    tag_digest,
)

RID = "model"
OK = "ok"  # the call must succeed
TIER = (Backup, Restore, Demote, Drop)
HANDLE_ERRORS = (ForeignRuntime, StaleHandle, UnknownHandle)


def gone(state: CopyState) -> bool:
    """A copy control may not count on (§4.11): none, or one it asked to drop (dropping)."""
    return state is CopyState.ABSENT or state is CopyState.DROPPING


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class ModelMachine(RuleBasedStateMachine):
    model_factory = ReferenceModel

    def __init__(self):
        super().__init__()
        self.m: ReferenceModel | None = None

    @initialize(ps=st.sampled_from([1, 2, 3]), l1=st.integers(3, 10), l2=st.sampled_from([0, 3, 8]))
    def setup(self, ps, l1, l2):
        self.m = self.model_factory(page_size=ps, max_requests=3, max_request_tokens=5 * ps, l1_pages=l1, l2_pages=l2)
        self.ps, self.n_slots, self.max_tokens, self.l2 = ps, 3, 5 * ps, l2
        self.epoch = 0
        self.gen = [0] * 3  # shadow slot generations
        self.live: dict[int, RequestRuntimeHandle] = {}  # slot -> its live handle
        self.outputs = [0] * 3  # outputs a slot may still append
        self.issued: list[RequestRuntimeHandle] = []  # every request handle ever issued
        self.refs: list[CacheExtentRef] = []  # every extent ref ever issued
        self.runs: dict[int, tuple[PageRun, ...]] = {}  # current epoch: generation -> runs issued
        self.refcount: dict[int, int] = {}  # current epoch: live generation -> references
        self.batches: list[PreparedBatchHandle] = []  # every batch handle ever issued
        self.bstate: dict[int, list] = {}  # current epoch: batch id -> [state, slots, plan]
        self.tickets: set[int] = set()  # current epoch: transfer ids returned to control
        self.reported: set[int] = set()  # current epoch: transfer ids reported done
        self.outcomes: dict[str, int] = {}  # coverage of outcomes, for debugging

    # -- the call harness -----------------------------------------------------------------

    def call(self, name, expect, fn, *args, allowed=()):
        """Run one boundary call; `expect` is OK, an error class, or None with `allowed` errors."""
        state, before = copy.deepcopy(self.m.state), self.m.probe()
        try:
            result = fn(*args)
        except CacheRuntimeError as err:
            assert self.m.state == state, f"{name} raised {err!r} but changed the model state"
            assert self.m.probe() == before, f"{name} raised {err!r} but changed the abstract state"
            kind = type(err)
            key = f"{name}:{kind.__name__}"
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            if expect is None:
                assert kind in allowed, f"{name} raised {err!r}; allowed {[a.__name__ for a in allowed]}"
            else:
                assert expect is kind, f"{name} raised {err!r}; spec says {getattr(expect, '__name__', expect)}"
            if kind is OutOfPages:
                assert err.needed > err.free >= 0
            return err
        self.outcomes[f"{name}:ok"] = self.outcomes.get(f"{name}:ok", 0) + 1
        assert expect is OK or expect is None, f"{name} succeeded; spec says {expect.__name__}"
        check_transition(before, self.m.probe())
        assert not B2_plain_values(result), B2_plain_values(result)
        return result

    def failed(self, result) -> bool:
        return isinstance(result, CacheRuntimeError)

    # -- the shadow's view of handles (§3) ----------------------------------------------

    def origin(self, runtime_id, epoch):
        if runtime_id != RID:
            return ForeignRuntime
        if epoch < self.epoch:
            return StaleHandle
        if epoch > self.epoch:
            return UnknownHandle
        return None

    def req_status(self, h):
        err = self.origin(h.runtime_id, h.epoch)
        if err:
            return err
        if not 0 <= h.slot_id < self.n_slots:
            return UnknownHandle
        if h.generation < self.gen[h.slot_id]:
            return StaleHandle
        if h.generation > self.gen[h.slot_id] or h.slot_id not in self.live:
            return UnknownHandle
        return None

    def ext_status(self, x):
        err = self.origin(x.runtime_id, x.epoch)
        if err:
            return err
        if x.generation in self.refcount:
            return None if x.page_runs == self.runs[x.generation] else UnknownHandle
        return StaleHandle if x.generation in self.runs else UnknownHandle

    def batch_status(self, b):
        err = self.origin(b.runtime_id, b.epoch)
        if err:
            return err
        return None if b.batch_id in self.bstate else UnknownHandle

    def intent_status(self, intent):
        if isinstance(intent, (Publish, Close)):
            return self.req_status(intent.request)
        err = self.ext_status(intent.extent)
        if err is None and isinstance(intent, TIER) and not self.l2:
            return NoL2
        return err

    # -- drawing handles, valid and not ---------------------------------------------------

    def nothing_live(self, data, live) -> bool:
        """With nothing live to act on, skip the step three times in four."""
        return not live and data.draw(st.integers(0, 3)) > 0

    def mutation(self, data, kinds):
        """Mostly no change; now and then a way to make a handle bad."""
        return data.draw(st.sampled_from(["as is"] * 12 + kinds))

    def draw_request(self, data):
        live = list(self.live.values())
        if live and data.draw(st.integers(0, 4)):
            h = data.draw(st.sampled_from(live))
        elif self.issued:
            h = data.draw(st.sampled_from(self.issued))
        else:
            h = RequestRuntimeHandle(RID, self.epoch, 0, 0)
        how = self.mutation(data, ["foreign", "next epoch", "bad slot", "next generation"])
        if how == "foreign":
            return attrs.evolve(h, runtime_id="other")
        if how == "next epoch":
            return attrs.evolve(h, epoch=h.epoch + 1)
        if how == "bad slot":
            return attrs.evolve(h, slot_id=data.draw(st.sampled_from([-1, self.n_slots])))
        if how == "next generation":
            return attrs.evolve(h, generation=h.generation + 1)
        return h

    def draw_extent(self, data):
        live = [x for x in self.refs if self.ext_status(x) is None]
        if live and data.draw(st.integers(0, 4)):
            x = data.draw(st.sampled_from(live))
        elif self.refs:
            x = data.draw(st.sampled_from(self.refs))
        else:
            x = CacheExtentRef(RID, self.epoch, 1, (PageRun(0, 1),))
        how = self.mutation(data, ["foreign", "next epoch", "never issued", "other runs"])
        if how == "foreign":
            return attrs.evolve(x, runtime_id="other")
        if how == "next epoch":
            return attrs.evolve(x, epoch=x.epoch + 1)
        if how == "never issued":
            return attrs.evolve(x, generation=data.draw(st.sampled_from([0, 10_000])))
        if how == "other runs":
            return attrs.evolve(x, page_runs=x.page_runs + (PageRun(99, 1),))
        return x

    def draw_batch(self, data):
        mine = [b for b in self.batches if b.epoch == self.epoch]
        if mine and data.draw(st.integers(0, 4)):
            b = data.draw(st.sampled_from(mine))
        elif self.batches:
            b = data.draw(st.sampled_from(self.batches))
        else:
            b = PreparedBatchHandle(RID, self.epoch, 0)
        how = self.mutation(data, ["foreign", "next epoch", "never prepared"])
        if how == "foreign":
            return attrs.evolve(b, runtime_id="other")
        if how == "next epoch":
            return attrs.evolve(b, epoch=b.epoch + 1)
        if how == "never prepared":
            return attrs.evolve(b, batch_id=10_000)
        return b

    def draw_intent(self, data, kinds):
        kind = data.draw(st.sampled_from(kinds))
        if kind is Publish:
            return Publish(self.draw_request(data), data.draw(st.integers(-1, 4)), data.draw(st.integers(0, 3)))
        if kind is Close:
            return Close(self.draw_request(data))
        return kind(self.draw_extent(data))

    # -- shadow updates -------------------------------------------------------------------

    def retire_slot(self, slot):
        del self.live[slot]
        self.gen[slot] += 1

    def add_ref(self, x):
        assert x.epoch == self.epoch and x.generation not in self.runs, f"extent generation {x.generation} reused"
        self.refs.append(x)
        self.runs[x.generation] = x.page_runs
        self.refcount[x.generation] = 1

    def drop_ref(self, x):
        self.refcount[x.generation] -= 1
        if not self.refcount[x.generation]:
            del self.refcount[x.generation]

    def pages_of(self, view, x):
        return expand(x.page_runs)

    # -- rules: requests ----------------------------------------------------------------

    @rule(data=st.data())
    def open_request(self, data):
        free = [s for s in range(self.n_slots) if s not in self.live]
        if self.nothing_live(data, free):
            return
        self.do_open()

    def do_open(self):
        free = [s for s in range(self.n_slots) if s not in self.live]
        h = self.call("open_request", OK if free else OutOfSlots, self.m.open_request)
        if not self.failed(h):
            assert (h.runtime_id, h.epoch, h.slot_id, h.generation) == (RID, self.epoch, free[0], self.gen[free[0]])
            self.live[h.slot_id] = h
            self.issued.append(h)
            self.outputs[h.slot_id] = 0

    @rule(data=st.data())
    def close_request(self, data):
        if self.nothing_live(data, self.live):
            return
        h = self.draw_request(data)
        expect = self.req_status(h)
        if expect is None:
            busy = any(s == "prepared" and h.slot_id in slots for s, slots, _ in self.bstate.values())
            expect = RequestBusy if busy else OK
        if not self.failed(self.call("close_request", expect, self.m.close_request, h)):
            self.retire_slot(h.slot_id)

    # -- rules: batches -------------------------------------------------------------------

    @rule(data=st.data())
    def prepare_batch(self, data):
        """Any plan: empty, duplicate requests, bad handles, zero tokens, bad attach, ..."""
        items = []
        for _ in range(data.draw(st.integers(0, 3))):
            request = self.draw_request(data)
            attach = ()
            if data.draw(st.integers(0, 3)) == 0:
                attach = tuple(self.draw_extent(data) for _ in range(data.draw(st.integers(1, 2))))
            n = data.draw(st.integers(0, 2 * self.ps))
            items.append(BatchItem(request, tuple(range(n)), attach, data.draw(st.booleans())))
        intents = tuple(self.draw_intent(data, [Backup, Restore, Restore, Demote, Drop, Release, Publish, Close]) for _ in range(data.draw(st.integers(0, 2))))
        self.do_prepare(BatchPlan(tuple(items), intents))

    @rule(data=st.data())
    def serve_step(self, data):
        """A plan a scheduler would send: live requests, prefix attach on fresh rows, a few
        intents; then execute it at once, later, or never."""
        live = sorted(self.live)
        if not live:
            return
        view = self.m.probe()
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=len(live), unique=True))
        items, intents = [], []
        for slot in chosen:
            attach = ()
            extents = [x for x in self.refs if self.ext_status(x) is None]
            if not view.slots[slot].reserved_tokens and extents and data.draw(st.booleans()):
                attach = (data.draw(st.sampled_from(extents)),)
                pages = {p.page: p for p in view.pages}
                demoted = any(gone(pages[p].l1) for p in expand(attach[0].page_runs))
                if data.draw(st.integers(0, 9)) < (9 if demoted else 2):
                    intents.append(Restore(attach[0]))
            append = self.outputs[slot] > 0 and data.draw(st.booleans())
            n = data.draw(st.integers(0 if append else 1, self.ps + 1))
            items.append(BatchItem(self.live[slot], tuple(range(n)), attach, append))
        extents = [x for x in self.refs if self.ext_status(x) is None]
        for _ in range(data.draw(st.integers(0, 2))):
            kind = data.draw(st.sampled_from([Backup, Demote, Drop, Release, Publish, Publish, Close]))
            if kind is Publish:
                slot = data.draw(st.sampled_from(chosen))
                full = (view.slots[slot].reserved_tokens + self.ps + 1) // self.ps
                first = data.draw(st.integers(0, max(0, full - 1)))
                intents.append(Publish(self.live[slot], first, data.draw(st.integers(1, max(1, full - first)))))
            elif kind is Close:
                intents.append(Close(self.live[data.draw(st.sampled_from(live))]))
            elif extents:
                intents.append(kind(data.draw(st.sampled_from(extents))))
        b = self.do_prepare(BatchPlan(tuple(items), tuple(intents)), name="serve:prepare")
        if b is not None and data.draw(st.integers(0, 3)):
            self.do_execute(b, name="serve:execute")

    @rule(data=st.data())
    def serve_step_again(self, data):
        """The same as serve_step: a second rule doubles how often valid plans are drawn."""
        self.serve_step(data)

    def do_prepare(self, the_plan, name="prepare_batch"):
        items, intents = the_plan.items, the_plan.intents
        expect, allowed = self.expect_prepare(the_plan), ()
        if isinstance(expect, set):
            expect, allowed = (expect.pop(), ()) if len(expect) == 1 else (None, tuple(expect))
        view = self.m.probe()
        b = self.call(name, expect, self.m.prepare_batch, the_plan, allowed=allowed)
        if self.failed(b):
            return None
        assert (b.runtime_id, b.epoch) == (RID, self.epoch) and b.batch_id not in self.bstate
        self.batches.append(b)
        self.bstate[b.batch_id] = ["prepared", {i.request.slot_id for i in items}, the_plan]
        after = self.m.probe()
        for i in items:
            self.outputs[i.request.slot_id] += 1 - int(i.append_previous_output)
            old, new = view.slots[i.request.slot_id], after.slots[i.request.slot_id]
            attached = [p for x in i.attach for p in expand(x.page_runs)]
            assert new.pages[: len(old.pages)] == old.pages
            assert new.pages[len(old.pages) : len(old.pages) + len(attached)] == tuple(attached)
            assert new.reserved_tokens == old.reserved_tokens + len(attached) * self.ps + i.new_tokens
            assert len(new.pages) == ceil_div(new.reserved_tokens, self.ps) and new.num_tokens == old.num_tokens
        pages = {p.page: p for p in after.pages}
        for intent in intents:
            if isinstance(intent, Restore):
                assert all(not gone(pages[p].l1) for p in expand(intent.extent.page_runs))
        return b

    def expect_prepare(self, the_plan):
        """The error spec §4.4 prescribes for this plan, or OK."""
        if not the_plan.items:
            return InvalidPlan
        for i in the_plan.items:
            for err in [self.req_status(i.request)] + [self.ext_status(x) for x in i.attach]:
                if err:
                    return err
        errs = [self.intent_status(i) for i in the_plan.intents]
        handle_errs = [e for e in errs if e and e is not NoL2]
        if any(errs):
            first = next(e for e in errs if e)
            # §4.4 does not say where NoL2 falls among the handle checks: accept either reading
            return {first, handle_errs[0] if handle_errs else NoL2}
        slots = [i.request.slot_id for i in the_plan.items]
        if len(set(slots)) != len(slots):
            return InvalidPlan
        view = self.m.probe()
        pages = {p.page: p for p in view.pages}
        restoring, moving = set(), set()
        for intent in the_plan.intents:
            if isinstance(intent, Restore):
                for p in expand(intent.extent.page_runs):
                    if pages[p].l1 is CopyState.ABSENT:
                        if gone(pages[p].l2):
                            return NotBackedUp
                        moving.add(p)
                    restoring.add(p)  # a dropping device copy is kept, with nothing to move
        need = len(moving)
        for i in the_plan.items:
            slot = view.slots[i.request.slot_id]
            attached = [p for x in i.attach for p in expand(x.page_runs)]
            if i.new_tokens < 1 or (i.attach and slot.reserved_tokens):
                return InvalidPlan
            if i.append_previous_output and self.outputs[slot.slot_id] < 1:
                return RequestBusy
            if any(gone(pages[p].l1) and p not in restoring for p in attached):
                return NotResident
            end = slot.reserved_tokens + len(attached) * self.ps + i.new_tokens
            if end > self.max_tokens:
                return RowFull
            need += ceil_div(end, self.ps) - len(slot.pages) - len(attached)
        free_l1 = len(next(p for p in view.pools if p.tier is Tier.L1).free)
        return OutOfPages if need > free_l1 else OK

    @rule(data=st.data())
    def execute_batch(self, data):
        if self.nothing_live(data, [b for b, v in self.bstate.items() if v[0] == "prepared"]):
            return
        self.do_execute(self.draw_batch(data))

    def do_execute(self, b, name="execute_batch"):
        expect = self.batch_status(b)
        allowed = ()
        if expect is None:
            state, slots, the_plan = self.bstate[b.batch_id]
            if state == "executed":
                expect = AlreadyExecuted
            elif state in ("cancelled", "failed"):
                expect = NotPrepared
            elif any(o < b.batch_id and s == "prepared" and slots & ss for o, (s, ss, _) in self.bstate.items()):
                expect = OutOfOrder
            elif all(isinstance(i, Restore) for i in the_plan.intents):
                expect = OK
            else:  # recorded intents are checked against the state after compute
                allowed = (OutOfPages, InvalidPageRun, ExtentInUse, NotBackedUp, WouldLoseData, StaleHandle, RequestBusy)
            view = self.m.probe()
            copies = {p.page: p.l1 for p in view.pages}
            if expect is OK or allowed:  # a page a row reads whose restore failed (FailTransfer): the batch fails (§4.5)
                if any(copies.get(p) is CopyState.ABSENT for slot in slots for p in view.slots[slot].pages):
                    expect, allowed = (ComputeFailed, ()) if expect is OK else (None, (*allowed, ComputeFailed))
        done = self.call(name, expect, self.m.execute_batch, b, allowed=allowed)
        if isinstance(done, ComputeFailed):
            for failed in done.batches:
                self.bstate[failed][0] = "failed"
                for i in self.bstate[failed][2].items:
                    self.outputs[i.request.slot_id] -= 1 - int(i.append_previous_output)
            return done
        if self.failed(done):
            return done
        self.bstate[b.batch_id][0] = "executed"
        the_plan = self.bstate[b.batch_id][2]
        assert done.batch == b and [r.request for r in done.items] == [i.request for i in the_plan.items]
        view = self.m.probe()
        for intent in the_plan.intents:
            if isinstance(intent, Close):
                self.retire_slot(intent.request.slot_id)
            elif isinstance(intent, Release):
                self.drop_ref(intent.extent)
        for x in done.published:
            self.add_ref(x)
        self.tickets |= {t.transfer_id for t in done.tickets}
        assert len(done.published) == sum(isinstance(i, Publish) for i in the_plan.intents)
        assert len(done.tickets) == sum(isinstance(i, Backup) for i in the_plan.intents)
        pages = {p.page: p for p in view.pages}
        for r in done.items:
            slot = view.slots[r.request.slot_id]
            if not slot.live or slot.generation != r.request.generation:
                continue  # closed by an intent of this batch
            # D1 through the boundary: the token is the digest of the tags last written
            last = [v for p in slot.pages for v in pages[p].versions][: r.num_tokens]
            assert r.next_token == tag_digest(tuple(last)), "compute read something other than the last write"
            assert slot.num_tokens >= r.num_tokens

    @rule(data=st.data())
    def cancel_batch(self, data):
        if self.nothing_live(data, [b for b, v in self.bstate.items() if v[0] == "prepared"]):
            return
        b = self.draw_batch(data)
        expect = self.batch_status(b)
        if expect is None:
            state, slots, _ = self.bstate[b.batch_id]
            if state == "executed":
                expect = AlreadyExecuted
            elif state in ("cancelled", "failed"):
                expect = NotPrepared
            elif any(o > b.batch_id and s == "prepared" and slots & ss for o, (s, ss, _) in self.bstate.items()):
                expect = BatchDependency
            else:
                expect = OK
        if not self.failed(self.call("cancel_batch", expect, self.m.cancel_batch, b)):
            self.bstate[b.batch_id][0] = "cancelled"
            for i in self.bstate[b.batch_id][2].items:
                self.outputs[i.request.slot_id] -= 1 - int(i.append_previous_output)

    # -- rules: extents -------------------------------------------------------------------

    @rule(data=st.data())
    def publish(self, data):
        if data.draw(st.booleans()):
            return self.publish_full_pages(data)
        if self.nothing_live(data, self.live):
            return
        h = self.draw_request(data)
        expect = self.req_status(h)
        full = 0
        if expect is None:
            full = self.m.probe().slots[h.slot_id].num_tokens // self.ps
        first = data.draw(st.integers(-1, full + 1))
        count = data.draw(st.integers(0, full + 1))
        if expect is None:
            expect = OK if count >= 1 and first >= 0 and first + count <= full else InvalidPageRun
        x = self.call("publish", expect, self.m.publish, h, first, count)
        if not self.failed(x):
            row = self.m.probe().slots[h.slot_id].pages
            assert expand(x.page_runs) == row[first : first + count]
            self.add_ref(x)

    def publish_full_pages(self, data):
        """A valid publish, as the tree inserts a computed prefix."""
        view = self.m.probe()
        rows = [s for s in sorted(self.live) if view.slots[s].num_tokens >= self.ps]
        if not rows:
            return
        slot = data.draw(st.sampled_from(rows))
        full = view.slots[slot].num_tokens // self.ps
        first = data.draw(st.integers(0, full - 1))
        count = data.draw(st.integers(1, full - first))
        x = self.call("publish", OK, self.m.publish, self.live[slot], first, count)
        assert expand(x.page_runs) == view.slots[slot].pages[first : first + count]
        self.add_ref(x)

    @rule(data=st.data())
    def finish_request(self, data):
        """A request ends the way serving ends one: its full pages become an extent, then it closes."""
        view = self.m.probe()
        busy = {s for state, slots, _ in self.bstate.values() if state == "prepared" for s in slots}
        rows = [s for s in sorted(self.live) if view.slots[s].num_tokens >= self.ps and s not in busy]
        if not rows:  # serve a new request first
            if len(self.live) == self.n_slots:
                return
            self.do_open()
            h = self.issued[-1]
            n = data.draw(st.integers(self.ps, 3 * self.ps))
            b = self.do_prepare(BatchPlan((BatchItem(h, tuple(range(n))),)), name="finish:prepare")
            if b is None:
                return
            self.do_execute(b, name="finish:execute")
            rows = [h.slot_id]
            view = self.m.probe()
        slot = data.draw(st.sampled_from(rows))
        x = self.call("publish", OK, self.m.publish, self.live[slot], 0, view.slots[slot].num_tokens // self.ps)
        self.add_ref(x)
        self.call("close_request", OK, self.m.close_request, self.live[slot])
        self.retire_slot(slot)

    def unmapped_extents(self):
        view = self.m.probe()
        mapped = {p for s in view.slots if s.live for p in s.pages}
        return [x for x in self.refs if self.ext_status(x) is None and not mapped & set(expand(x.page_runs))]

    def evict(self, data, x=None):
        """The tree evicts a leaf: back it up and demote it in one submit."""
        extents = [x for x in self.refs if self.ext_status(x) is None]
        if not extents or not self.l2:
            return None
        unmapped = self.unmapped_extents()
        if x is None:
            x = data.draw(st.sampled_from(unmapped if unmapped and data.draw(st.integers(0, 4)) else extents))
        expect = self.expect_tier(Backup(x))
        if expect is OK:
            view = self.m.probe()
            mapped = {p for s in view.slots if s.live for p in s.pages}
            expect = ExtentInUse if mapped & set(expand(x.page_runs)) else OK
        tickets = self.call("evict", expect, self.m.submit, (Backup(x), Demote(x)))
        if not self.failed(tickets):
            self.tickets |= {t.transfer_id for t in tickets}
        return tickets

    @rule(data=st.data())
    def prefix_hit_on_l2(self, data):
        """Scenario 1 as a rule: a finished request's prefix goes to L2 and a new request reuses it,
        with the backup and the restore completing (or not) at random points."""
        if not self.l2:
            return
        if not self.unmapped_extents():
            self.finish_request(data)
        unmapped = self.unmapped_extents()
        if not unmapped:
            return
        x = data.draw(st.sampled_from(unmapped))
        if self.failed(self.evict(data, x)):
            return
        for _ in range(data.draw(st.integers(0, 2))):
            self.complete_transfer(data)
        if len(self.live) == self.n_slots:
            return
        self.do_open()
        h = self.issued[-1]  # the request open_request just opened
        n = data.draw(st.integers(1, self.ps + 1))
        restore = (Restore(x),) if data.draw(st.integers(0, 3)) else ()  # without it: NotResident
        b = self.do_prepare(BatchPlan((BatchItem(h, tuple(range(n)), (x,)),), restore), name="hit:prepare")
        if b is not None and data.draw(st.integers(0, 3)):
            self.do_execute(b, name="hit:execute")

    def split_valid(self, data):
        """The tree splits a node at a page boundary."""
        extents = [x for x in self.refs if self.ext_status(x) is None and x.page_count > 1 and self.refcount[x.generation] == 1]
        if not extents:
            return
        x = data.draw(st.sampled_from(extents))
        at = data.draw(st.integers(1, x.page_count - 1))
        head, tail = self.call("split", OK, self.m.split, x, at)
        assert expand(head.page_runs) + expand(tail.page_runs) == expand(x.page_runs)
        del self.refcount[x.generation]
        self.add_ref(head)
        self.add_ref(tail)

    @rule(data=st.data())
    def split(self, data):
        if data.draw(st.booleans()):
            return self.split_valid(data)
        if self.nothing_live(data, self.refcount):
            return
        x = self.draw_extent(data)
        at = data.draw(st.integers(-1, x.page_count + 1))
        expect = self.ext_status(x)
        if expect is None:
            if self.refcount[x.generation] != 1:
                expect = ExtentShared
            else:
                expect = OK if 0 < at < x.page_count else InvalidPageRun
        halves = self.call("split", expect, self.m.split, x, at)
        if not self.failed(halves):
            head, tail = halves
            assert expand(head.page_runs) + expand(tail.page_runs) == expand(x.page_runs)
            assert expand(head.page_runs) == expand(x.page_runs)[:at]
            del self.refcount[x.generation]
            self.add_ref(head)
            self.add_ref(tail)

    @rule(data=st.data())
    def retain(self, data):
        if self.nothing_live(data, self.refcount):
            return
        x = self.draw_extent(data)
        if not self.failed(self.call("retain", self.ext_status(x) or OK, self.m.retain, x)):
            self.refcount[x.generation] += 1

    @rule(data=st.data())
    def release(self, data):
        if self.nothing_live(data, self.refcount):
            return
        x = self.draw_extent(data)
        if not self.failed(self.call("release", self.ext_status(x) or OK, self.m.release, x)):
            self.drop_ref(x)

    # -- rules: tier moves ----------------------------------------------------------------

    @rule(data=st.data(), how=st.sampled_from(["evict", "evict", "tier_step", "any"]))
    def submit(self, data, how):
        if how == "evict":
            self.evict(data)
            return
        if how == "tier_step":
            return self.tier_step(data, data.draw(st.sampled_from([Backup, Backup, Restore, Demote, Demote, Drop])))
        if self.nothing_live(data, self.refcount):
            return
        kinds = [Backup, Backup, Restore, Restore, Demote, Demote, Drop, Release, Publish]
        intents = tuple(self.draw_intent(data, kinds) for _ in range(data.draw(st.integers(1, 2))))
        expect, allowed = None, ()
        readings = set()  # §4.11 reads two ways: per intent in order, or types, then handles, then NoL2
        for order in ("interleaved", "types first"):
            errs = [InvalidPlan if not isinstance(i, TIER) else self.intent_status(i) for i in intents]
            if order == "types first":
                errs = sorted((e for e in errs if e), key=lambda e: {InvalidPlan: 0, NoL2: 2}.get(e, 1))
            first = next((e for e in errs if e), None)
            if first:
                readings.add(first)
        if len(readings) == 1:
            expect = readings.pop()
        elif readings:
            allowed = tuple(readings)
        if expect is None and not allowed and len(intents) == 1:
            expect = self.expect_tier(intents[0])
        elif expect is None and not allowed:
            allowed = (OutOfPages, NotBackedUp, ExtentInUse, WouldLoseData)
        tickets = self.call("submit", expect, self.m.submit, intents, allowed=allowed)
        if not self.failed(tickets):
            moves = [i for i in intents if isinstance(i, (Backup, Restore))]
            assert [t.extent_generation for t in tickets] == [i.extent.generation for i in moves]
            self.tickets |= {t.transfer_id for t in tickets}

    def expect_tier(self, intent):
        """The outcome §4.11 prescribes for one tier intent on the current state."""
        view = self.m.probe()
        pages = {p.page: p for p in view.pages}
        names = expand(intent.extent.page_runs)
        free = {pool.tier: len(pool.free) for pool in view.pools}
        if isinstance(intent, Backup):
            todo = [p for p in names if pages[p].l2 is CopyState.ABSENT]
            return OutOfPages if len(todo) > free[Tier.L2] else OK
        if isinstance(intent, Restore):
            todo = [p for p in names if pages[p].l1 is CopyState.ABSENT]
            if any(gone(pages[p].l2) for p in todo):
                return NotBackedUp
            return OutOfPages if len(todo) > free[Tier.L1] else OK
        if isinstance(intent, Demote):
            if any(gone(pages[p].l2) for p in names):
                return NotBackedUp
            mapped = {p for s in view.slots if s.live for p in s.pages}
            return ExtentInUse if mapped & set(names) else OK
        return WouldLoseData if any(gone(pages[p].l1) for p in names) else OK

    def tier_step(self, data, kind):
        """One tier move on a live extent, as eviction and prefetch send them."""
        extents = [x for x in self.refs if self.ext_status(x) is None]
        if not extents:
            return
        intent = kind(data.draw(st.sampled_from(extents)))
        expect = NoL2 if not self.l2 else self.expect_tier(intent)
        tickets = self.call("tier_step", expect, self.m.submit, (intent,))
        if not self.failed(tickets):
            self.tickets |= {t.transfer_id for t in tickets}

    # -- rules: completions and the environment --------------------------------------------

    def complete_transfer(self, data):
        ready = self.m.completable()
        in_flight = [t.transfer_id for t in self.m.probe().transfers]
        assert set(ready) <= set(in_flight) and (not in_flight or ready), "a transfer cycle"
        if ready and data.draw(st.integers(0, 4)):
            before = self.m.probe()
            transfer_id = data.draw(st.sampled_from(ready))
            if data.draw(st.integers(0, 3)):
                self.m.complete_transfer(transfer_id)
            else:  # FailTransfer: the destination goes, a dropping source is valid again (F1)
                self.m.fail_transfer(transfer_id)
            check_transition(before, self.m.probe())
        else:
            t = data.draw(st.sampled_from(sorted(set(in_flight) - set(ready)) + [10_000]))
            state = copy.deepcopy(self.m.state)
            with pytest.raises(ValueError):
                self.m.complete_transfer(t)
            assert self.m.state == state

    def note_reported(self, done):
        ids = [c.ticket.transfer_id for c in done]
        assert len(set(ids)) == len(ids) and not set(ids) & self.reported, "a completion reported twice"
        assert all(c.ticket.epoch == self.epoch for c in done)
        self.reported |= set(ids)

    @rule(data=st.data(), how=st.sampled_from(["poll", "wait", "complete", "complete"]))
    def completions(self, data, how):
        if how == "complete":
            return self.complete_transfer(data)
        if how == "poll":
            self.note_reported(self.call("poll_completions", OK, self.m.poll_completions))
            return
        self.note_reported(self.call("wait_completions", OK, self.m.wait_completions))
        assert self.m.probe().transfers == ()
        assert self.tickets <= self.reported, "a ticket returned to control was never reported"

    @rule(data=st.data())
    def restart(self, data):
        if data.draw(st.integers(0, 5)):
            return  # restarts are rare, or little else gets done
        info = self.call("restart", OK, self.m.restart)
        self.epoch += 1
        assert info.epoch == self.epoch
        for slot in list(self.live):
            self.retire_slot(slot)
        self.runs, self.refcount, self.bstate = {}, {}, {}
        self.tickets, self.reported = set(), set()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        if self.m is None:
            return
        self.m.check_invariants()
        view = self.m.probe()
        assert not H3_one_live_handle(view, self.issued)
        assert view.epoch == self.epoch
        assert [(s.generation, s.live) for s in view.slots] == [(g, i in self.live) for i, g in enumerate(self.gen)]
        assert {e.generation: e.refcount for e in view.extents} == self.refcount
        for e in view.extents:
            assert e.pages == expand(self.runs[e.generation])
        assert {b.batch_id: b.state for b in view.batches} == {b: s[0] for b, s in self.bstate.items()}
        # A row holds exactly the pages its reservation covers: what cancel restores from a batch's start_tokens.
        assert all(len(s.pages) == ceil_div(s.reserved_tokens, self.ps) for s in view.slots)
        lost = [p.page for p in view.pages if not (p.l1.readable or p.l2.readable)]
        assert not lost, f"pages {lost} have no readable copy in any tier (F1)"


def _ci_examples() -> int:
    return max(200, settings.default.max_examples)


ModelMachine.TestCase.settings = settings(settings.default, max_examples=_ci_examples(), stateful_step_count=max(100, settings.default.stateful_step_count))
TestModelMachine = ModelMachine.TestCase


# ------------------------------------------------------------------------------------------
# Mutation sanity: deliberately broken models the machine must catch
# ------------------------------------------------------------------------------------------


class FreesAtOneHolder(ReferenceModel):
    """drop_holder frees a page when one holder is left (a use after free)."""

    def drop_holder(self, name):
        page = self.state.pages[name]
        page.holders -= 1
        if page.holders <= 1:
            for tier in list(page.copies):
                self.drop_copy(name, tier)
            del self.state.pages[name]


class NoGenerationCheck(ReferenceModel):
    """check_slot accepts any generation of a live slot (H1: a stale handle acts on the new request)."""

    def check_slot(self, request):
        self.check_origin("request handle", request.runtime_id, request.epoch)
        if not 0 <= request.slot_id < len(self.state.slots) or not self.state.slots[request.slot_id].live:
            raise UnknownHandle("no such live slot")
        return self.state.slots[request.slot_id]


class NoDeferredFree(ReferenceModel):
    """free_phys frees at once even while a transfer reads or writes the page (O3)."""

    def free_phys(self, tier, phys):
        self.state.pools[tier].free.append(phys)


class ComputeSkipsRestores(ReferenceModel):
    """execute_batch does not wait for the restores its pages need (O1)."""

    def await_restores(self, pages):
        return None


class SplitKeepsOldRef(ReferenceModel):
    """split issues the halves but leaves the old ref live (scenario 10)."""

    def split(self, extent, at_page):
        record = self.check_extent(extent)
        head, tail = ReferenceModel.split.__wrapped__(self, extent, at_page)
        self.state.extents[extent.generation] = record
        return head, tail


class ExecuteWithoutRollback(ReferenceModel):
    """execute_batch runs outside the transaction: a failing intent leaves the compute done."""

    def execute_batch(self, batch):
        return self.execute(batch)


MUTANTS = [FreesAtOneHolder, NoGenerationCheck, NoDeferredFree, ComputeSkipsRestores, SplitKeepsOldRef, ExecuteWithoutRollback]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda c: c.__name__)
def test_mutants_are_caught(mutant):
    machine = type(f"{mutant.__name__}Machine", (ModelMachine,), {"model_factory": mutant})
    quick = settings(
        max_examples=300,
        stateful_step_count=50,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        report_multiple_bugs=False,
    )
    with pytest.raises((AssertionError, KeyError)):
        run_state_machine_as_test(machine, settings=quick)
