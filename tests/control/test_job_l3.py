"""`cacheruntime run --l3 file:DIR`: a second run serves prefix hits from the store the first one filled (issue 21 item 5)."""

import importlib.util
import json
from typing import ClassVar

import pytest

from cacheruntime.cli import main
from cacheruntime.storage import FaultyStore, FileStore
from cacheruntime.storage.results import Op, Status

SMALL = ("--requests", "8", "--new-tokens", "3", "6")


def run(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    code = main(["run", "--quiet", "--json", str(out), *SMALL, *args])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("mode", ["resident", "buffer_only"])
def test_a_second_run_fetches_what_the_first_persisted(tmp_path, mode):
    store = f"file:{tmp_path / 'l3'}"
    code, first = run(tmp_path, "first", "--l3", store, "--host-mode", mode)
    # Not `first["hit_tokens_l3"] == 0`: a run may fetch what it persisted itself, once L1 and L2
    # dropped it, and whether that happens depends on when its persists land (machine load).
    assert code == 0 and first["output_mismatches"] == 0 and first["persisted_bytes"] > 0
    assert len(list((tmp_path / "l3").rglob("*"))) > 0
    code, second = run(tmp_path, "second", "--l3", store, "--host-mode", mode)
    assert code == 0 and second["output_check"] == "reference_next_token" and second["output_mismatches"] == 0
    assert second["hit_tokens_l3"] > 0 and second["fetched_bytes"] > 0
    assert second["computed_prompt_tokens"] < first["computed_prompt_tokens"]
    assert second["requests"] == first["requests"] and second["tokens"] == first["tokens"]


class RemovedAfterTheHint(FaultyStore):
    """A store shared with another runtime that removes the first object `exists` reported, right after the hint."""

    removed: ClassVar[list[str]] = []  # the key removed, shared by the run's store instances

    def exists(self, keys):
        results = super().exists(keys)
        present = [r.key for r in results if r.status is Status.PRESENT]
        if present and not self.removed:
            self.evict(present[:1])
            self.removed.append(present[0])
        return results


def test_a_fetch_that_misses_falls_back_to_recompute(tmp_path, monkeypatch):
    store = f"file:{tmp_path / 'l3'}"
    assert run(tmp_path, "first", "--l3", store)[0] == 0
    objects = sorted(p for p in (tmp_path / "l3").rglob("*") if p.is_file())
    objects[0].unlink()  # removed between the runs: l3_exists says so, that page is computed
    RemovedAfterTheHint.removed = []
    monkeypatch.setattr("cacheruntime.runtime.l3calls.open_store", lambda spec: RemovedAfterTheHint(FileStore(tmp_path / "l3")))
    code, second = run(tmp_path, "second", "--l3", store)
    assert RemovedAfterTheHint.removed
    assert code == 0 and second["output_mismatches"] == 0 and second["turns_abandoned"] == 0
    assert second["faults_seen"]["failed_fetches"] >= 1 and second["faults_seen"]["compute_failures"] >= 1
    assert second["turns_retried"] >= 1


def test_bad_l3_and_host_mode_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--quiet", "--l3", "nfs:/x"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--l3: expected file:DIR" in line
    with pytest.raises(SystemExit):
        main(["run", "--quiet", "--l3", "mooncake:127.0.0.1:1"])  # no metadata URL
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        main(["run", "--quiet", "--host-mode", "cached"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--host-mode: invalid choice" in line
    assert main(["run", "--quiet", "--host-mode", "buffer_only"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert main(["run", "--quiet", "--runtime", "model", "--l3", f"file:{tmp_path}"]) == 2


needs_mooncake = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None, reason="the [mooncake] extra (mooncake-transfer-engine-non-cuda) is not installed"
)


@needs_mooncake
def test_a_second_run_fetches_from_the_mooncake_cluster_the_first_filled(tmp_path):
    from cacheruntime.storage.master import LocalMooncake

    with LocalMooncake(tmp_path / "mooncake") as cluster:
        store = f"mooncake:{cluster.master_address},{cluster.metadata_url}"
        code, first = run(tmp_path, "first", "--l3", store)
        assert code == 0 and first["output_mismatches"] == 0 and first["persisted_bytes"] > 0  # its own fetches: see above
        code, second = run(tmp_path, "second", "--l3", store)
    assert code == 0 and second["output_mismatches"] == 0
    assert second["hit_tokens_l3"] > 0 and second["fetched_bytes"] > 0
    assert second["computed_prompt_tokens"] < first["computed_prompt_tokens"]


@needs_mooncake
def test_mooncake_for_the_run_serves_what_l1_dropped(tmp_path):
    """`--l3 mooncake` starts a cluster for the run (its objects end with it): in buffer_only mode
    with a small L1, nodes the tree released are fetched back from the store by later turns."""
    code, summary = run(tmp_path, "mooncake", "--l3", "mooncake", "--host-mode", "buffer_only", "--l1-pages", "24")
    assert code == 0 and summary["output_mismatches"] == 0
    assert summary["persisted_bytes"] > 0 and summary["hit_tokens_l3"] > 0 and summary["fetched_bytes"] > 0


def test_store_failures_lose_nothing_and_the_run_recomputes(tmp_path, monkeypatch):
    """A store whose first write and first read fail in each run (STORE): the persist is
    reported failed, the fetch's batch fails and its turn recomputes; every token still
    equals recomputation."""
    store = f"file:{tmp_path / 'l3'}"

    def failing(spec):
        faulty = FaultyStore(FileStore(tmp_path / "l3"))
        faulty.fail_nth(Op.PUT, 1)
        faulty.fail_nth(Op.GET, 1)
        return faulty

    monkeypatch.setattr("cacheruntime.runtime.l3calls.open_store", failing)
    code, first = run(tmp_path, "first", "--l3", store)
    assert code == 0 and first["output_mismatches"] == 0 and first["faults_seen"]["failed_persists"] == 1
    code, second = run(tmp_path, "second", "--l3", store)
    assert code == 0 and second["output_mismatches"] == 0 and second["turns_abandoned"] == 0
    assert second["faults_seen"]["failed_fetches"] == 1 and second["faults_seen"]["compute_failures"] >= 1
    assert second["hit_tokens_l3"] > 0
