"""Where the spec files are: a checkout's `spec/` and `tla/`, or the copy the wheel ships.

`cacheruntime tlc`, `trace` and `check` read the TLA+ spec, its models and manifest, and
the prose spec. In a checkout they use its files; installed from a wheel they use the copy
built into it (`cacheruntime/_specfiles/`, made by setup.py from the same files), so they
work without a clone. `--repo DIR` names a checkout explicitly. Every command finds them
here, so the three never disagree on which files they check.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: this package's folder: `src/cacheruntime` in a checkout, `site-packages/cacheruntime` installed
PACKAGE = Path(__file__).resolve().parent
#: the copy of spec/ and tla/ inside a built wheel
PACKAGED = PACKAGE / "_specfiles"


def has_specfiles(folder: Path) -> bool:
    """Whether `folder` holds the spec files (a checkout's root, or the packaged copy)."""
    return (folder / "tla" / "manifest.json").is_file() and (folder / "spec" / "invariants.md").is_file()


def root(repo: Path | None = None) -> Path:
    """The folder holding `spec/` and `tla/`, the first of: `repo`; the working directory
    if it holds the invariant catalogue (the checkout you stand in); the checkout this
    package was imported from (`src/cacheruntime` two levels below); the copy in the wheel."""
    if repo is not None:
        return repo
    if (Path.cwd() / "spec" / "invariants.md").is_file():
        return Path.cwd()
    checkout = PACKAGE.parents[1]
    if PACKAGE.parent.name == "src" and has_specfiles(checkout):
        return checkout
    return PACKAGED


def tla_dir(repo: Path | None = None) -> Path:
    """The TLA+ spec, its models and manifest (see `root`)."""
    return root(repo) / "tla"


def sources(folder: Path) -> Path:
    """The package source that belongs with the spec files in `folder`: the checkout's
    `src/cacheruntime`, or (for the wheel's copy, or a folder without sources) this package."""
    checkout_sources = folder / "src" / "cacheruntime"
    return checkout_sources if checkout_sources.is_dir() else PACKAGE


def add_repo_option(parser: argparse.ArgumentParser) -> None:
    """`--repo DIR`, the same for every command that reads the spec files."""
    parser.add_argument(
        "--repo",
        type=_checkout,
        metavar="DIR",
        default=None,
        help="a cacheruntime checkout whose spec/ and tla/ to use (default: this one, else the copy in the wheel)",
    )


def _checkout(text: str) -> Path:
    path = Path(text).resolve()
    if not has_specfiles(path):
        raise argparse.ArgumentTypeError(f"{text} is not a cacheruntime checkout (no tla/manifest.json and spec/invariants.md)")
    return path
