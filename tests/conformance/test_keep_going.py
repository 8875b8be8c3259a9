"""A known violation never hides a new one: checks keep going, and expected entries name signatures.

K is a runtime bug the team knows (a stale generation accepted), N a new one (a double
free). With K's signatures expected, the runtime with K alone passes the gate and the
runtime with K and N fails it, naming N's violation as new.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from cacheruntime.cli import main
from cacheruntime.conformance.expected import Expected, load
from cacheruntime.conformance.mutants.local import DoubleFree, StaleGenerationAccepted
from cacheruntime.conformance.profiles import profile
from cacheruntime.conformance.runner import run_check
from cacheruntime.conformance.target import Target

K = "cacheruntime.conformance.mutants:build"


class KAndN(StaleGenerationAccepted):
    """Both bugs: the stale-generation ledger and the double-free ledger in one."""

    parts: ClassVar[dict[str, Any]] = {
        "ledger_class": type("KAndNLedger", (StaleGenerationAccepted.parts["ledger_class"], DoubleFree.parts["ledger_class"]), {})
    }


def k_and_n(**options):
    return KAndN(**options)


def _expected_file(path, signatures) -> None:
    path.write_text("".join(f'[[expected]]\nsignature = "{s}"\nreason = "known: K"\n\n' for s in signatures))


def test_known_bug_passes_and_a_new_one_fails_the_gate(tmp_path, capsys):
    settings = profile("ci", shrink=False)
    known = run_check(Target(K, (("name", "local.stale_generation_accepted"),)), "core", settings)
    assert known.status == "failed" and all(v.signature.ids == ("H1",) for v in known.violations)
    expected = tmp_path / "expected.toml"
    _expected_file(expected, [str(v.signature) for v in known.violations])
    entries = load(expected)
    assert entries == tuple(Expected(str(v.signature), "known: K") for v in known.violations)

    k_only = ["conformance", "--runtime", K, "--option", "name=local.stale_generation_accepted", "--check", "core", "--no-shrink"]
    assert main([*k_only, "--expected", str(expected)]) == 0
    assert "OK: 0 new violation(s)" in capsys.readouterr().out

    both = ["conformance", "--runtime", "test_keep_going:k_and_n", "--check", "core", "--no-shrink", "--expected", str(expected)]
    assert main(both) == 1
    out = capsys.readouterr().out
    new = re.findall(r"^  NEW\s+(.*)$", out, flags=re.M)
    assert new and any(re.match(r"(R1|R4|R2)\b", signature) for signature in new), out[-3000:]  # with K expected, N is still reported


def test_an_entry_that_names_only_an_id_is_refused(tmp_path):
    path = tmp_path / "expected.toml"
    path.write_text('[[expected]]\nid = "H1"\nreason = "too broad"\n')
    try:
        load(path)
    except ValueError as error:
        assert "signature" in str(error)
    else:
        raise AssertionError("an id-only entry was accepted")
