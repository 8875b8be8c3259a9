"""Plugin interface drift (conformance/adapters/sglang/plugins.py): the two public plugins'
verdicts on the pinned SGLang, and the signature rule on small classes written here: a
plugin may add optional parameters and methods; it may not miss an abstract method, rename
a parameter or make an optional one required, and every misfit of a plugin is reported.
"""

from __future__ import annotations

import inspect
import json
import subprocess
from abc import abstractmethod
from xml.etree import ElementTree

import pytest
from _sglang_env import ADAPTER_DIR, HAVE_SGLANG, REPO, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from conformance.adapters.sglang import plugins

pytestmark = pytest.mark.needs_sglang

KVBLOCKD = "sglang_kvblockd.backend:KvblockdHiCacheStorage"
FS_LINKER = "sglang_fs_linker.linker:FileSystemLinker"
#: Measured 2026-12-02 on SGLang 0.5.23 (sglang-fs-linker 0.1.0 targets an unreleased SGLang
#: revision): 0.5.23 declares finish_layer_wise_loading abstract, passes offload's session_id
#: by keyword, and constructs a linker with forward_stream=.
FS_LINKER_MISFITS = (
    "missing abstract method finish_layer_wise_loading",
    "offload: drops parameter session_id",
    "constructor: no parameter forward_stream",
)


class Storage(HiCacheStorage):
    """Every abstract method of 0.5.23's HiCacheStorage, declared as the ABC declares it."""

    def __init__(self, storage_config, kwargs=None):
        self.storage_config = storage_config

    def get(self, key, target_location=None, target_sizes=None):
        return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        return [None] * len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        return False

    def exists(self, key):
        return False


class AddsOptionalParametersAndMethods(Storage):
    def get(self, key, target_location=None, target_sizes=None, timeout=None):
        return None

    def exists(self, key, *args, strict=False, **kwargs):
        return False

    def batch_exists(self, keys, extra_info=None, stop_at_miss=True):
        return 0

    def warm(self, keys):
        """Not in the ABC: SGLang never calls it, so it cannot misfit."""


class MissesAnAbstractMethod(Storage):
    exists = HiCacheStorage.exists  # the ABC's abstract declaration, as if never written


class RenamesAParameter(Storage):
    def get(self, key, location=None, target_sizes=None):
        return None


class MakesAnOptionalParameterRequired(Storage):
    def batch_get(self, keys, target_locations, target_sizes=None):
        return [None] * len(keys)


class MisfitsThreeWays(MissesAnAbstractMethod, RenamesAParameter, MakesAnOptionalParameterRequired):
    pass


class HiCacheStorageStandIn:
    """What sglang_kvblockd._compat substitutes when SGLang does not import."""


HiCacheStorageStandIn.__name__ = "HiCacheStorage"


class ClaimsTheInterface(HiCacheStorageStandIn):
    def __init__(self, storage_config, kwargs=None):
        pass


def test_public_plugins_are_discovered_with_their_verdicts_on_this_sglang():
    verdicts = {verdict.plugin: verdict for verdict in plugins.discover()}
    assert verdicts[KVBLOCKD] == plugins.Verdict(KVBLOCKD, "sglang-kvblockd", ("HiCacheStorage",), ())  # fits 0.5.23
    assert verdicts[FS_LINKER] == plugins.Verdict(FS_LINKER, "sglang-fs-linker", ("UnifiedCacheLinker",), FS_LINKER_MISFITS)


def test_the_gates_expected_plugin_misfits_are_the_measured_ones():
    expected = plugins.load_expected(str(ADAPTER_DIR / "expected-plugin-misfits.toml"))
    assert expected == {FS_LINKER: list(FS_LINKER_MISFITS)}


@pytest.mark.parametrize("cls", [Storage, AddsOptionalParametersAndMethods])
def test_a_plugin_that_adds_optional_parameters_or_methods_fits(cls):
    assert plugins.check(cls).misfits == ()


@pytest.mark.parametrize(
    ("cls", "misfit"),
    [
        (MissesAnAbstractMethod, "missing abstract method exists"),
        (RenamesAParameter, "get: renames parameter target_location to location"),
        (MakesAnOptionalParameterRequired, "batch_get: makes optional parameter target_locations required"),
    ],
)
def test_each_illegal_variant_is_reported(cls, misfit):
    assert plugins.check(cls).misfits == (misfit,)


def test_every_misfit_of_one_plugin_is_reported_together():
    assert set(plugins.check(MisfitsThreeWays).misfits) == {
        "missing abstract method exists",
        "get: renames parameter target_location to location",
        "batch_get: makes optional parameter target_locations required",
    }


def test_a_stand_in_base_of_the_abcs_name_is_a_misfit_and_still_checked():
    misfits = plugins.check(ClaimsTheInterface).misfits
    assert misfits[0].startswith("subclasses a stand-in ") and misfits[0].endswith(", not SGLang's HiCacheStorage")
    assert {"missing abstract method get", "missing abstract method exists"} <= set(misfits)


@pytest.mark.parametrize(
    ("declared", "implemented", "misfits"),
    [
        ("a, b=None", "a, b=None, c=None, *args, **kwargs", []),
        ("a, b", "b, a", ["moves parameter a from position 1 to 2", "moves parameter b from position 2 to 1"]),
        ("a, b=None", "a", ["drops parameter b"]),
        ("a, b=None", "a, *args, **kwargs", []),
        ("a, b=None", "a, *, b=None", ["makes parameter b keyword-only"]),
        ("a", "a, c", ["adds required parameter c"]),
        ("a, **kwargs", "a", ["drops **kwargs"]),
    ],
)
def test_the_signature_rule(declared, implemented, misfits):
    def signature(parameters: str) -> inspect.Signature:
        namespace: dict = {}
        exec(f"def f({parameters}): pass", namespace)
        return inspect.signature(namespace["f"])

    assert plugins.parameter_misfits(signature(declared), signature(implemented)) == misfits


def test_exit_codes_and_one_junit_case_per_plugin(tmp_path, capsys):
    junit = tmp_path / "plugins.xml"
    fits = f"{__name__}:AddsOptionalParametersAndMethods"
    assert plugins.main(["--no-discover", "--plugin", fits]) == 0
    misfits = f"{__name__}:MisfitsThreeWays"
    assert plugins.main(["--no-discover", "--plugin", fits, "--plugin", misfits, "--junitxml", str(junit)]) == plugins.EXIT_PLUGIN_MISFIT
    cases = {case.get("name"): case.find("failure") for case in ElementTree.parse(junit).getroot()}
    assert cases.keys() == {fits, misfits} and cases[fits] is None and cases[misfits] is not None
    assert len(cases[misfits].text.splitlines()) == 3
    capsys.readouterr()
    assert plugins.main(["--no-discover", "--plugin", "no_such_module:Backend"]) == plugins.EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: plugin no_such_module:Backend: does not import (ModuleNotFoundError: No module named 'no_such_module')\n"


def test_a_newer_sglangs_changed_abc_shows_as_drift_of_a_fitting_plugin(monkeypatch):
    """The ABC is read from the installed SGLang: a new abstract method, or a new keyword its
    callers pass, makes today's fitting kvblockd backend misfit."""
    kvblockd = plugins.load(KVBLOCKD)

    def batch_get_v1(self, keys, host_indices, extra_info=None, layer_range=None):
        return [False] * len(keys)

    monkeypatch.setattr(HiCacheStorage, "batch_get_v1", batch_get_v1)
    monkeypatch.setattr(HiCacheStorage, "evict", abstractmethod(lambda self, keys: None), raising=False)
    monkeypatch.setattr(HiCacheStorage, "__abstractmethods__", HiCacheStorage.__abstractmethods__ | {"evict"})
    assert set(plugins.check(kvblockd).misfits) == {"missing abstract method evict", "batch_get_v1: drops parameter layer_range"}


def test_expected_misfits_do_not_fail_unlisted_ones_do(tmp_path, capsys):
    misfits = f"{__name__}:MisfitsThreeWays"
    expected = tmp_path / "expected.toml"
    listed = ["missing abstract method exists", "get: renames parameter target_location to location"]
    expected.write_text(f'"{misfits}" = {json.dumps(listed)}\n')  # a JSON list of plain strings is TOML
    assert plugins.main(["--no-discover", "--plugin", misfits, "--expected", str(expected)]) == plugins.EXIT_PLUGIN_MISFIT
    assert "batch_get: makes optional parameter target_locations required  <- unexpected" in capsys.readouterr().out
    listed += ["batch_get: makes optional parameter target_locations required", "exists: drops parameter key"]
    expected.write_text(f'"{misfits}" = {json.dumps(listed)}\n')  # a JSON list of plain strings is TOML
    assert plugins.main(["--no-discover", "--plugin", misfits, "--expected", str(expected)]) == 0
    assert f"{misfits}: no longer occurs: exists: drops parameter key" in capsys.readouterr().out


def test_the_gate_names_its_plugin_option():
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gate_sglang.sh"), "--bogus"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "[--plugin MODULE:CLASS]..." in proc.stderr
