"""The decode fast path: what makes a step of one token per request cost little per item.

Control keeps one immutable plan for a running decode set and prepares it step after
step, so three things are cached or short-cut here, each equal to the general route of
`batches` (a test prepares and executes random plans both ways and compares):

- `item_handles`: the validated handles of the last immutable plan, reused while no
  slot opened or closed and the epoch did not change (the checks would give the same
  answer);
- `decode_route`: for items that only compute their inputs, the pages a step needs are
  the pages the new reservations cover less those held: for one token each, one page per
  row whose reservation fills whole pages; no per-item check can fail;
- `apply_decode` and `write_decode_tags`: one token per row, no journal.

A ledger class with `fast_path = False` takes the general route everywhere (the test's reference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from cacheruntime.protocol import BatchItem, Intent, InvalidPlan, RequestRuntimeHandle, Tier
from cacheruntime.runtime.ledger.records import Slot

if TYPE_CHECKING:
    from cacheruntime.runtime.ledger.batches import CheckedPlan
    from cacheruntime.runtime.ledger.ledger import LedgerBase

    _Base = LedgerBase
else:
    _Base = object

#: At most this many slot sets keep an interned tuple: a server whose decode sets keep
#: changing would otherwise grow the table without end.
INTERNED_SLOT_SETS = 1024


class Mapping(NamedTuple):
    """ReqToToken writes: row page `pages[i]` of slot `slots[i]` maps physical page `phys[i]`."""

    slots: list[int]
    pages: list[int]
    phys: list[int]


class ItemHandles(NamedTuple):
    """A plan's items with their handles checked: what `check_plan` needs of them."""

    items: tuple[BatchItem, ...]
    slot_changes: int  # the ledger's `slot_changes` when they were checked
    epoch_state: object  # the State they were checked against (a restart makes a new one)
    slots: list[int]
    rows: list[Slot]
    slot_set: frozenset[int]
    lengths: list[int]
    requests: list[RequestRuntimeHandle]
    single_inputs: bool  # every item has exactly one input id
    special: bool  # some item attaches or appends


class Decode(_Base):
    """The cached and short-cut parts of a decode step."""

    def item_handles(self, items: tuple[BatchItem, ...], intents: tuple[Intent, ...]) -> ItemHandles:
        """Check every item's handles, then the intents', then duplicates (the model's order), or reuse the last check."""
        known = self.validated
        if known is not None and known.items is items and known.epoch_state is self.state and known.slot_changes == self.slot_changes:
            for intent in intents:
                self.check_intent_handles(intent)
            return known
        slots, rows, special = self.check_item_handles(items)
        for intent in intents:
            self.check_intent_handles(intent)
        slot_set = frozenset(slots)
        if len(slot_set) != len(slots):
            raise InvalidPlan("a request appears twice in the plan")
        lengths = [len(item.input_ids) for item in items]
        handles = ItemHandles(
            items,
            self.slot_changes,
            self.state,
            slots,
            rows,
            slot_set,
            lengths,
            [item.request for item in items],
            lengths.count(1) == len(lengths),
            special,
        )
        if self.fast_path and not special and type(items) is tuple and all(type(item.input_ids) is tuple for item in items):
            self.validated = handles  # only an immutable plan: a list of items (or of ids) could change in place
        return handles

    def decode_route(
        self, handles: ItemHandles, start_tokens: list[int], ends: list[int], restoring: int
    ) -> tuple[list[int], bool, list[int] | None, int, int] | None:
        """(starts, one token each, offsets, rows opening a page, L1 pages needed) for items that only compute their inputs.

        None when the plan needs the general route: an item attaches or appends, computes
        nothing, or overflows its row (the general route raises the error).
        """
        if not self.fast_path or handles.special or max(ends) > self.max_request_tokens:
            return None
        ps = self.page_size
        if handles.single_inputs:
            offsets = [start % ps for start in start_tokens]
            opened = offsets.count(0)
            return start_tokens, True, offsets, opened, restoring + opened
        if min(handles.lengths) < 1:
            return None
        need = restoring + _pages_covering(ends, ps) - _pages_covering(start_tokens, ps)
        return start_tokens, False, None, 0, need

    def apply_decode(self, checked: CheckedPlan) -> Mapping:
        """Every reservation grows by one token; only rows whose new token opens a page (offset 0) get one, in plan order."""
        rows, ends, offsets = checked.rows, checked.ends, checked.offsets
        assert offsets is not None
        for slot, end in zip(rows, ends):
            slot.reserved_tokens = end
            slot.produced += 1
        mapping = Mapping([], [], [])
        if checked.opened:
            names, mapping_phys = self.new_pages(checked.opened)
            position = -1
            for name in names:
                position = offsets.index(0, position + 1)  # the next row opening a page, found in C
                row = rows[position].pages
                mapping.slots.append(checked.slots[position])
                mapping.pages.append(len(row))
                row.append(name)
            mapping.phys.extend(mapping_phys)
        return mapping

    def write_decode_tags(self, rows: list[Slot], starts: list[int], ends: list[int]) -> range:
        """One token per row: its tag in its page and device copy, the row's length; nothing journaled."""
        st, ps = self.state, self.page_size
        pages, tags, l1 = st.pages, st.pools[Tier.L1].tags, Tier.L1
        version = st.next_version
        first_tags = range(version, version + len(rows))
        for slot, start, end, tag in zip(rows, starts, ends, first_tags):
            page = pages[slot.pages[start // ps]]
            offset = start % ps
            page.versions[offset] = tag
            tags[page.copies[l1].phys * ps + offset] = tag
            slot.num_tokens = end
        st.next_version = first_tags.stop
        return first_tags

    def sorted_slots(self, slot_set: frozenset[int]) -> tuple[int, ...]:
        """`tuple(sorted(slot_set))`, interned by slot set: a reused plan's batches share one, sorted once."""
        interned = self.interned_slots
        slots = interned.get(slot_set)
        if slots is None:
            if len(interned) >= INTERNED_SLOT_SETS:
                interned.clear()  # only the sharing of older tuples is lost
            slots = interned[slot_set] = tuple(sorted(slot_set))
        return slots


def _pages_covering(tokens: list[int], page_size: int) -> int:
    """Sum over `tokens` of the pages each length covers, ceil(t / page_size)."""
    return sum(-(-t // page_size) for t in tokens)
