"""Triage scoped to the backend (issue 28): `triage update` names the run's device and backend, so
a run of another backend reads nothing of its entries; a known failure's pass names the target it
was measured on; every run says which triage files it loaded and how; `-o - --json` is one JSON
object."""

import json

import pytest

from casedb import triage
from tests import runs_data
from tests.triage.test_triage_run import FAULTY, TINY  # (a backend that cannot lower mul, rsqrt off by one)

pytest_plugins = ("pytester",)
RUN = ("run", "--model", "tiny", "--device", "cpu", "-j", "0", "--no-progress")
EAGER = {"device": "cpu", "backend": "eager", "arch": None}
INDUCTOR = {"device": "cpu", "backend": "inductor", "arch": None}


@pytest.fixture
def runs_db(cli, tmp_path, db_path):
    runs_data.import_manifests(cli, tmp_path)
    return db_path


def flat(text: str) -> str:
    return " ".join(text.split())


def test_update_scopes_new_entries_to_the_runs_device_and_backend(cli, runs_db, tmp_path):
    run = runs_data.record_run(runs_db, {("model_a", "a_mul"): ("failed", 0.25), ("model_b", "b_rsqrt"): ("passed", 1e-5)})
    path = tmp_path / "t.yaml"
    assert cli("triage", "update", "--with-passing", "--from-run", run, path).exit_code == 0
    t = triage.load([path])
    assert [(e.selectors, e.status) for e in t.entries] == [
        ({"model": "model_a", "name": "a_mul", "device": "cpu", "backend": "inductor"}, "known_failure"),
        ({"op": "torch.rsqrt", "device": "cpu", "backend": "inductor"}, "expected_pass")]
    occ = {o["name"]: o for o in triage.occurrences(runs_db)}
    assert t.entry_for(occ["a_mul"], INDUCTOR) is t.entries[0]
    assert t.entry_for(occ["a_mul"], EAGER) is None and t.entry_for(occ["b_rsqrt"], EAGER) is None
    # --scope device: the device's every backend, as before
    wide = tmp_path / "wide.yaml"
    assert cli("triage", "update", "--with-passing", "--from-run", run, wide, "--scope", "device").exit_code == 0
    assert triage.load([wide]).entry_for(occ["a_mul"], EAGER).status == "known_failure"


def test_a_known_failures_pass_names_the_target_and_cautions_an_entry_naming_no_backend(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("cases:\n  - {op: torch.mul, device: cpu, status: known_failure}\n"
                    "  - {op: torch.add, device: cpu, backend: eager, status: known_failure}\n")
    mul, add = triage.load([path]).entries
    hint = triage.verdict(mul, "passed", target=EAGER)["hint"]
    assert hint == (f"passes now on cpu/eager: remove the known_failure entry at {path}:2 (`casedb triage update "
                    "--from-run RUN` does); it names no backend: if it was written for a backend other than eager, "
                    "scope it (backend: NAME) instead")
    assert triage.verdict(add, "passed", target=EAGER)["hint"] == (
        f"passes now on cpu/eager: remove the known_failure entry at {path}:3 (`casedb triage update --from-run RUN` does)")


def test_update_json_with_output_to_stdout_is_one_object_holding_the_text(cli, runs_db, tmp_path):
    run = runs_data.record_run(runs_db, {("model_a", "a_mul"): ("failed", 0.25)})
    path = tmp_path / "t.yaml"
    res = cli("triage", "update", "--with-passing", "--from-run", run, path, "-o", "-", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # (the YAML is not printed beside it)
    prop = triage.propose(runs_db, run, path, with_passing=True)
    assert out == {**prop.to_dict(), "written": None, "text": prop.text}
    assert [a["name"] for a in out["added"]] == ["a_mul"] and out["text"].startswith("version: 1\ncases:\n")
    assert not path.exists()
    # written to a file: the JSON says where, and holds no text
    res = cli("triage", "update", "--with-passing", "--from-run", run, path, "--json")
    assert json.loads(res.stdout) == {**prop.to_dict(), "written": str(path)} and path.read_text() == prop.text


@pytest.mark.slow
def test_a_run_says_which_triage_files_it_loaded_and_how(cli, tmp_path, db_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(TINY)
    assert cli("import", tmp_path / "tiny.yaml").exit_code == 0
    monkeypatch.chdir(tmp_path)
    first = cli(*RUN, *FAULTY, "--json")
    assert first.exit_code == 1
    (tmp_path / "triage").mkdir()
    assert cli("triage", "update", "--with-passing", "--from-run", json.loads(first.stdout)["run_id"]).exit_code == 0
    mine = tmp_path / "triage" / "triage.yaml"
    # eager on the cpu, the faulty backend's file found in ./triage: said so, and nothing read of it
    eager = cli(*RUN, "--backend", "eager")
    assert eager.exit_code == 0, eager.output
    note = flat(eager.stderr)
    assert "triage files loaded: triage/triage.yaml (loaded implicitly from ./triage: --triage FILE chooses)" in note
    assert "(shipped; --no-shipped-triage leaves it out)" in note
    assert "xpass" not in note and "pass now" not in note
    # named with --triage: loaded, not implicitly
    named = cli(*RUN, "--backend", "eager", "--triage", mine, "--no-shipped-triage", "--json")
    s = json.loads(named.stdout)
    assert (s["triage_files"], s["triage_implicit"], s["xpassed"], s["triage"]["remove"]) == (
        [str(mine.resolve())], [], 0, 0)
    # the faulty backend's own rerun reads it: its failure is known
    assert cli(*RUN, *FAULTY).exit_code == 0


@pytest.mark.slow
def test_the_pytest_front_end_says_which_triage_files_it_loaded(pytester, cli, tmp_path, db_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(TINY)
    assert cli("import", tmp_path / "tiny.yaml").exit_code == 0
    (pytester.path / "triage").mkdir()
    (pytester.path / "triage" / "t.yaml").write_text(
        "version: 1\ncases:\n  - {op: torch.mul, device: cpu, backend: casedb_test_faulty, status: known_failure}\n")
    monkeypatch.setenv("CASEDB_DB", str(db_path))
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb="from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    res = pytester.runpytest_subprocess("--casedb-model", "tiny", "--casedb-device", "cpu", "--compile-backend", "eager",
                                        "-m", "")
    res.assert_outcomes(passed=4)  # another backend's entry: nothing read of it
    res.stdout.fnmatch_lines(["casedb: triage files loaded: triage/t.yaml (loaded implicitly from ./triage*"])
