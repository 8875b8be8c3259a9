"""The `cacheruntime` command line: one subcommand per job, each owned by its module.

Every subcommand module exposes `add_arguments(parser)` and `main(args) -> int`; the
module is imported only when its subcommand runs, so `cacheruntime tlc` needs no torch
and `cacheruntime z3` needs no Java. A subcommand whose extra is not installed (torch,
hypothesis, z3, ...: see cacheruntime.extras) says in one line which to install. A
subcommand that sets the default `forward` takes the options it does not know as
`args.forward` (`cacheruntime bench` hands them to the benchmark). A bad option or value
is one line on stderr (what was wrong, and where the options are listed) and exit code 2;
an error the options could not foresee (a malformed input file, say) is one line and exit
code 1, and `--debug` anywhere on the line shows its traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import NoReturn

from cacheruntime import extras

#: subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "run": ("cacheruntime.job", "serve a workload end to end on LocalGPURuntime (the main job)"),
    "conformance": ("cacheruntime.conformance.cli", "hold a runtime to the reference model"),
    "tlc": ("cacheruntime.tlc", "model-check the TLA+ spec with TLC"),
    "z3": ("cacheruntime.z3check", "prove the eviction, lock and page-run properties with Z3"),
    "bench": ("cacheruntime.bench", "measure the boundary's cost and overlap (from a source checkout)"),
    "check": ("cacheruntime.gate", "run the whole gate: traceability, TLC, Z3, conformance"),
    "trace": ("cacheruntime.traceability", "check that every invariant id is found in the artifacts that claim it"),
}


class OneLineErrors(argparse.ArgumentParser):
    """A parser whose errors are one line, not argparse's usage block: a CI log shows them whole."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the module of `command` (if given) is imported to add its options."""
    parser = OneLineErrors(prog="cacheruntime", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(module=module)
        if name == command:
            importlib.import_module(module).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv  # anywhere on the line: the traceback instead of the one-line error
    argv = [a for a in argv if a != "--debug"]
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(command if command in SUBCOMMANDS else None)
        args, unknown = parser.parse_known_args(argv)
        if unknown and not hasattr(args, "forward"):
            where = f"cacheruntime {args.command}"
            parser.exit(2, f"{where}: error: unrecognized arguments: {' '.join(unknown)} (see {where} --help)\n")
        if unknown:
            args.forward = unknown
        return int(importlib.import_module(args.module).main(args) or 0)
    except ModuleNotFoundError as error:
        extra = _extra_missing(error)
        if extra is None:
            return _one_line(command, error, debug)
        print(extras.needs(str(command), [extra]), file=sys.stderr)
        return 2
    except Exception as error:  # what the options could not catch (a malformed input file, ...): one line
        return _one_line(command, error, debug)


def _one_line(command: str | None, error: Exception, debug: bool) -> int:
    """Report what stopped a subcommand in one line on stderr (exit 1); with `--debug`, raise it for its traceback."""
    if debug:
        raise error
    print(f"cacheruntime {command or ''}: error: {type(error).__name__}: {error} (--debug shows the traceback)", file=sys.stderr)
    return 1


def _extra_missing(error: ModuleNotFoundError) -> str | None:
    """The extra whose absence raised `error`, or None when it is not a missing extra."""
    top = (error.name or "").partition(".")[0]
    if top not in extras.EXTRA_OF or importlib.util.find_spec(top) is not None:
        return None
    return extras.EXTRA_OF[top]


if __name__ == "__main__":
    sys.exit(main())
