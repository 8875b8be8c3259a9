"""The SharedGPURuntime design test (issue 20): TLC runs its manifest models, and its variants differ
from the shared model only where the finding says.

`tla/SharedGPURuntime.tla` models two control clients driving one runtime. `shared` (handles carry
the client id) must pass every invariant; `shared-anonymous` (handles as they are) must pass the
runtime-wide ones; each cross-client property must fail in an anonymous variant that is the shared
model with `ClientIds = FALSE` and nothing else changed, so the failure is the missing client id's.
Needs Java and tla2tools.jar, as test_tlc.py; about a minute on 2 cores.
"""

from __future__ import annotations

import re

import pytest

from cacheruntime import tlc

try:
    JAVA, JAR = tlc.find_java(), tlc.find_jar()
except tlc.ToolMissing as missing:  # pragma: no cover - depends on the machine
    pytest.skip(str(missing), allow_module_level=True)

MODULE = "SharedGPURuntime.tla"
MODELS = [m for m in tlc.load_manifest()["models"] if m.get("module") == MODULE]
BY_NAME = {m["name"]: m for m in MODELS}
#: the properties across clients, which only handles with a client id keep
CROSS_CLIENT = {"H1_ForeignHandle", "OwnRequests", "OwnReferences", "ReadsGranted"}


def _config(name: str) -> tuple[dict[str, str], set[str], str | None]:
    """(constants, invariants and properties, VIEW) of a manifest model's config."""
    text = (tlc.TLA_DIR / BY_NAME[name]["config"]).read_text()
    constants = dict(re.findall(r"^    (\w+) = (.+)$", text, re.MULTILINE))
    checked = set(re.findall(r"^(?:INVARIANT|PROPERTY) (\w+)$", text, re.MULTILINE))
    view = re.search(r"^VIEW (\w+)$", text, re.MULTILINE)
    return constants, checked, view.group(1) if view else None


@pytest.mark.parametrize("model", MODELS, ids=[m["name"] for m in MODELS])
def test_shared_model(model):
    outcome = tlc.run_model(model, workers=2, java=JAVA, jar=JAR)
    assert outcome.ok, tlc.format_table([outcome])
    if model["expect"] == "violation":
        assert outcome.exit_code == 12


def test_the_shared_model_checks_every_property_with_client_ids():
    constants, checked, view = _config("shared")
    assert constants["ClientIds"] == "TRUE" and constants["Clients"] == '{"A", "B"}'
    assert {"H1", "H2", "H3", "R1", "R2", "R3", "R4", "O1", "O3"} | CROSS_CLIENT <= checked
    assert view is None, "the cross-client properties read the ghost state a view would merge"


def test_the_anonymous_model_checks_the_runtime_wide_invariants_only():
    shared_constants, shared_checked, _ = _config("shared")
    constants, checked, view = _config("shared-anonymous")
    assert constants == {**shared_constants, "ClientIds": "FALSE", "MaxEpoch": "1"}, "the same clients and bounds, and a restart"
    assert checked == shared_checked - CROSS_CLIENT
    assert view == "RuntimeView"


def test_each_cross_client_property_fails_for_want_of_a_client_id_alone():
    shared_constants, shared_checked, _ = _config("shared")
    failing = {m["invariant"]: m for m in MODELS if m["expect"] == "violation" and "mutations" not in m}
    assert set(failing) == CROSS_CLIENT - {"H1_ForeignHandle"}
    for prop, model in failing.items():
        constants, checked, view = _config(model["name"])
        assert constants == {**shared_constants, "ClientIds": "FALSE"}, model["name"]
        assert checked == {"TypeOK", prop} and prop in shared_checked and view is None


def test_the_mutants_break_the_shared_model_across_clients():
    mutants = [m for m in MODELS if m.get("mutations")]
    assert {m["invariant"] for m in mutants} >= {"O1", "OwnReferences"}
    assert all(m["config"] == BY_NAME["shared"]["config"] for m in mutants)
