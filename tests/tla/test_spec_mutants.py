"""The spec's own mutants (cacheruntime.specmutants): how they are generated, and the CI subset.

The generation tests need no Java. The subset runs TLC on tla/MCMutants.cfg for the mutants
the manifest's `spec_mutants.ci` names and expects each verdict it pins (see tla/README.md for
the seconds it adds; the full table is `cacheruntime tlc --spec-mutants`, a slow command).
"""

from __future__ import annotations

import pytest

from cacheruntime import specmutants, tlc

SPEC = (tlc.TLA_DIR / "CacheRuntime.tla").read_text()
MANIFEST = tlc.load_manifest()
MUTANTS = specmutants.generate(SPEC)
BY_ID = {m.ident: m for m in MUTANTS}


def test_every_action_of_next_has_guard_and_effect_mutants():
    actions = tlc.next_actions(SPEC)
    kinds = {(m.definition, m.kind) for m in MUTANTS}
    for action in actions:
        assert any(d == action for d, _ in kinds), f"{action} has no mutant"
    for name in ("CloseRequest", "Publish", "Split", "Retain", "Release", "Restart", "CancelBatch"):
        assert (name, "guard") in kinds or name == "Restart"
        assert (name, "effect") in kinds


def test_mutants_are_one_conjunct_each_and_apply_cleanly():
    idents = [m.ident for m in MUTANTS]
    assert len(idents) == len(set(idents))
    for m in MUTANTS:
        mutated = m.apply(SPEC)
        assert mutated != SPEC
        assert len(mutated.splitlines()) == len(SPEC.splitlines()) - m.original.count("\n")


def test_guards_become_true_and_effects_leave_their_variable_alone():
    assert BY_ID["CloseRequest.g3"].original == "~InPrepared(h.slotId)"
    assert BY_ID["CloseRequest.g3"].replacement == "TRUE"
    retain = next(m for m in MUTANTS if m.definition == "Retain" and m.kind == "effect")
    assert retain.replacement == "extents' = extents"
    drop = next(m for m in MUTANTS if m.definition == "CloseRequest" and m.original.startswith("DropHolders"))
    assert drop.replacement.startswith("UNCHANGED <<") and "holders" in drop.replacement
    # one-line conjunctions are split into their terms
    assert {BY_ID[f"Publish.g{i}"].original for i in (3, 4, 5)} == {"count >= 1", "first >= 0", "first + count <= numTokens[h.slotId]"}


def test_model_bounds_and_ghosts_are_not_protocol():
    bounds = [m for m in MUTANTS if m.bound]
    assert bounds and all("model bound" in m.comment for m in bounds)
    assert not any("held'" in m.original for m in MUTANTS), "the ghost's updates are not mutated"


def test_the_ci_subset_names_generated_mutants_of_every_kind():
    ci = MANIFEST["spec_mutants"]["ci"]
    assert set(ci) <= set(BY_ID)
    assert {BY_ID[i].kind for i in ci} == {"guard", "effect", "altered"}
    assert all(v.startswith("killed:") for v in ci.values()), "each CI mutant is killed by a named invariant"


def test_a_redundant_verdict_needs_the_same_count_and_a_reason():
    guard = BY_ID["CloseRequest.g3"]
    same = specmutants.Result(guard, "pass", 100, 1.0)
    assert same.verdict(100) == "SURVIVES"  # no reason beside the guard
    reasoned = specmutants.Mutant(**{**guard.__dict__, "comment": "redundant: implied by X"})
    assert specmutants.Result(reasoned, "pass", 100, 1.0).verdict(100) == "redundant"
    assert specmutants.Result(reasoned, "pass", 101, 1.0).verdict(100) == "SURVIVES"
    assert specmutants.Result(guard, "error:Error: TLC threw", None, 1.0).verdict(100) == "error"
    assert specmutants.Result(guard, "violation:H1", 5, 1.0).verdict(100) == "killed"


def test_a_legal_verdict_needs_a_reason_and_a_pass():
    """An effect the contract leaves to the runtime (a new epoch's numbering) is another legal
    runtime: it must pass, with any count; a violation means the spec forbids a legal runtime."""
    numbering = BY_ID["Restart.e9"]
    assert numbering.original == "nextPage' = 0" and numbering.legal
    assert specmutants.Result(numbering, "pass", 7, 1.0).verdict(100) == "legal"
    assert specmutants.Result(numbering, "violation:R1", 7, 1.0).verdict(100) == "REJECTS LEGAL"
    assert BY_ID["Restart.e19"].legal and not BY_ID["Restart.e10"].legal


def test_a_call_that_frames_the_whole_step_keeps_its_frame_when_dropped():
    """FailCompute's only effect is FailBatches, which names what stays UNCHANGED: dropping it
    leaves every variable as it was (a stuttering step), never one unspecified."""
    dropped = BY_ID["FailCompute.e1"]
    assert dropped.original == "FailBatches(bh)"
    assert dropped.replacement.startswith("UNCHANGED <<") and dropped.replacement.endswith(">>")
    assert {"runtimeVars", "memoryVars", "batches", "pages"} <= set(dropped.replacement[len("UNCHANGED <<") : -2].split(", "))


try:
    JAVA, JAR = tlc.find_java(), tlc.find_jar()
except tlc.ToolMissing as missing:  # pragma: no cover - depends on the machine
    JAVA = JAR = None
    WHY = str(missing)


@pytest.mark.skipif(JAVA is None, reason="needs Java and tla2tools.jar")
def test_the_ci_subset_gets_the_pinned_verdicts(capsys):
    code = specmutants.run_cli(MANIFEST, tlc.TLA_DIR, subset="ci", java=JAVA, jar=JAR, workers=1, jobs=1)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "DIFFERS" not in out


def test_the_ci_models_step_every_action_of_next():
    """Together the CI models take every action of Next at least once (TLC's coverage, checked
    by `cacheruntime tlc` for each model's `actions_stepped`)."""
    stepped = set()
    for m in MANIFEST["models"]:
        if m.get("group", "ci") == "ci" and m["expect"] == "pass" and m.get("module", tlc.SPEC) == tlc.SPEC:
            stepped |= set(m.get("actions_stepped", ()))
    assert stepped == set(tlc.next_actions(SPEC))


def test_an_unknown_mutant_name_is_a_one_line_error(capsys):
    code = specmutants.run_cli(MANIFEST, tlc.TLA_DIR, subset="NoSuchAction,Split.g99", java="java", jar=tlc.TLA_DIR, workers=1, jobs=1)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "NoSuchAction" in err and "Split.g99" in err


def test_a_name_selects_a_definitions_mutants():
    split = [m for m in MUTANTS if m.definition == "Split"]
    assert split and all(m.ident.startswith("Split.") for m in split)
    assert MANIFEST["spec_mutants"]["models"]["Split"]["config"] == "MCSplit.cfg"


def test_a_mutant_may_have_a_model_of_its_own():
    """A plan's Backup, Demote or Drop applied at execute is dropped by ExecuteBatch.e2: in
    MCMutants.cfg plans carry Restore only, so it runs where plans carry the others."""
    section = MANIFEST["spec_mutants"]
    configs = {"": tlc.TLA_DIR / section["config"]} | {k: tlc.TLA_DIR / o["config"] for k, o in section["models"].items()}
    assert specmutants.model_of(BY_ID["ExecuteBatch.e2"], configs).name == "MCIntents.cfg"
    assert specmutants.model_of(BY_ID["ExecuteBatch.e1"], configs).name == "MCMutants.cfg"
    assert specmutants.model_of(BY_ID["Split.g4"], configs).name == "MCSplit.cfg"
    # the id's route wins over its definition's: Split.g1 (~lost) needs the failures on
    assert specmutants.model_of(BY_ID["Split.g1"], configs).name == "MCSplitFaults.cfg"


def test_each_mutant_model_exists_and_has_one_pinned_count():
    """A definition or a mutant id may be routed to a model of its own; the run compares each
    model's baseline with one pinned count, so two routes to one model must pin the same."""
    section = MANIFEST["spec_mutants"]
    names = {m.definition for m in MUTANTS} | set(BY_ID)
    pinned: dict[str, set[int]] = {section["config"]: {section["distinct_states"]}}
    for key, o in section["models"].items():
        assert key in names, f"{key} names no definition or mutant"
        assert (tlc.TLA_DIR / o["config"]).is_file(), o["config"]
        pinned.setdefault(o["config"], set()).add(o["distinct_states"])
    assert {c: n for c, n in pinned.items() if len(n) > 1} == {}
