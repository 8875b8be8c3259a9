"""Where a runtime process begins: imports the server (torch) there, never in control.

The fork server calls `main` in the new process; this module is torch-free so that the
client can name it as the process's target without importing the server itself. A runtime
that cannot be built leaves its traceback in `error_file` for the client's typed error.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any


def main(endpoint: str, factory: str, options: dict[str, Any], epoch: int, generations: tuple[int, ...], error_file: str, spin_s: float = 0.0) -> None:
    try:
        from cacheruntime.runtime.process.server import serve

        serve(endpoint, factory, options, epoch, generations, spin_s)
    except BaseException:
        with open(error_file, "w") as out:
            out.write(traceback.format_exc())
        sys.exit(1)
