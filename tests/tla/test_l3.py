"""The L3 tier's TLA+ module (tla/CacheRuntimeL3.tla, spec/protocol.md §9): TLC runs its manifest
models, the pass models pinned and stepping every action of its Next, the mutants failing on the
invariant each names (staging reused before the store write, a store failure that drops the L1
copy, a missing object fetched as a hit). Needs Java and tla2tools.jar, as test_tlc.py; about 35
seconds on 2 cores.
"""

from __future__ import annotations

import re

import pytest

from cacheruntime import tlc

try:
    JAVA, JAR = tlc.find_java(), tlc.find_jar()
except tlc.ToolMissing as missing:  # pragma: no cover - depends on the machine
    pytest.skip(str(missing), allow_module_level=True)

MODULE = "CacheRuntimeL3.tla"
MODELS = [m for m in tlc.load_manifest()["models"] if m.get("module") == MODULE]
SPEC = (tlc.TLA_DIR / MODULE).read_text()


@pytest.mark.parametrize("model", MODELS, ids=[m["name"] for m in MODELS])
def test_l3_model(model):
    outcome = tlc.run_model(model, workers=2, java=JAVA, jar=JAR)
    assert outcome.ok, tlc.format_table([outcome])
    if model["expect"] == "violation":
        assert outcome.exit_code == 12


def test_the_l3_models_step_every_action_and_check_every_l3_id():
    passing = [m for m in MODELS if m["expect"] == "pass"]
    assert {m["group"] for m in MODELS} == {"ci"} and all(m["distinct_states"] and m["depth"] for m in passing)
    stepped = {name for m in passing for name in m["actions_stepped"]}
    assert stepped == set(tlc.next_actions(SPEC))
    modes = set()
    for m in passing:
        text = (tlc.TLA_DIR / m["config"]).read_text()
        modes |= set(re.findall(r'HostMode = "(\w+)"', text))
        assert "Faults = TRUE" in text
        assert {"S1", "S2", "S3", "R1", "O3", "D1", "F1"} <= set(re.findall(r"^INVARIANT (\w+)$", text, re.MULTILINE))
    assert modes == {"resident", "buffer_only"}
    assert {m["invariant"] for m in MODELS if m["expect"] == "violation"} == {"S2", "F1", "S3"}
