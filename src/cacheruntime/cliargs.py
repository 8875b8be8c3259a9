"""Option types of the command line that check their value before any work starts.

Each is an argparse `type=`: a bad value raises `ArgumentTypeError`, which the parser
prints as one line naming the option (`argument --junitxml: ...`) with exit code 2. A
run that would fail after minutes of work on an unwritable output path, or with a
traceback on a misspelt factory, fails at once instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path


def positive_int(text: str) -> int:
    """A count of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (a scale or a budget)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def factory_name(text: str) -> str:
    """`MODULE:FACTORY` by its form only, for a command that hands it to a subprocess which imports it.

    `cacheruntime check` does: importing the runtime there would load torch before the
    gate could say in one line which extra is missing.
    """
    module_name, colon, attribute = text.partition(":")
    if not colon or not module_name or not attribute:
        raise argparse.ArgumentTypeError(f"{text!r} is not MODULE:FACTORY (e.g. cacheruntime.runtime.factories:conformance)")
    return text


def factory(text: str) -> str:
    """`MODULE:FACTORY` naming an importable callable; returned as given (the suite imports it again per case)."""
    module_name, _, attribute = factory_name(text).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise argparse.ArgumentTypeError(f"cannot import {module_name!r} ({error}); is its directory on PYTHONPATH?") from None
    target: object = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise argparse.ArgumentTypeError(f"module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise argparse.ArgumentTypeError(f"{text!r} is not callable: give a function or class that returns a fresh runtime")
    return text


def input_file(text: str) -> Path:
    """A file that exists and can be read."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no file {text!r}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be read")
    return path


def output_file(text: str) -> Path:
    """A path a report can be written to: not a directory, under a directory that exists or can be made."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file name")
    parent = path.parent
    while not parent.exists():  # the nearest existing ancestor must be a writable directory
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {str(parent)!r} is not a writable directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: the file is read-only")
    return path


def input_dir(text: str) -> Path:
    """A directory that exists and can be listed and read."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"no directory {text!r}")
    if not os.access(path, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be read")
    return path


def output_dir(text: str) -> Path:
    """A directory files can be written into: one that exists and is writable, or one that can be made."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a directory")
    nearest = path
    while not nearest.exists():  # the nearest existing ancestor must be a writable directory
        nearest = nearest.parent
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write into {text!r}: {str(nearest)!r} is not a writable directory")
    return path
