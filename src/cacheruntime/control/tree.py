"""TreeCore: the prefix tree of control, holding opaque extent refs instead of KV indices.

A radix tree over token ids whose nodes are whole pages: a node's key is the tokens of its
pages and it holds one `CacheExtentRef` for exactly those pages. Per node it keeps LRU
time, `lock_ref` and where control believes the pages live (L1, L2). It never sees a
tensor, an index, a stream or an event (B2): what it wants from the runtime it states as
intents (`Backup`, `Demote`, `Release`, `Restore`) that the scheduler carries inside batch
plans; the only direct call it makes is `split`, because a split returns the two new refs.

Lock, evictability and victim decisions are made by `cacheruntime.control.policy` on the
tree's array form with `ops.CONCRETE`, so the Z3 proofs (E1-E4) are about this code path.

Intent lifecycle, which is what keeps the tree and the runtime in step:
- *queued*: in the outbox, not yet handed to a plan. A queued `Demote`/`Release` of an
  L1 eviction is cancellable: a request that reaches the node first wins and the intent
  is withdrawn (scenario 9, lock during eviction, answered before anything crosses).
- *in flight*: taken into a plan, not yet applied. The node's extent must not be split
  (that would make the plan's ref stale) and a node whose device copy is being demoted is
  not matched (a restore would race the demote into `ExtentInUse`).
- *applied*: the batch carrying it executed; the scheduler reports it back. A backup stays
  in flight until its transfer completion arrives: until then its node is neither split
  nor released from L2, because the host pages of a released extent whose D2H still runs
  are freed only when it completes (O3), and the tree counts host pages exactly: a
  `Backup` inside a plan must never find L2 full at execute. A `Restore` stays in flight
  the same way, so that its completion finds its node unsplit.
- *returned*: the batch carrying it failed or was never prepared; it goes back to the
  outbox as it was when queued (`return_intents`) and rides in a later plan.

Failure (spec/protocol.md §5.3). A transfer may fail; its completion says so. A failed
`Restore` leaves the node host-only (its host copy is intact): the next match restores it
again. A failed `Backup` leaves the node without a host copy; if it was demoted with it
(write-back sends `Backup` and `Demote` together) the runtime kept the device copy, so the
node is on L1 again. Either can leave a node on L1 below a host-only one (a restore that
failed under descendants restored with it; a backup that failed under a parent demoted
since): L1 is then not prefix-closed, and eviction runs on the policy's
`resident_closure`, which Z3 proves takes resident nodes only, leaves first. A node is not
evicted while a backup or restore of it is in flight:
a `Demote` sent after its backup was handed out could meet that backup failed at execute
(`NotBackedUp`), and a failed restore's node must still be the node the ticket names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

import attrs

from cacheruntime.control import policy
from cacheruntime.ops import CONCRETE
from cacheruntime.protocol import (
    Backup,
    CacheExtentRef,
    Demote,
    Intent,
    Release,
    Restore,
    RuntimeInterface,
    TransferCompletion,
    TransferKind,
)

#: The intents the tree states (it asks for restores through `acquire`, never the outbox).
TreeIntent = Backup | Demote | Release


class WritePolicy(enum.Enum):
    """When a tree node gets its host (L2) copy."""

    WRITE_THROUGH = "write_through"  # back up right after insert; eviction is a plain Demote
    WRITE_BACK = "write_back"  # back up only when evicting: Backup then Demote


class Node:
    """One tree node: a run of whole pages, its extent ref and its control-side state."""

    __slots__ = ("key", "extent", "parent", "children", "lock_ref", "last_access", "l1", "l2", "in_flight", "demoting", "queued")

    def __init__(self, key: tuple[int, ...], extent: CacheExtentRef | None, parent: Node | None):
        self.key = key
        self.extent = extent
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.l1 = True  # a device copy exists or a Restore for it was handed out
        self.l2 = False  # a host copy exists or a Backup for it was queued
        self.in_flight = 0  # pins, intents handed out and not applied, backups not completed: no split
        self.demoting = False  # a Demote was handed out and has not applied: no match
        self.queued: Demote | Release | None = None  # a cancellable Demote/Release waiting in the outbox

    @property
    def pages(self) -> int:
        """Pages of this node (0 for the root)."""
        return 0 if self.extent is None else self.extent.page_count

    @property
    def ref(self) -> CacheExtentRef:
        """The extent ref of a node below the root (only the root has none)."""
        assert self.extent is not None, "the root holds no extent"
        return self.extent

    def path(self) -> list[Node]:
        """The nodes from the root's child down to this node (empty for the root)."""
        out = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


@attrs.frozen
class Match:
    """The longest usable cached prefix of a token sequence, in whole pages."""

    node: Node  # deepest matched node (the root on a miss)
    pages: int  # matched pages
    l1_pages: int  # of them, pages with a device copy (L1 hits)
    l2_pages: int  # of them, pages only on the host (L2 hits: they need a Restore)


@attrs.frozen
class Inserted:
    """Where an insert left a request's pages: the node to lock, and the pages it adopted."""

    node: Node  # deepest node covering the row's pages (the root if none does)
    adopted_pages: int  # pages of the inserted extent that became a tree node (not released)


@attrs.frozen
class Acquired:
    """A match made usable by one request: locked, pinned, and its refs and restores."""

    node: Node
    attach: tuple[CacheExtentRef, ...]  # in row order, for `BatchItem.attach`
    restores: tuple[Restore, ...]  # to ride in the same plan as the attach
    pinned: tuple[Node, ...]  # not split until `unpin` (the plan names their refs)


class TreeCore:
    """The prefix tree; see the module docstring for the intent lifecycle."""

    def __init__(self, runtime: RuntimeInterface, *, page_size: int, l2_pages: int, write_policy: WritePolicy):
        self.runtime = runtime
        self.page_size = page_size
        self.l2_capacity = l2_pages
        self.write_policy = write_policy
        self.root = Node((), None, None)
        self.clock = 0
        self.l2_used = 0  # host pages the tree's nodes hold once every queued intent applied
        self.outbox: list[TreeIntent] = []  # the only intents the tree states
        self.by_generation: dict[int, Node] = {}

    # -- views for the policy ---------------------------------------------------------

    def nodes(self) -> list[Node]:
        """Every node in preorder (root first), so that a parent's index is below its children's."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(list(node.children.values())))
        return out

    def _view(self, nodes: list[Node], in_l1: Callable[[Node], object], pseudo_lock: Callable[[Node], bool] = lambda node: False) -> policy.TreeView:
        index = {id(node): i for i, node in enumerate(nodes)}
        return policy.TreeView(
            parent=tuple(0 if n.parent is None else index[id(n.parent)] for n in nodes),
            lock_ref=tuple(n.lock_ref + int(pseudo_lock(n)) for n in nodes),
            page_count=tuple(n.pages for n in nodes),
            in_l1=tuple(bool(in_l1(n)) if n.parent is not None else True for n in nodes),
            last_access=tuple(n.last_access for n in nodes),
        )

    # -- matching -----------------------------------------------------------------------

    def _page_key(self, tokens: tuple[int, ...], page: int) -> tuple[int, ...]:
        return tuple(tokens[page * self.page_size : (page + 1) * self.page_size])

    def _common_pages(self, key: tuple[int, ...], tokens: tuple[int, ...]) -> int:
        pages = 0
        while (pages + 1) * self.page_size <= min(len(key), len(tokens)):
            if self._page_key(key, pages) != self._page_key(tokens, pages):
                break
            pages += 1
        return pages

    def _touch(self, node: Node) -> None:
        self.clock += 1
        node.last_access = self.clock

    def match_prefix(self, tokens: tuple[int, ...]) -> Match:
        """The longest cached prefix of `tokens` that leaves at least one token to compute.

        Walking a node cancels its queued eviction (the request is about to use it); a
        match that ends inside a node splits it, unless the node's ref is in flight, in
        which case the match ends before it. A node whose demote is in flight ends the match.
        """
        tokens = tuple(tokens)
        limit = (len(tokens) - 1) // self.page_size
        node, depth, l1_pages, l2_pages = self.root, 0, 0, 0
        while depth < limit:
            child = node.children.get(self._page_key(tokens, depth))
            if child is None:
                break
            self._cancel(child)
            if child.demoting:
                break
            common = self._common_pages(child.key, tokens[depth * self.page_size : limit * self.page_size])
            if common < child.pages:
                if child.in_flight:
                    break
                child = self._split(child, common)
            if child.l1:
                l1_pages += child.pages
            else:
                l2_pages += child.pages
            node, depth = child, depth + child.pages
            self._touch(child)
        return Match(node, depth, l1_pages, l2_pages)

    def unlocked_pages(self, match: Match) -> int:
        """Pages on the match's path that no lock holds yet (what acquiring it would pin)."""
        return sum(n.pages for n in match.node.path() if n.lock_ref == 0)

    def acquire(self, match: Match) -> Acquired:
        """Lock the match, pin its refs for the plan being built and ask for its L2 pages back.

        A node to restore stays in flight until its restore's completion (`transfers_done`).
        """
        path = match.node.path()
        restores = []
        for node in path:
            if not node.l1:
                restores.append(Restore(node.ref))
                node.l1 = True
                node.in_flight += 1
            node.in_flight += 1
        if path:
            self.lock(match.node)
        return Acquired(match.node, tuple(n.ref for n in path), tuple(restores), tuple(path))

    def unpin(self, acquired: Acquired) -> None:
        """The plan naming the acquired refs was prepared: they may be split again."""
        for node in acquired.pinned:
            node.in_flight -= 1

    def withdraw(self, acquired: Acquired) -> None:
        """The plan naming the acquired refs will never be prepared: unpin them, and the nodes it
        would have restored are host-only again (no restore started). The lock stays: the
        request holding it lets it go (`unlock`)."""
        self.unpin(acquired)
        restored = {restore.extent.generation for restore in acquired.restores}
        for node in acquired.pinned:
            if node.ref.generation in restored:
                node.l1 = False
                node.in_flight -= 1

    # -- locks (E1, E4) -----------------------------------------------------------------

    def lock(self, node: Node) -> None:
        """+1 lock_ref on `node` and every ancestor, as `policy.lock` computes it."""
        nodes = self.nodes()
        view = self._view(nodes, lambda n: n.l1)
        self._write_locks(nodes, policy.lock(CONCRETE, view, nodes.index(node)))

    def unlock(self, node: Node) -> None:
        """-1 lock_ref on the same path; an unlock without a lock is a bug (E4), never an underflow."""
        nodes = self.nodes()
        view = self._view(nodes, lambda n: n.l1)
        ok, lock_ref = policy.unlock(CONCRETE, view, nodes.index(node))
        if not ok:
            raise AssertionError("unlock of a node whose path holds no lock (E4)")
        self._write_locks(nodes, lock_ref)

    @staticmethod
    def _write_locks(nodes: list[Node], lock_ref: tuple[int, ...]) -> None:
        for node, ref in zip(nodes, lock_ref, strict=True):
            node.lock_ref = ref

    # -- insert ---------------------------------------------------------------------------

    def insert(self, tokens: tuple[int, ...], first_page: int, extent: CacheExtentRef) -> Inserted:
        """Adopt `extent`, the row pages `[first_page, first_page + page_count)` of `tokens`.

        The extent becomes a new leaf only if the tree holds exactly the row's pages before
        it. If it already holds some of the extent's pages (another request computed the
        same tokens meanwhile), or the path is host-only or in flight, the extent is
        released: adopting the rest under another request's duplicate would lock pages
        the row does not map, which the scheduler's page budget never granted. Returns the
        deepest node the walk reached and how many pages the tree adopted.
        """
        tokens = tuple(tokens)
        end = first_page + extent.page_count
        if len(tokens) < end * self.page_size:
            raise ValueError(f"insert needs tokens for {end} pages, got {len(tokens)} tokens")
        node, depth, blocked = self.root, 0, False
        while depth < end:
            child = node.children.get(self._page_key(tokens, depth))
            if child is None:
                break
            self._cancel(child)
            if not child.l1:  # a new device-resident leaf may not hang under a host-only node
                blocked = True
                break
            common = self._common_pages(child.key, tokens[depth * self.page_size : end * self.page_size])
            if common < child.pages:
                if child.in_flight:
                    blocked = True
                    break
                child = self._split(child, common)
            node, depth = child, depth + child.pages
            self._touch(child)
        if blocked or depth != first_page:
            self.outbox.append(Release(extent))
            return Inserted(node, 0)
        leaf = Node(tokens[depth * self.page_size : end * self.page_size], extent, node)
        node.children[self._page_key(leaf.key, 0)] = leaf
        self.by_generation[extent.generation] = leaf
        self._touch(leaf)
        if self.write_policy is WritePolicy.WRITE_THROUGH and self._make_l2_room(leaf.pages):
            self._queue_backup(leaf)
        return Inserted(leaf, leaf.pages)

    def _split(self, node: Node, at_page: int) -> Node:
        """Split `node` after `at_page` pages; the new head becomes its parent (and inherits its state)."""
        old, parent = node.ref, node.parent
        assert parent is not None, "the root is never split"
        head_ref, tail_ref = self.runtime.split(old, at_page)
        head = Node(node.key[: at_page * self.page_size], head_ref, parent)
        head.lock_ref, head.last_access, head.l1, head.l2 = node.lock_ref, node.last_access, node.l1, node.l2
        parent.children[self._page_key(head.key, 0)] = head
        node.key, node.extent, node.parent = node.key[at_page * self.page_size :], tail_ref, head
        head.children[self._page_key(node.key, 0)] = node
        del self.by_generation[old.generation]
        self.by_generation[head_ref.generation] = head
        self.by_generation[tail_ref.generation] = node
        self.outbox = [
            out
            for intent in self.outbox
            for out in ((Backup(head_ref), Backup(tail_ref)) if isinstance(intent, Backup) and intent.extent == old else (intent,))
        ]
        return head

    # -- eviction -------------------------------------------------------------------------

    def l1_pages(self) -> int:
        """Pages the tree keeps (or is restoring) on the device."""
        return sum(n.pages for n in self.nodes() if n.l1)

    def locked_pages(self) -> int:
        """Pages on paths to locks: what no eviction may take (E1)."""
        return sum(n.pages for n in self.nodes() if n.lock_ref > 0)

    def evict(self, pages_needed: int) -> int:
        """Queue the eviction of at least `pages_needed` device pages, leaf-first LRU (E1-E3).

        A victim with a host copy is demoted; without one, under an L2 it is backed up and
        demoted; otherwise it is released (with any host-only nodes below it, which would
        be unreachable). Returns the pages queued, fewer if not enough are evictable.
        """
        if pages_needed <= 0:
            return 0
        nodes = self.nodes()
        # A node with a transfer in flight waits for its completion; after a failure a resident
        # node may sit below a host-only one, so the policy sees the closure (module docstring: Failure).
        view = self._view(nodes, lambda n: n.l1, pseudo_lock=lambda n: n.in_flight > 0)
        order = policy.eviction_order(CONCRETE, policy.resident_closure(CONCRETE, view), pages_needed)
        queued = 0
        for _, i in sorted((o, i) for i, o in enumerate(order) if o):
            if not nodes[i].l1:
                continue  # host-only above a resident node: counted resident by the closure, frees nothing
            if not self._evict_one(nodes[i]):
                break  # later rounds may be its ancestors: they must stay while it stays
            queued += nodes[i].pages
        return queued

    def _evict_one(self, victim: Node) -> bool:
        if not victim.l2 and self.l2_capacity and self._make_l2_room(victim.pages):
            self._queue_backup(victim)
        if victim.l2:
            intent: Demote | Release = Demote(victim.ref)
        else:
            below = self._subtree(victim)[1:]
            if any(n.in_flight or isinstance(n.queued, Demote) for n in below):
                return False  # a backup or demote on its way: release after it has landed
            for node in reversed(below):
                self._remove(node)
            intent = Release(victim.ref)
        victim.l1 = False
        victim.queued = intent
        self.outbox.append(intent)
        return True

    def _queue_backup(self, node: Node) -> None:
        node.l2 = True
        self.l2_used += node.pages
        self.outbox.append(Backup(node.ref))

    def _make_l2_room(self, pages: int) -> bool:
        """Release host-only leaves (leaf-first LRU) until `pages` more host pages fit."""
        excess = self.l2_used + pages - self.l2_capacity
        if excess > 0:
            nodes = self.nodes()
            view = self._view(
                nodes,
                in_l1=lambda n: True,  # every node is a candidate tier-leaf of the whole tree
                pseudo_lock=lambda n: n.l1 or n.in_flight > 0 or n.queued is not None or not n.l2,
            )
            order = policy.eviction_order(CONCRETE, view, excess)
            for _, i in sorted((o, i) for i, o in enumerate(order) if o):
                self._remove(nodes[i])
        return self.l2_used + pages <= self.l2_capacity

    def _subtree(self, node: Node) -> list[Node]:
        out, stack = [], [node]
        while stack:
            current = stack.pop()
            out.append(current)
            stack.extend(current.children.values())
        return out

    def _remove(self, node: Node) -> None:
        """Drop a childless node from the tree now; its release is queued (once: a queued victim has it)."""
        assert not node.children and node.lock_ref == 0, "only unlocked leaves leave the tree (E1, E2)"
        already_queued = isinstance(node.queued, Release)
        self._detach(node)
        if not already_queued:
            self.outbox.append(Release(node.ref))

    def _detach(self, node: Node) -> None:
        assert not node.in_flight, "a node whose ref is in flight stays in the tree"
        assert node.parent is not None, "the root is never detached"
        del node.parent.children[self._page_key(node.key, 0)]
        del self.by_generation[node.ref.generation]
        if node.l2:
            self.l2_used -= node.pages
        node.queued = None

    def _cancel(self, node: Node) -> None:
        """A request reached a node whose eviction is still queued: withdraw it (the lock wins)."""
        if node.queued is None:
            return
        self.outbox.remove(node.queued)
        node.queued = None
        node.l1 = True

    # -- the outbox -----------------------------------------------------------------------

    def take_intents(self) -> tuple[TreeIntent, ...]:
        """Hand the queued intents to a plan; from now on they are in flight (not cancellable)."""
        taken, self.outbox = tuple(self.outbox), []
        for intent in taken:
            node = self.by_generation.get(intent.extent.generation)
            if node is None:  # a released duplicate or an already detached node
                continue
            if isinstance(intent, Release):  # an L1 victim with no host copy: it leaves the tree now
                self._detach(node)
                continue
            node.queued = None
            node.in_flight += 1
            if isinstance(intent, Demote):
                node.demoting = True
        return taken

    def return_intents(self, intents: Iterable[TreeIntent]) -> None:
        """The plan carrying `intents` failed or was never prepared: none of them applied, so
        each goes back to the outbox as it was before `take_intents` (a `Release` whose node
        left the tree at take is sent again; a `Demote` is cancellable again), ahead of what
        was queued since: a `Backup` queued since may count on the host pages a returned
        `Release` frees."""
        returned = list(intents)
        self.outbox[:0] = returned
        for intent in returned:
            node = self.by_generation.get(intent.extent.generation)
            if node is not None and not isinstance(intent, Release):
                node.in_flight -= 1
                if isinstance(intent, Demote):
                    node.demoting = False
                    node.queued = intent

    def intents_applied(self, intents: Iterable[Intent]) -> None:
        """The batch (or submit) carrying `intents` executed: demoted nodes may be matched again."""
        for intent in intents:
            if isinstance(intent, Demote):
                node = self.by_generation[intent.extent.generation]
                node.in_flight -= 1
                node.demoting = False

    def transfers_done(self, completions: Iterable[TransferCompletion]) -> set[int]:
        """Backups, restores and persists that completed, landed or failed: their nodes may be split,
        evicted and released again; a failure changes where the node's copies are (module
        docstring: Failure). Returns the extent generations whose restore failed."""
        failed_restores = set()
        for done in completions:
            if done.ticket.kind is TransferKind.FETCH:
                continue  # it filled a row, no node
            node = self.by_generation[done.ticket.extent_generation]  # in flight: still in the tree, unsplit
            node.in_flight -= 1
            if done.failure is None or done.ticket.kind is TransferKind.PERSIST:
                continue  # a failed persist changed no copy (§9.3)
            if done.ticket.kind is TransferKind.RESTORE:
                node.l1 = False  # its host copy is intact: the next match restores it again
                failed_restores.add(done.ticket.extent_generation)
            else:
                node.l2 = False
                self.l2_used -= node.pages
                node.l1 = True  # demoted with the backup (write-back): the runtime kept the device copy
        return failed_restores
