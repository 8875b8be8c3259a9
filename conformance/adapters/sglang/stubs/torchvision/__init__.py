"""Import-only stand-in for torchvision, for the CPU SGLang environment of the adapter.

PyPI's torchvision wheels cannot load beside the CPU torch build the adapter pins, yet
`sglang.srt.configs` (through `deepseek_ocr.py`) and `transformers` (image and video
utilities) import torchvision names at module load, although nothing the cache classes do
uses them. This stub makes every `torchvision.*` import succeed: a submodule is an empty
module and a name is a placeholder that can be used as a dictionary key or an attribute
path at import time, and raises as soon as it is called. No torchvision code is here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+cacheruntime.stub"


class _Placeholder:
    """A stand-in for any torchvision name: attribute access yields more placeholders."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._path} was called, but torchvision here is the cacheruntime import-only stub")

    def __mro_entries__(self, bases):  # allow `class X(torchvision.something):` at import time
        return (object,)

    def __repr__(self) -> str:
        return f"<torchvision stub {self._path}>"

    def __hash__(self) -> int:
        return hash(self._path)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Placeholder) and other._path == self._path


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every `torchvision.<sub>` import with an empty stub module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder(f"torchvision.{name}")
