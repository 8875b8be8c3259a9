"""Which SGLang methods each protocol operation of the adapter reaches, recorded, not written down.

A profiler hook notes every call the adapter (adapter.py) makes *directly* into SGLang's
package while one protocol operation runs; the scenario in `record()` runs every operation at least once
(a double release and a stale close too, which reach SGLang unchanged), on each adapter
configuration of `CONFIGURATIONS`. `table()` renders what was recorded as a markdown table
of notes.md; `tests/sglang/test_calls_reached.py` holds notes.md to each, so no table can
drift from the code.

Only adapter.py's calls count, on the unified trees too: the adapter's other modules reach
SGLang from `stack.py` (building the stack, before the first operation) and `checks.py`
(SGLang's scheduler invariant checks after an operation), neither of them an operation's work.

    PYTHONPATH=src:.:conformance/adapters/sglang/stubs .venv-sglang/bin/python -m conformance.adapters.sglang.calls
prints every table between its markers (paste each over its own in notes.md).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ADAPTER_FILE = str(HERE / "adapter.py")

_SIZES = {"page_size": 4, "max_requests": 4, "l1_pages": 16, "l2_pages": 16}
#: The adapter configurations recorded, by name: the legacy RadixCache with the HiCache
#: controller, and 0.5.23's default UnifiedRadixCache (Rust and Python TreeCore) with the
#: tree's own HiCache under each write policy. notes.md has one table per name.
CONFIGURATIONS: dict[str, dict[str, object]] = {
    "tree=radix l2_pages=16": _SIZES,
    "tree=unified-rust l2_pages=16 write_policy=write_through": {**_SIZES, "tree": "unified-rust", "write_policy": "write_through"},
    "tree=unified-python l2_pages=16 write_policy=write_back": {**_SIZES, "tree": "unified-python", "write_policy": "write_back"},
}


def markers(configuration: str) -> tuple[str, str]:
    """The markers around `configuration`'s table in notes.md."""
    return f"<!-- calls-reached {configuration}:start -->", f"<!-- calls-reached {configuration}:end -->"


#: Protocol operations, in the order the table lists them.
OPERATIONS = (
    "open_request",
    "prepare_batch",
    "execute_batch",
    "cancel_batch",
    "publish",
    "split",
    "retain",
    "release",
    "submit",
    "poll_completions",
    "wait_completions",
    "close_request",
)


class Recorder:
    """Profiler hook: SGLang functions called from adapter.py, per protocol operation running."""

    def __init__(self, sglang_root: str):
        self.sglang_root = sglang_root
        self.reached: dict[str, list[str]] = defaultdict(list)
        self.operation: str | None = None

    def __call__(self, frame, event, arg):
        if event != "call" or self.operation is None:
            return
        code, caller = frame.f_code, frame.f_back
        if caller is None or caller.f_code.co_filename != ADAPTER_FILE or not code.co_filename.startswith(self.sglang_root):
            return
        name = f"{Path(code.co_filename).stem}.{code.co_qualname}"
        if name not in self.reached[self.operation]:
            self.reached[self.operation].append(name)


class _Panicked(Exception):
    """The Rust TreeCore panicked during an operation: the scenario cannot go on on that tree."""


def record(configuration: str) -> dict[str, list[str]]:
    """Run the scenario on a fresh adapter built as `configuration` names; return operation -> SGLang functions reached, first reached first."""
    import sglang
    from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Drop, Publish, Restore, Unsupported

    from .adapter import make_runtime

    rt = make_runtime(**CONFIGURATIONS[configuration])
    recorder = Recorder(str(Path(sglang.__file__).resolve().parent))

    def op(name, *args):
        recorder.operation = name
        recorder.reached.setdefault(name, [])
        try:
            return getattr(rt, name)(*args)
        except AssertionError:  # SGLang's own refusal (stale close, second release): recorded, then on
            return None
        except Unsupported:  # the adapter's refusal before any SGLang call (Drop on the unified tree): reaches nothing
            return None
        except RuntimeError as error:
            # The Rust TreeCore's panic (F15: the Demote of a referenced entry is a demote of a
            # locked node): recorded; the TreeCore refuses every later call, so the scenario ends.
            if "Rust TreeCore panicked" not in str(error):
                raise
            raise _Panicked from error
        finally:
            recorder.operation = None

    previous = sys.getprofile()
    sys.setprofile(recorder)
    try:
        a = op("open_request")
        done = op("execute_batch", op("prepare_batch", BatchPlan((BatchItem(a, tuple(range(8))),), (Publish(a, 0, 1),))))
        (x0,) = done.published
        x = op("publish", a, 0, 2)
        head, tail = op("split", x, 1)
        op("retain", tail)
        op("release", tail)
        b = op("open_request")
        op("cancel_batch", op("prepare_batch", BatchPlan((BatchItem(b, (1,), attach=(head,)),))))
        op("execute_batch", op("prepare_batch", BatchPlan((BatchItem(b, (1,), attach=(head,)),))))
        # Both requests closed first: a Demote of an entry a live request still locks is a demote
        # of a locked node, which the unified tree's Rust TreeCore refuses by panicking (F15).
        op("close_request", b)
        op("close_request", a)
        op("submit", (Backup(tail),))
        op("wait_completions")
        op("submit", (Demote(tail),))
        op("submit", (Restore(tail),))
        op("poll_completions")
        op("submit", (Drop(tail),))  # the unified tree: Unsupported before any SGLang call
        op("close_request", a)  # stale: ReqToTokenPool.free refuses it
        op("release", x0)
        op("release", head)
        op("release", tail)
        op("release", tail)  # second release: reaches the tree and the allocator
    except _Panicked:
        pass
    finally:
        sys.setprofile(previous)
    return dict(recorder.reached)  # an operation the scenario never ran has no key


def table(reached: dict[str, list[str]]) -> str:
    """The markdown table of notes.md: operation -> SGLang functions the adapter calls for it."""
    lines = ["| protocol operation | SGLang functions the adapter calls (module.qualname, first call first) |", "|---|---|"]
    for operation in OPERATIONS:
        if operation not in reached:
            lines.append(f"| `{operation}` | not run (the scenario ended before it) |")
        else:
            lines.append(f"| `{operation}` | {', '.join(f'`{n}`' for n in reached[operation]) or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    for configuration in CONFIGURATIONS:
        start, end = markers(configuration)
        print(start, table(record(configuration)), end, "", sep="\n")


if __name__ == "__main__":
    main()
