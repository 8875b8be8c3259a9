"""Which SGLang methods each protocol operation of the adapter reaches, recorded, not written down.

A profiler hook notes every call the adapter (adapter.py) makes *directly* into SGLang's
package while one protocol operation runs; the scenario in `record()` runs every operation at least once
(a double release and a stale close too, which reach SGLang unchanged). `table()` renders
what was recorded as the markdown table of notes.md; `tests/sglang/test_calls_reached.py`
holds notes.md to it, so the table cannot drift from the code.

    PYTHONPATH=.:conformance/adapters/sglang/stubs .venv-sglang/bin/python -m conformance.adapters.sglang.calls
prints the table (paste it between the markers in notes.md).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ADAPTER_FILE = str(HERE / "adapter.py")
START, END = "<!-- calls-reached:start -->", "<!-- calls-reached:end -->"

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


def record() -> dict[str, list[str]]:
    """Run the scenario on a fresh adapter and return operation -> SGLang functions reached, first reached first."""
    import sglang
    from cacheruntime.protocol import Backup, BatchItem, BatchPlan, Demote, Drop, Publish, Restore

    from .adapter import make_runtime

    rt = make_runtime(page_size=4, max_requests=4, l1_pages=16, l2_pages=16)
    recorder = Recorder(str(Path(sglang.__file__).resolve().parent))

    def op(name, *args):
        recorder.operation = name
        try:
            return getattr(rt, name)(*args)
        except AssertionError:  # SGLang's own refusal (stale close, second release): recorded, then on
            return None
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
        op("submit", (Backup(tail),))
        op("wait_completions")
        op("submit", (Demote(tail),))
        op("submit", (Restore(tail),))
        op("poll_completions")
        op("submit", (Drop(tail),))
        op("close_request", b)
        op("close_request", a)
        op("close_request", a)  # stale: ReqToTokenPool.free refuses it
        op("release", x0)
        op("release", head)
        op("release", tail)
        op("release", tail)  # second release: reaches the tree and the allocator
    finally:
        sys.setprofile(previous)
    return dict(recorder.reached)


def table(reached: dict[str, list[str]]) -> str:
    """The markdown table of notes.md: operation -> SGLang functions the adapter calls for it."""
    lines = ["| protocol operation | SGLang functions the adapter calls (module.qualname, first call first) |", "|---|---|"]
    for operation in OPERATIONS:
        lines.append(f"| `{operation}` | {', '.join(f'`{n}`' for n in reached.get(operation, [])) or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    print(table(record()))


if __name__ == "__main__":
    main()
