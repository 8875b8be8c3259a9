"""Plugin interface drift: do third-party HiCache storage backends and cache linkers fit this SGLang?

SGLang loads out-of-tree classes by module and class name: a HiCache storage backend
(`HiCacheStorage`, through `StorageBackendFactory`'s "dynamic" backend) and a unified-cache
linker (`UnifiedCacheLinker`, through `create_unified_cache_linker`). Neither is tested
against SGLang, so an SGLang release that adds an abstract method, or a keyword its callers
pass, breaks them at launch. This check compares each plugin class to the ABC of the SGLang
that is installed, and reports every misfit of every plugin, not the first:

- an abstract method of the ABC that the plugin does not implement (SGLang refuses an
  abstract class, or instantiating it raises);
- a method of the ABC (abstract or not) that the plugin overrides with an incompatible
  signature, by `parameter_misfits`' rule: every call that binds to the ABC's signature must
  bind to the plugin's, each argument to the same parameter. So a plugin may add optional
  parameters, `*args` or `**kwargs`, and extra methods; it may not drop, rename, reorder or
  re-kind a parameter the ABC declares (SGLang's callers pass them by position and by
  keyword), make an optional one required, or add a required one. Defaults and annotations
  are not compared: neither changes whether a call binds;
- a constructor that does not take the call SGLang's loader makes (`Interface.construction`);
- a class that only claims the interface: a base of the ABC's name that is not SGLang's ABC
  (a stand-in for an SGLang that did not import); SGLang's loaders require `issubclass`.

Plugins are named on the command line (`--plugin module:Class`, repeatable) and found in
the installed distributions (`discover`): those whose metadata names SGLang, in the modules
whose source names one of the ABCs.

    PYTHONPATH=.:conformance/adapters/sglang/stubs .venv-sglang/bin/python -m conformance.adapters.sglang.plugins \\
        [--plugin module:Class ...] [--no-discover] [--expected PATH] [--junitxml PATH]

Exit 0: every plugin fits (or misfits only as `--expected` lists); 4: a plugin misfits
(`EXIT_PLUGIN_MISFIT`); 2: bad input (a plugin that does not import, a malformed --expected).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import attrs

from .fit import call_misfit

#: Exit code of a plugin misfit (the gate's: 1 a violation, 2 usage, 3 the adapter does not fit).
EXIT_PLUGIN_MISFIT = 4
EXIT_BAD_INPUT = 2


@attrs.frozen
class Interface:
    """An SGLang ABC that out-of-tree classes implement, and how SGLang's loader constructs one."""

    module: str
    name: str
    #: The constructor call of SGLang 0.5.23's loader: (positional arguments, keywords).
    construction: tuple[int, tuple[str, ...]]
    loader: str

    def abc(self) -> type:
        return getattr(importlib.import_module(self.module), self.name)


INTERFACES = (
    # mem_cache/storage/backend_factory.py, create_dynamic_backend: backend_class(storage_config, kwargs)
    Interface("sglang.srt.mem_cache.hicache_storage", "HiCacheStorage", (2, ()), "StorageBackendFactory"),
    # mem_cache/unified_cache/linker_factory.py, create_unified_cache_linker:
    # linker_cls(server_args, params, components=..., extra_config=..., forward_stream=...)
    Interface(
        "sglang.srt.mem_cache.unified_cache.unified_cache_linker",
        "UnifiedCacheLinker",
        (2, ("components", "extra_config", "forward_stream")),
        "create_unified_cache_linker",
    ),
)


class BadPlugin(ValueError):
    """Bad input: a `module:Class` that does not name an importable class, or a malformed expected-misfits file."""


@attrs.frozen
class Verdict:
    """One plugin class against the interfaces it implements or claims."""

    plugin: str  # module:Class
    distribution: str | None  # None: named on the command line
    interfaces: tuple[str, ...]
    misfits: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.misfits


def load(spec: str) -> type:
    """The class `spec` ("module:Class") names; BadPlugin (one line) if it does not import."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise BadPlugin(f"plugin {spec!r}: expected module:Class")
    try:
        obj = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise BadPlugin(f"plugin {spec}: does not import ({type(error).__name__}: {error})") from None
    if not inspect.isclass(obj):
        raise BadPlugin(f"plugin {spec}: not a class")
    return obj


def parameter_misfits(declared: inspect.Signature, implemented: inspect.Signature) -> list[str]:
    """How a call that binds to `declared` (the ABC's method, self dropped) fails to bind, or binds
    differently, to `implemented` (the plugin's): the rule in the module docstring."""
    P = inspect.Parameter
    got = implemented.parameters
    got_positional = [p.name for p in got.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    var_positional = any(p.kind is P.VAR_POSITIONAL for p in got.values())
    var_keyword = any(p.kind is P.VAR_KEYWORD for p in got.values())
    declared_positional = [p.name for p in declared.parameters.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    misfits: list[str] = []
    renamed_to: set[str] = set()
    for want in declared.parameters.values():
        if want.kind is P.VAR_POSITIONAL or want.kind is P.VAR_KEYWORD:
            if not (var_positional if want.kind is P.VAR_POSITIONAL else var_keyword):
                misfits.append(f"drops {want}")
            continue
        by_position = want.kind is not P.KEYWORD_ONLY
        by_keyword = want.kind is not P.POSITIONAL_ONLY
        index = declared_positional.index(want.name) if by_position else -1
        slot = got_positional[index] if 0 <= index < len(got_positional) else None
        have = got.get(want.name)
        if want.kind is P.POSITIONAL_ONLY:  # its name is not part of the call
            have = got[slot] if slot is not None else None
        if have is None or have.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            if by_position and slot is not None and slot not in declared.parameters:
                misfits.append(f"renames parameter {want.name} to {slot}")
                renamed_to.add(slot)
            elif (by_position and not (slot is None and var_positional)) or (by_keyword and not var_keyword):
                misfits.append(f"drops parameter {want.name}")
            continue
        if by_position and have.kind is P.KEYWORD_ONLY:
            misfits.append(f"makes parameter {want.name} keyword-only")
        elif by_position and got_positional.index(have.name) != index:
            misfits.append(f"moves parameter {want.name} from position {index + 1} to {got_positional.index(have.name) + 1}")
        if by_keyword and have.kind is P.POSITIONAL_ONLY:
            misfits.append(f"makes parameter {want.name} positional-only")
        if want.default is not P.empty and have.default is P.empty:
            misfits.append(f"makes optional parameter {want.name} required")
    for extra in got.values():
        required = extra.default is P.empty and extra.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)
        if required and extra.name not in declared.parameters and extra.name not in renamed_to:
            misfits.append(f"adds required parameter {extra.name}")
    return misfits


def _method_signature(cls: type, name: str) -> inspect.Signature | None:
    """The signature callers see on an instance (self dropped), or None if it has none."""
    try:
        signature = inspect.signature(getattr(cls, name))
    except (TypeError, ValueError):
        return None
    if inspect.isfunction(inspect.getattr_static(cls, name)):  # a plain method: drop self
        return signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


def _abstract(abc: type) -> frozenset[str]:
    """The names `abc` leaves abstract (none for a class that is no ABC)."""
    return frozenset(getattr(abc, "__abstractmethods__", ()))


def _interface_methods(abc: type) -> Iterator[str]:
    """The public and the abstract methods the ABC and its bases declare: SGLang calls them on any backend."""
    seen: set[str] = set()
    for klass in abc.__mro__[:-1]:
        for name, value in vars(klass).items():
            declared = isinstance(value, staticmethod | classmethod | types.FunctionType)
            if declared and name not in seen and (name in _abstract(abc) or not name.startswith("_")):
                seen.add(name)
                yield name


def interface_misfits(cls: type, interface: Interface) -> list[str]:
    """Every way `cls` does not fit `interface` of the installed SGLang."""
    abc = interface.abc()
    misfits = []
    if not issubclass(cls, abc):
        stand_in = next(base for base in cls.__mro__ if base.__name__ == interface.name)
        misfits.append(f"subclasses a stand-in {stand_in.__module__}.{stand_in.__qualname__}, not SGLang's {interface.name}")
    for name in _interface_methods(abc):
        owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
        if owner is None or owner in abc.__mro__ or getattr(getattr(cls, name), "__isabstractmethod__", False):
            if name in _abstract(abc):
                misfits.append(f"missing abstract method {name}")
            continue
        if not callable(getattr(cls, name)):
            misfits.append(f"{name} is not a method")
            continue
        declared, implemented = _method_signature(abc, name), _method_signature(cls, name)
        if declared is not None and implemented is not None:
            misfits += [f"{name}: {why}" for why in parameter_misfits(declared, implemented)]
    positional, by_name = interface.construction
    why = call_misfit(inspect.signature(cls), by_name, positional, caller=f"SGLang's {interface.loader}")
    if why:
        misfits.append(f"constructor: {why}")
    return misfits


def _claimed(cls: type) -> list[Interface]:
    """The interfaces `cls` subclasses, or names a base after (a stand-in for the ABC)."""
    names = {base.__name__ for base in cls.__mro__[1:]}
    return [interface for interface in INTERFACES if issubclass(cls, interface.abc()) or interface.name in names]


def check(cls: type, distribution: str | None = None) -> Verdict:
    """`cls` against every interface it implements or claims, all misfits together."""
    interfaces = _claimed(cls)
    if interfaces:
        misfits = [why for interface in interfaces for why in interface_misfits(cls, interface)]
    else:
        misfits = [f"subclasses none of {', '.join(i.name for i in INTERFACES)}: SGLang's loaders accept only their subclasses"]
    return Verdict(f"{cls.__module__}:{cls.__qualname__}", distribution, tuple(i.name for i in interfaces), tuple(misfits))


def _module_name(path: str) -> str | None:
    """`pkg/mod.py` -> `pkg.mod`, `pkg/__init__.py` -> `pkg`; None for a file outside the import root."""
    if not path.endswith(".py") or path.startswith(".."):
        return None
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) if parts and all(part.isidentifier() for part in parts) else None


def discover() -> Iterator[Verdict]:
    """Check the plugin classes of the installed distributions whose metadata names SGLang.

    Neither public plugin declares an entry point for its class (sglang-kvblockd none,
    sglang-fs-linker only a console script), so a distribution is a candidate by its
    metadata (name, summary, keywords, requirements mention sglang), and a module of it is
    imported only if its source names one of the ABCs. A module that no longer imports is
    a misfit of its distribution (an SGLang name it imports may be gone).
    """
    abc_names = tuple(interface.name for interface in INTERFACES)
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        name = meta["Name"]
        about = " ".join([*(meta.get_all("Summary") or []), *(meta.get_all("Keywords") or []), name, *(dist.requires or [])])
        if name.lower() == "sglang" or "sglang" not in about.lower():
            continue
        for file in dist.files or ():
            module_name = _module_name(str(file))
            if module_name is None:
                continue
            source = Path(str(dist.locate_file(file))).read_text(encoding="utf-8", errors="replace")
            if not any(abc in source for abc in abc_names):
                continue
            try:
                module = importlib.import_module(module_name)
            except Exception as error:  # the plugin's import of SGLang may fail in any way
                yield Verdict(module_name, name, (), (f"does not import ({type(error).__name__}: {error})",))
                continue
            for cls in vars(module).values():
                if inspect.isclass(cls) and cls.__module__ == module_name and cls.__name__ not in abc_names and _claimed(cls):
                    yield check(cls, name)


def load_expected(path: str) -> dict[str, list[str]]:
    """The expected-misfits file: plugin ("module:Class") = [misfits, as `check` words them]."""
    try:
        with open(path, "rb") as file:
            expected = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise BadPlugin(f"expected misfits {path}: {error}") from None
    for plugin, misfits in expected.items():
        if not (isinstance(misfits, list) and all(isinstance(why, str) for why in misfits)):
            raise BadPlugin(f"expected misfits {path}: {plugin} must map to a list of strings")
    return expected


def unexpected(verdict: Verdict, expected: dict[str, list[str]]) -> list[str]:
    """The misfits of `verdict` that the expected-misfits file does not list for its plugin."""
    known = expected.get(verdict.plugin, [])
    return [why for why in verdict.misfits if why not in known]


def _table(verdicts: list[Verdict], expected: dict[str, list[str]]) -> str:
    rows = [("plugin", "distribution", "interface", "verdict")]
    for v in verdicts:
        verdict = "fits" if v.fits else ("misfits (expected)" if not unexpected(v, expected) else "MISFITS")
        rows.append((v.plugin, v.distribution or "(named)", ", ".join(v.interfaces) or "-", verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for v in verdicts:
        lines += [f"  {v.plugin}: {why}{'' if why in expected.get(v.plugin, []) else '  <- unexpected'}" for why in v.misfits]
        lines += [f"  {v.plugin}: no longer occurs: {why}" for why in expected.get(v.plugin, []) if why not in v.misfits]
    return "\n".join(lines)


def _write_junit(path: str, verdicts: list[Verdict], expected: dict[str, list[str]]) -> None:
    failing = [v for v in verdicts if unexpected(v, expected)]
    suite = ElementTree.Element("testsuite", name="sglang-plugin-fit", tests=str(len(verdicts)), failures=str(len(failing)))
    for v in verdicts:
        case = ElementTree.SubElement(suite, "testcase", classname=f"sglang-plugin-fit.{v.distribution or 'named'}", name=v.plugin)
        if v in failing:
            ElementTree.SubElement(case, "failure", message=f"{v.plugin} does not fit this SGLang").text = "\n".join(v.misfits)
        elif v.misfits:
            ElementTree.SubElement(case, "system-out").text = "expected misfits:\n" + "\n".join(v.misfits)
    ElementTree.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE:CLASS", help="a plugin class to check (repeatable)")
    parser.add_argument("--no-discover", action="store_true", help="check only the --plugin classes, not the installed distributions")
    parser.add_argument("--expected", metavar="PATH", help="TOML: plugin = [misfits known on this SGLang]; they do not fail the check")
    parser.add_argument("--junitxml", metavar="PATH", help="write one testcase per plugin")
    args = parser.parse_args(argv)
    from .stack import prepare_imports

    prepare_imports()
    try:
        named = [load(spec) for spec in args.plugin]
        expected = load_expected(args.expected) if args.expected else {}
    except BadPlugin as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    verdicts = [check(cls) for cls in named]
    if not args.no_discover:
        verdicts += [found for found in discover() if found.plugin not in {v.plugin for v in verdicts}]  # named ones once
    print(_table(verdicts, expected) if verdicts else "no plugins to check")
    if args.junitxml:
        _write_junit(args.junitxml, verdicts, expected)
    return EXIT_PLUGIN_MISFIT if any(unexpected(v, expected) for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
