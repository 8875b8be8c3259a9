"""One boundary call as a transaction: begin, journal, commit, rollback.

A call checks its preconditions before it changes the ledger, and commits before it
touches the device. Where a later check can still fail after an earlier change (the
intents of `submit` and `execute_batch` apply in order, each checked against the state
the previous ones left), every change is first written to the journal as a function that
reverts it, and a failure replays the journal backwards. A raised `CacheRuntimeError`
therefore leaves the runtime exactly as it was, and a call costs what it touches: nothing
is copied wholesale.

A call whose every check precedes its first change (`prepare_batch` checks a plan, then
applies the checked plan; `poll_completions`; `info`) begins without a journal: it has
nothing to undo, and skips the journal's cost on the hot path.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar


class Transaction:
    """The open call: its name, its journal (None when it keeps none), whether it committed.

    `journal` is public so that a loop over pages can test it once and journal one entry
    per loop rather than one closure per page. `started` lists the transfers the call
    started, which the device layer launches after the commit.
    """

    __slots__ = ("committed", "journal", "operation", "started")

    def __init__(self) -> None:
        self.operation = ""
        self.committed = True
        self.journal: list[Callable[[], object]] | None = None
        self.started: list[int] = []

    def begin(self, operation: str, journal: bool) -> None:
        """Open a call named `operation`; with `journal`, record undo steps until the commit."""
        self.operation = operation
        self.committed = False
        self.journal = [] if journal else None
        if self.started:
            self.started = []

    def start_journal(self) -> None:
        """Journal from here on: a call that began without one finds, after its first checks,
        that a later check can fail after a change (allowed only before its first change)."""
        self.journal = []

    def undo(self, step: Callable[[], object]) -> None:
        """Journal `step`, which reverts the change about to be made (a no-op without a journal)."""
        if self.journal is not None:
            self.journal.append(step)

    def commit(self, calls: Counter[str]) -> None:
        """Every precondition held: keep the changes, and count the call (B1) in `calls`."""
        self.committed = True
        self.journal = None
        calls[self.operation] += 1

    def rollback(self) -> None:
        """The call failed before committing: undo its journal, newest change first."""
        journal, self.journal = self.journal, None
        if journal is not None:
            for step in reversed(journal):
                step()
        self.started = []


_Call = TypeVar("_Call", bound=Callable[..., Any])


def operation(*, journal: bool = True) -> Callable[[_Call], _Call]:
    """Run a boundary call as a transaction; keep its changes only if it succeeds.

    The call commits (`commit`) once every precondition held and before it touches the
    device (`execute_batch`: after its compute succeeded, see `LocalGPURuntime.execute_batch`);
    a call without device work is committed on return. `journal=False` is for the
    calls whose every check precedes their first change: a failure finds nothing to undo.

    Around the call, the runtime's `check_machinery(name)` refuses it while the machinery
    is gone, and `machinery_fault(error)` turns an error that says so into the typed one.
    """

    def wrap(method: _Call) -> _Call:
        name = method.__name__

        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.check_machinery(name)
            txn = self.ledger.txn
            txn.begin(name, journal)
            try:
                result = method(self, *args, **kwargs)
            except BaseException as error:
                if not txn.committed:
                    txn.rollback()
                fault = self.machinery_fault(error)
                if fault is not None:
                    raise fault from error
                raise
            if not txn.committed:
                self.commit()
            return result

        return call  # type: ignore[return-value]

    return wrap
