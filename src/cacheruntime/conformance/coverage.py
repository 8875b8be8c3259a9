"""Reach, measured: the named situations the suite claims to drive a runtime into, and how often it did.

A check that never restarts with a transfer in flight cannot catch a runtime that forgets
in-flight transfers at restart, however many cases it runs. So the suite names the hard
situations (issue 14: the ones runtimes are broken in, and those each survivor of the
mutant families needs) and counts, per check, in how many cases and calls each was reached.
Every situation is judged from the *model's* state and the model's outcome of the same call
(arguments as the model sees them, after renaming), never from the runtime's: the same
sequence of calls reaches the same situations on every runtime that conforms, so the floors
below are a property of the suite's sequences, not of one runtime's timing.

The machine (`cacheruntime.conformance.statemachine`) reports each call to `observe`, which
emits a Hypothesis `event` per situation reached (shown with
`--hypothesis-show-statistics`) and counts it, per check, in what `recording()` made active.
`cacheruntime conformance --coverage` prints the tally per check;
tests/conformance/test_coverage.py holds the CI profile to `Situation.floor` in each check
that `Situation.checks` names.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import attrs
from hypothesis import event
from hypothesis.control import currently_in_test_context

from cacheruntime import pageruns
from cacheruntime.conformance.renaming import UNCOALESCED
from cacheruntime.model.records import State
from cacheruntime.protocol import (
    Backup,
    BatchPlan,
    CacheExtentRef,
    CacheRuntimeError,
    Close,
    Demote,
    Drop,
    OutOfPages,
    PageRun,
    Persist,
    PreparedBatchHandle,
    Publish,
    RequestRuntimeHandle,
    Restore,
    Tier,
    TransferCompletion,
    TransferFailure,
    TransferKind,
)


@attrs.frozen
class Situation:
    """A named situation: what it is, the checks whose CI profile must reach it, and in how many cases."""

    name: str
    about: str
    checks: frozenset[str]
    floor: int = 1  # cases (test cases of one check's run) that reach it at least


def _checks(*names: str) -> frozenset[str]:
    return frozenset(names)


#: Every named situation, in the order the tables print them. Floors are cases per check in
#: the CI profile (60 cases of up to 50 steps); a floor above 1 asks for a situation that is
#: reached repeatedly, not once by luck.
#:
#: Issue 14's "multi-page restore waiting on a backup under delay" and "restore waiting on
#: another extent's backup" are gone (issue 17): a Demote while a page's backup is in flight
#: keeps its device copy (DROPPING) until the backup lands, so a restore moves only pages whose
#: host copy is valid and never waits for a backup (`waits_for` is always empty); no sequence
#: of calls reaches either.
SITUATIONS: tuple[Situation, ...] = (
    # issue 14's list: where runtimes broken independently of the suite survived
    Situation("restart with a transfer in flight", "restart while the model has a transfer in flight", _checks("restart"), 3),
    Situation("restart with a completion unreported", "restart while a completed transfer is not yet reported", _checks("restart"), 3),
    Situation("OutOfPages from a plan with a Restore", "prepare_batch of a plan carrying a Restore raises OutOfPages", _checks("tiers"), 2),
    Situation("half the host pages in use", "at least half the host (L2) pages are taken after a call", _checks("tiers"), 3),
    Situation("split of an extent of 3+ pages", "a split that succeeds on an extent of at least 3 pages", _checks("core", "tiers"), 3),
    # Asked of tiers and faults (was ordering, floor 2): with a fixed seed per check (runner.check_seed)
    # the ordering check's draws reach it in no case, tiers in 15, faults in 7 (CI profile, 2026-12-02).
    # Under delay it needs a guided rule, which ordering does not have.
    Situation(
        "Drop while a Restore from that copy is pending", "a Drop of an extent whose host copy an in-flight restore reads", _checks("tiers", "faults"), 2
    ),
    Situation("handle 2+ generations stale", "a request handle whose slot moved on by at least 2 generations", _checks("core"), 3),
    Situation("rearranged page runs of a real extent", "a live extent's ref with its runs in another order", _checks("core"), 1),
    Situation("repeated page runs of a real extent", "a live extent's ref with its runs repeated", _checks("core"), 3),
    # what the survivors of the mutant families need (families.SURVIVORS, before this file)
    Situation("close of a request in an older prepared batch", "RequestBusy where the newest prepared batch does not hold the request", _checks("core"), 2),
    Situation("duplicate request and a bad intent handle", "one plan with a request twice and an intent's handle stale or unknown", _checks("core"), 2),
    Situation("attach of a host-only page without Restore", "NotResident: an attached page has a host copy but no device copy", _checks("tiers"), 2),
    Situation("RowFull from a plan of plain items", "a plan without attach or append whose row would pass max_request_tokens", _checks("core"), 2),
    Situation(
        "Backup of a partly backed-up extent, host short of its pages",
        "a Backup of an extent with some host copies when fewer host pages are free than it has pages",
        _checks("tiers"),
        1,
    ),
    Situation(
        "OutOfPages from plain items and a Restore", "prepare_batch of items without attach or append and a Restore raises OutOfPages", _checks("tiers"), 1
    ),
    Situation("Demote of an extent a prepared batch attached", "ExtentInUse: a Demote of pages mapped by a row not yet computed", _checks("tiers"), 2),
    Situation("publish of a partly written last page", "InvalidPageRun: a publish range reaching the row's partly written page", _checks("core"), 2),
    Situation("publish of reserved, not computed pages", "InvalidPageRun: a publish of full pages only a prepared batch reserved", _checks("core"), 2),
    Situation("foreign handle after a genuine one in a plan", "ForeignRuntime from a later item of a plan whose first item is genuine", _checks("core"), 2),
    Situation(
        "submit with a failing move before a bad handle", "a submit whose handle error comes after an intent that fails its own check", _checks("tiers"), 2
    ),
    Situation(
        "restore from host pages out of order",
        "a restore whose host copies are not in ascending physical order (the model's placement: FIFO free lists, as most runtimes)",
        _checks("tiers"),
        1,
    ),
    Situation("append after a cancelled batch", "RequestBusy: append_previous_output when only a cancelled batch produced", _checks("core"), 2),
    Situation("cancel back to a partly written page", "cancel_batch returns a row to a length inside a page", _checks("core"), 2),
    Situation("empty item in a plan of plain items", "InvalidPlan: an item with no input ids and no append beside plain items", _checks("core"), 2),
    # what the survivors of the CI profile after issue 17 need (their entries were in SURVIVORS)
    Situation(
        "page name ends while a restore reads its host copy",
        "a call ends a page name (its last holder gone) whose host copy an in-flight restore still reads",
        _checks("tiers"),
        2,
    ),
    Situation(
        "compute over two restores in flight",
        "execute_batch of a batch whose rows map pages of two or more in-flight restores",
        _checks("tiers", "ordering"),
        2,
    ),
    Situation(
        "Close intent on a request a later batch holds",
        "RequestBusy at execute_batch: its Close intent's request is in another prepared batch",
        _checks("core"),
        2,
    ),
    Situation("publish of a negative first page", "InvalidPageRun: a publish range that begins before the row's first page", _checks("core"), 2),
    # what the situation mutants' last survivors need (situations.SITUATION_SURVIVORS, before 2026-12-02)
    Situation("request handle a generation ahead of its slot", "a request handle whose generation is above its slot's", _checks("core"), 2),
    Situation(
        "a real extent's pages cut into other runs",
        "a live extent's ref naming its pages in order, in runs that are not the coalesced ones",
        _checks("core"),
        2,
    ),
    Situation("a real extent's whole runs in another order", "a live extent's ref with its issued runs, two or more, reordered", _checks("core"), 2),
    Situation(
        "Demote of an extent whose first page alone is on the host",
        "NotBackedUp from a Demote of an extent whose first page has a host copy and a later page none",
        _checks("tiers"),
        2,
    ),
    Situation(
        "Drop of an extent whose first page alone is on the device",
        "WouldLoseData from a Drop of an extent whose first page has a device copy and a later page none",
        _checks("tiers"),
        2,
    ),
    Situation(
        "OutOfPages(L2) from a plan's Backup", "execute_batch raises OutOfPages on the host tier: a Backup intent short of host pages", _checks("tiers"), 1
    ),
    Situation(
        "retain of an old epoch's ref reissued",
        "retain of a ref of an earlier epoch whose generation and runs the current epoch issued again",
        _checks("restart"),
        2,
    ),
)

#: Per operation, the error classes the suite claims to drive it into in a check's CI profile
#: (spec/protocol.md §3-§4 lists which each operation can raise). Judged by the model's
#: outcome; each is the situation "<operation> raises <error>".
ERRORS: dict[str, tuple[str, ...]] = {
    "open_request": ("OutOfSlots",),
    "close_request": ("ForeignRuntime", "StaleHandle", "UnknownHandle", "RequestBusy"),
    "prepare_batch": (
        "ForeignRuntime",
        "StaleHandle",
        "UnknownHandle",
        "InvalidPlan",
        "RequestBusy",
        "NotResident",
        "RowFull",
        "OutOfPages",
    ),
    "execute_batch": ("ForeignRuntime", "UnknownHandle", "AlreadyExecuted", "NotPrepared", "OutOfOrder", "StaleHandle"),  # stale: restart
    "cancel_batch": ("UnknownHandle", "AlreadyExecuted", "NotPrepared", "BatchDependency"),
    "publish": ("StaleHandle", "InvalidPageRun"),
    "split": ("StaleHandle", "UnknownHandle", "ExtentShared", "InvalidPageRun"),
    "retain": ("StaleHandle", "UnknownHandle"),
    "release": ("ForeignRuntime", "StaleHandle", "UnknownHandle"),
    "submit": ("StaleHandle", "UnknownHandle", "NotBackedUp", "ExtentInUse", "WouldLoseData"),
}
#: submit's OutOfPages is left out: in the CI profile it is reached or not depending on when
#: transfers complete (0 to 2 cases of tiers measured across runs on one machine, 2026-12-02),
#: and a floor that depends on timing is a flaky verdict. A timing-free reach needs the
#: deterministic stream backend (issue 15, item 2).

#: prepare_batch's NotBackedUp is left out: it needs a page with neither a device nor a host copy,
#: which Demote (NotBackedUp) and Drop (WouldLoseData) never let an extent's page become.
#: The checks whose CI profile must reach each error situation: the tier errors in the tier checks.
_TIER_ERRORS = {("prepare_batch", "NotResident")}
_RESTART_ERRORS = {("execute_batch", "StaleHandle")}  # a batch handle older than the epoch: only a restart makes one

SITUATIONS = SITUATIONS + tuple(
    Situation(
        f"{operation} raises {error}",
        f"the model's outcome of {operation} is {error}",
        _checks("tiers")
        if operation == "submit" or (operation, error) in _TIER_ERRORS
        else _checks("restart")
        if (operation, error) in _RESTART_ERRORS
        else _checks("core"),
    )
    for operation, errors in ERRORS.items()
    for error in errors
)

#: The L3 tier's situations (spec/protocol.md §9): every storage check must reach these, whatever
#: its host mode and backend. How a persist reads its pages is the host mode's, so each mode's own
#: situation is in `MODE_SITUATIONS`, to which tests/conformance/test_storage_check.py holds each
#: configuration.
SITUATIONS = SITUATIONS + (
    Situation("persist lands", "a persist's completion reported without failure: the objects are written", _checks("storage"), 3),
    Situation("fetch lands", "a fetch's completion reported without failure: the row's pages hold the objects", _checks("storage"), 3),
    Situation("fetch miss", "a fetch's completion reported MISS: an object was removed after its persist", _checks("storage"), 2),
    Situation("store failure on persist", "a persist's completion reported STORE: its store write failed, nothing lost", _checks("storage"), 2),
    Situation("store failure on fetch", "a fetch's completion reported STORE: its store read failed, its batch fails, nothing lost", _checks("storage"), 2),
    Situation("persist in a plan", "a batch's plan carries a Persist and executes", _checks("storage"), 2),
    Situation(
        "L3 transfer in flight while another batch runs",
        "execute_batch succeeds while a persist or a fetch it does not read is in flight",
        _checks("storage"),
        3,
    ),
    Situation("l3_exists of a key never written", "l3_exists answers for a key no persist wrote (False)", _checks("storage"), 3),
)

#: The situation each host mode's storage check must reach, besides the check's own (floor: cases):
#: a persist that starts reading device copies through staging host pages (buffer_only), or
#: reading host copies (resident). Counted like the others, but not in `SITUATIONS`, whose floors
#: hold for every runtime a check runs on.
MODE_SITUATIONS: dict[str, tuple[str, int]] = {
    "buffer_only": ("buffer_only persist through staging", 3),
    "resident": ("resident persist from host copies", 3),
}

#: Device pages whose names end under an L3 transfer in flight (`end_under_l3`), their frees deferred
#: until it lands (the runtime once left them deferred forever: `storage.device_frees_skipped_on_landing`).
#: A buffer_only persist reads the device copies (a resident one the host copies), so the first is
#: buffer_only's; a fetch writes the device pages in both modes. Not in `SITUATIONS`: whether the
#: transfer is still in flight when the names end is the schedule's draw, and a runtime's own.
#: (floor: cases, in the CI profile of tests/conformance/test_storage_check.py)
ENDED_UNDER_L3: dict[str, tuple[tuple[str, int], ...]] = {
    "buffer_only": (
        ("page name ends while a buffer_only persist reads its device copy", 5),
        ("page name ends while a landing fetch writes its device copy", 5),
    ),
    "resident": (("page name ends while a landing fetch writes its device copy", 5),),
}

#: A persist's store write held in flight (thread streams only) while other steps ran and took
#: staging: reached by `_hold_store_writes`, held to its floor by tests/conformance/test_storage_check.py.
HELD_WRITE = "persist held in flight while other steps take staging"

BY_NAME: dict[str, Situation] = {s.name: s for s in SITUATIONS}


@attrs.define
class Tally:
    """What one check's run reached: per situation, the cases and the calls."""

    cases: Counter[str] = attrs.field(factory=Counter)
    calls: Counter[str] = attrs.field(factory=Counter)

    def shortfalls(self, check: str) -> list[str]:
        """The situations `check` must reach whose case count is below their floor, each with its count."""
        return [f"{s.name}: {self.cases[s.name]} case(s), floor {s.floor}" for s in SITUATIONS if check in s.checks and self.cases[s.name] < s.floor]


_active: list[dict[str, Tally]] = []


@contextlib.contextmanager
def recording() -> Iterator[dict[str, Tally]]:
    """Count what the machine reaches while the block runs: one `Tally` per check that ran, by name."""
    reach: dict[str, Tally] = {}
    _active.append(reach)
    try:
        yield reach
    finally:
        _active.remove(reach)


def observe(check: str, case: set[str], names: list[str]) -> None:
    """Count the situations `names` one call of `check` reached; `case` holds those its case reached before."""
    for name in names:
        if currently_in_test_context():
            event(f"situation: {name}")
        for reach in _active:
            tally = reach.setdefault(check, Tally())
            tally.calls[name] += 1
            if name not in case:
                tally.cases[name] += 1
        case.add(name)


# -- judging a call from the model's side ----------------------------------------------------


def _handles(value: object) -> Iterator[object]:
    """Every handle a call's arguments carry: plans' items and intents, intent tuples, refs."""
    if isinstance(value, BatchPlan):
        for item in value.items:
            yield item.request
            yield from item.attach
        for intent in value.intents:
            yield from _handles(intent)
    elif isinstance(value, tuple):
        for part in value:
            yield from _handles(part)
    elif isinstance(value, Publish | Close):
        yield value.request
    elif hasattr(value, "extent") and isinstance(value.extent, CacheExtentRef):
        yield value.extent  # type: ignore[attr-defined]
    elif isinstance(value, RequestRuntimeHandle | CacheExtentRef):
        yield value


def _intents(operation: str, args: tuple) -> tuple:
    if operation == "submit":
        return tuple(args[0])
    if operation == "prepare_batch" and isinstance(args[0], BatchPlan):
        return args[0].intents
    return ()


#: The error of a move whose extent has a page without the copy the move keeps.
_MOVE_ERRORS = {Demote: "NotBackedUp", Drop: "WouldLoseData"}


def _restoring_reads(state: State) -> set[int]:
    """Page names whose host copy an in-flight restore reads."""
    return {name for t in state.transfers.values() if t.kind is TransferKind.RESTORE for name, _, _ in t.pages}


def situations(operation: str, args: tuple, before: State, error: CacheRuntimeError | None, after: State) -> list[str]:
    """The named situations one call reaches: `args` as the model got them, its state before and after, its error."""
    found: list[str] = []
    add = found.append
    raised = type(error).__name__ if error is not None else None
    if raised:
        add(f"{operation} raises {raised}")
    intents = _intents(operation, args)
    plan = args[0] if operation == "prepare_batch" and args and isinstance(args[0], BatchPlan) else None
    # restarts
    if operation == "restart" and error is None:
        if before.transfers:
            add("restart with a transfer in flight")
        if before.unreported:
            add("restart with a completion unreported")
    # pages in use
    l2 = after.pools.get(Tier.L2)
    if l2 is not None and l2.total and (l2.total - len(l2.free)) * 2 >= l2.total:
        add("half the host pages in use")
    # handles
    for handle in _handles(args):
        if isinstance(handle, RequestRuntimeHandle) and handle.epoch == before.epoch and 0 <= handle.slot_id < len(before.slots):
            if before.slots[handle.slot_id].generation >= handle.generation + 2:
                add("handle 2+ generations stale")
        if isinstance(handle, RequestRuntimeHandle) and handle.epoch == before.epoch and 0 <= handle.slot_id < len(before.slots):
            if handle.generation > before.slots[handle.slot_id].generation:
                add("request handle a generation ahead of its slot")
        if isinstance(handle, CacheExtentRef) and handle.epoch == before.epoch and handle.generation in before.extents:
            issued, names = before.extents[handle.generation].pages, pageruns.expand(handle.page_runs)
            if names != issued and set(names) == set(issued):  # judged on the names: renaming may coalesce runs anew
                if len(names) > len(set(names)):
                    add("repeated page runs of a real extent")
                else:
                    add("rearranged page runs of a real extent")
            runs = pageruns.coalesce(issued)
            if len(runs) > 1 and tuple(handle.page_runs) != runs and sorted(map(_run_key, handle.page_runs)) == sorted(map(_run_key, runs)):
                add("a real extent's whole runs in another order")
            if names == (*issued, UNCOALESCED):  # the renaming's mark of runs that are not the coalesced runs of their names
                add("a real extent's pages cut into other runs")
        if isinstance(handle, CacheExtentRef) and operation == "retain" and handle.epoch < before.epoch and handle.generation in before.extents:
            if pageruns.coalesce(before.extents[handle.generation].pages) == tuple(handle.page_runs):
                add("retain of an old epoch's ref reissued")
    # split
    if operation == "split" and error is None and args[0].generation in before.extents and len(before.extents[args[0].generation].pages) >= 3:
        add("split of an extent of 3+ pages")
    # plans
    if plan is not None:
        if any(isinstance(i, Restore) for i in plan.intents) and isinstance(error, OutOfPages):
            add("OutOfPages from a plan with a Restore")
            if all(not item.attach and not item.append_previous_output for item in plan.items):
                add("OutOfPages from plain items and a Restore")
        requests = [item.request for item in plan.items]
        if raised in ("StaleHandle", "UnknownHandle") and len(set(requests)) < len(requests):
            add("duplicate request and a bad intent handle")
        plain = all(not item.attach and not item.append_previous_output for item in plan.items)
        if raised == "RowFull" and plain:
            add("RowFull from a plan of plain items")
        if raised == "InvalidPlan" and plain and plan.items and any(not item.input_ids for item in plan.items) and any(item.input_ids for item in plan.items):
            add("empty item in a plan of plain items")
        if raised == "ForeignRuntime" and len(plan.items) > 1 and plan.items[0].request.runtime_id != plan.items[-1].request.runtime_id:
            add("foreign handle after a genuine one in a plan")
        if raised == "NotResident":
            attached = {p for item in plan.items for ref in item.attach if ref.generation in before.extents for p in before.extents[ref.generation].pages}
            if any(Tier.L2 in before.pages[p].copies and Tier.L1 not in before.pages[p].copies for p in attached if p in before.pages):
                add("attach of a host-only page without Restore")
        if raised == "RequestBusy" and any(item.append_previous_output for item in plan.items):
            for item in plan.items:
                slot = before.slots[item.request.slot_id] if 0 <= item.request.slot_id < len(before.slots) else None
                if (
                    item.append_previous_output
                    and slot is not None
                    and slot.live
                    and slot.produced <= slot.appended
                    and _cancelled_with(before, item.request.slot_id)
                ):
                    add("append after a cancelled batch")
                    break
    if operation == "execute_batch" and args and getattr(args[0], "batch_id", None) in before.batches and before.epoch == args[0].epoch:
        batch = before.batches[args[0].batch_id]
        if raised == "RequestBusy":
            held = {s for other_id, other in before.batches.items() if other_id != args[0].batch_id for s in other.slot_set}
            if any(isinstance(i, Close) and i.request.slot_id in held for i in batch.plan.intents):
                add("Close intent on a request a later batch holds")
        if error is None:
            mapped = {p for slot_id in batch.slot_set for p in before.slots[slot_id].pages}
            restoring = [t for t in before.transfers.values() if t.kind is TransferKind.RESTORE and mapped & {name for name, _, _ in t.pages}]
            if len(restoring) >= 2:
                add("compute over two restores in flight")
    # close of a request held by an older prepared batch only
    closing = [args[0]] if operation == "close_request" else [i.request for i in intents if isinstance(i, Close)]
    if raised == "RequestBusy" and closing and before.batches:
        newest = before.batches[max(before.batches)]
        if any(0 <= c.slot_id < len(before.slots) and c.slot_id not in newest.slot_set for c in closing):
            add("close of a request in an older prepared batch")
    # publish
    publishing = (
        [(args[0], args[1], args[2])] if operation == "publish" else [(i.request, i.first_page, i.page_count) for i in intents if isinstance(i, Publish)]
    )
    if raised == "InvalidPageRun":
        for request, first, count in publishing:
            if not (0 <= request.slot_id < len(before.slots)):
                continue
            slot, ps = before.slots[request.slot_id], _page_size(before)
            end = first + count
            if first >= 0 and count >= 1 and slot.num_tokens % ps and end == slot.num_tokens // ps + 1:
                add("publish of a partly written last page")
            if first >= 0 and count >= 1 and slot.num_tokens // ps < end <= slot.reserved_tokens // ps:
                add("publish of reserved, not computed pages")
            if first < 0 and count >= 1:
                add("publish of a negative first page")
    # tier moves
    host_free = len(before.pools[Tier.L2].free) if Tier.L2 in before.pools else 0
    for intent in intents:
        if isinstance(intent, Backup) and intent.extent.generation in before.extents:
            pages = before.extents[intent.extent.generation].pages
            on_host = sum(Tier.L2 in before.pages[p].copies for p in pages)
            if 0 < on_host < len(pages) and host_free < len(pages):
                add("Backup of a partly backed-up extent, host short of its pages")
                break
    if operation == "submit":
        if raised in ("StaleHandle", "UnknownHandle", "ForeignRuntime") and len(intents) > 1:
            first_bad = next((n for n, i in enumerate(intents) if i.extent.generation not in before.extents or i.extent.epoch != before.epoch), 0)
            if first_bad > 0 and any(_fails_alone(before, i) for i in intents[:first_bad]):
                add("submit with a failing move before a bad handle")
    if raised == "ExtentInUse":
        for intent in intents:
            if isinstance(intent, Demote) and intent.extent.generation in before.extents:
                pages = set(before.extents[intent.extent.generation].pages)
                attached = {p for b in before.batches.values() for item in b.plan.items for ref in item.attach for p in _pages_of(before, ref)}
                if pages & attached:
                    add("Demote of an extent a prepared batch attached")
                    break
    for intent in intents:  # the error a test of the first page alone misses (an earlier intent of the call may have moved the pages)
        if isinstance(intent, Demote | Drop) and intent.extent.generation in before.extents and raised == _MOVE_ERRORS[type(intent)]:
            tier = Tier.L2 if isinstance(intent, Demote) else Tier.L1
            first, *later = (tier in before.pages[p].copies for p in before.extents[intent.extent.generation].pages)
            if first and not all(later):
                add(f"{type(intent).__name__} of an extent whose first page alone is on the {'host' if tier is Tier.L2 else 'device'}")
    if operation == "execute_batch" and isinstance(error, OutOfPages) and error.tier is Tier.L2:
        add("OutOfPages(L2) from a plan's Backup")
    reading = _restoring_reads(before)
    for intent in intents:
        if isinstance(intent, Drop) and intent.extent.generation in before.extents and reading & set(before.extents[intent.extent.generation].pages):
            add("Drop while a Restore from that copy is pending")
            break
    ended = {name for name in reading if name in before.pages and name not in after.pages}
    if ended and any(name in ended for t in after.transfers.values() if t.kind is TransferKind.RESTORE for name, _, _ in t.pages):
        add("page name ends while a restore reads its host copy")
    # transfers the call started
    for transfer_id, transfer in after.transfers.items():
        if transfer_id in before.transfers or transfer.kind is not TransferKind.RESTORE:
            continue
        sources = [source for _, source, _ in transfer.pages]
        if sources != sorted(sources):
            add("restore from host pages out of order")
    # L3
    for transfer_id, transfer in after.transfers.items():
        if transfer_id not in before.transfers and transfer.kind is TransferKind.PERSIST:
            add("buffer_only persist through staging" if any(staging >= 0 for _, _, staging in transfer.pages) else "resident persist from host copies")
    if operation == "execute_batch" and error is None:
        batch = before.batches.get(args[0].batch_id) if args and isinstance(args[0], PreparedBatchHandle) else None
        if batch is not None and any(isinstance(intent, Persist) for intent in batch.plan.intents):
            add("persist in a plan")
        read = {name for slot in (batch.slot_set if batch else ()) for name in before.slots[slot].pages}
        if any(t.kind in (TransferKind.PERSIST, TransferKind.FETCH) and not read & {name for name, _, _ in t.pages} for t in before.transfers.values()):
            add("L3 transfer in flight while another batch runs")
    # page names the call ended under an L3 transfer that uses their device pages (their frees wait for it);
    # a fetch only if it is not doomed to fail (a failed fetch frees them on another path)
    gone = {name for name in before.pages if name not in after.pages}
    for transfer_id, transfer in after.transfers.items() if gone else ():
        if transfer.kind is TransferKind.PERSIST and any(name in gone and staging >= 0 for name, _, staging in transfer.pages):
            add("page name ends while a buffer_only persist reads its device copy")
        if transfer.kind is TransferKind.FETCH and transfer_id not in after.doomed and any(name in gone for name, _, _ in transfer.pages):
            add("page name ends while a landing fetch writes its device copy")
    if operation == "l3_exists" and error is None and args and any(key not in after.objects and key not in after.keys.values() for key in args[0]):
        add("l3_exists of a key never written")
    # cancel back inside a page
    if operation == "cancel_batch" and error is None:
        ps = _page_size(before)
        cancelled = [b for b in before.batches if b not in after.batches]
        for batch_id in cancelled:
            if any(start % ps for start in before.batches[batch_id].start_tokens):
                add("cancel back to a partly written page")
    return list(dict.fromkeys(found))


def _run_key(run: PageRun) -> tuple[int, int]:
    return run.first_page, run.page_count


def _pages_of(state: State, ref: CacheExtentRef) -> tuple[int, ...]:
    return state.extents[ref.generation].pages if ref.generation in state.extents else ()


def _page_size(state: State) -> int:
    return len(state.pools[Tier.L1].tags[0]) if state.pools[Tier.L1].tags else 1


def _cancelled_with(state: State, slot_id: int) -> bool:
    """Whether a cancelled batch held slot `slot_id` (its output was given back)."""
    from cacheruntime.protocol import BatchState

    return any(outcome is BatchState.CANCELLED and slot_id in slots for outcome, slots in state.finished.values())


def _fails_alone(state: State, intent: object) -> bool:
    """Whether a tier intent with a live extent fails its own precondition in `state` (no host or device copy)."""
    extent = getattr(intent, "extent", None)
    if extent is None or extent.generation not in state.extents:
        return False
    copies = [state.pages[p].copies for p in state.extents[extent.generation].pages]
    if isinstance(intent, Demote | Restore):
        return any(Tier.L2 not in c for c in copies)
    if isinstance(intent, Drop):
        return any(Tier.L1 not in c for c in copies)
    return False


def table(tallies: dict[str, Tally]) -> list[str]:
    """Lines of the coverage table: per situation, cases (calls) per check; `-` where a check need not reach it."""
    checks = list(tallies)
    width = max(len(s.name) for s in SITUATIONS)
    lines = [f"{'situation':{width}}  " + "  ".join(f"{c:>14}" for c in checks)]
    for s in SITUATIONS:
        cells = []
        for check in checks:
            count = f"{tallies[check].cases[s.name]} ({tallies[check].calls[s.name]})"
            mark = "" if check not in s.checks else ("!" if tallies[check].cases[s.name] < s.floor else " ")
            cells.append(f"{count + mark:>14}")
        lines.append(f"{s.name:{width}}  " + "  ".join(cells))
    lines.append("cases (calls) per check; ! marks a count below the floor of a check that must reach it")
    return lines


def completions_reached(reported: tuple[TransferCompletion, ...]) -> list[str]:
    """The named situations the completions a poll or wait reported reach (the model's, renamed)."""
    found = []
    for completion in reported:
        kind, failure = completion.ticket.kind, completion.failure
        if kind is TransferKind.PERSIST:
            found.append("persist lands" if failure is None else "store failure on persist" if failure is TransferFailure.STORE else "")
        elif kind is TransferKind.FETCH:
            found.append(
                "fetch lands"
                if failure is None
                else "fetch miss"
                if failure is TransferFailure.MISS
                else "store failure on fetch"
                if failure is TransferFailure.STORE
                else ""
            )
    return [name for name in dict.fromkeys(found) if name]
