"""`cacheruntime bench`: run the boundary benchmark of a source checkout.

The benchmark (`benchmarks/` at the top of a checkout) is not part of the installed
package: it measures the runtime against baselines and carries one-off diagnostics, none
of which a user of the protocol needs. This command finds the checkout (the working
directory or one above it, or `--repo DIR`), imports its `benchmarks` package and runs it
on the installed cacheruntime; every option other than `--repo` goes to the benchmark
(`python -m benchmarks --help` in the checkout lists them).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path


def is_checkout(folder: Path) -> bool:
    """Whether `folder` is the root of a cacheruntime source checkout with its benchmark."""
    return (folder / "benchmarks" / "__init__.py").is_file() and (folder / "src" / "cacheruntime").is_dir()


def find_checkout(start: Path) -> Path | None:
    """The checkout holding `start`: `start` itself or the nearest folder above it that is one."""
    return next((folder for folder in (start, *start.parents) if is_checkout(folder)), None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, metavar="DIR", help="the checkout whose benchmarks/ to run (default: the one holding the working directory)")
    parser.epilog = "Every other option goes to the benchmark; `python -m benchmarks --help` in a checkout lists them."
    parser.set_defaults(forward=[])


def main(args: argparse.Namespace) -> int:
    repo = args.repo.resolve() if args.repo else find_checkout(Path.cwd().resolve())
    if repo is None or not is_checkout(repo):
        where = args.repo or f"{Path.cwd()} or above"
        print(f"cacheruntime bench runs from a source checkout: no benchmarks/ in {where}; run it in a clone or pass --repo DIR", file=sys.stderr)
        return 2
    sys.path.insert(0, str(repo))
    benchmarks = importlib.import_module("benchmarks")
    from cacheruntime.cli import OneLineErrors  # the benchmark's own options fail in one line too

    parser = OneLineErrors(prog="cacheruntime bench", description=benchmarks.__doc__.splitlines()[0])
    benchmarks.add_arguments(parser)
    return int(benchmarks.main(parser.parse_args(args.forward)))
