"""`casedb explain` as a command: what it refuses (exit 2, saying what to give), what it keeps in
the DB, and where the explanation shows up after (casedb report, the comment of
`triage update --group`, the Datasette query)."""

from pathlib import Path

import pytest
import yaml

from casedb.read.serve import load_metadata
from tests.conftest import rows, sha256_of

DATA = Path(__file__).parent.parent / "data" / "explain"
FAULTY = DATA / "faulty.py"


@pytest.fixture
def red(cli):
    """A run of the mul cases on the bf16-only faulty backend: one of them fails."""
    assert cli("import", DATA / "cases.yaml").exit_code == 0
    res = cli("run", "--model", "explain-demo", "--op", "torch.mul", "--device", "cpu", "-j", "0", "--no-progress",
              "--no-shipped-triage", "--backend", "explain_dtype", "--import", FAULTY)
    assert res.exit_code == 1, res.stdout
    assert "casedb explain --run 1" in res.stderr + res.stdout  # the summary says how to go on
    return cli


@pytest.mark.slow
def test_what_explain_refuses(red, db_path):
    before = sha256_of(db_path)
    for args, words in [(("--cause", "99"), ["--cause '99'", "1: incorrect result"]),
                        (("--run", "7"), ["no run 7", "recent runs: 1"]),
                        (("--budget", "-1"), ["--budget"]),
                        ((), ["--import", "give it again"])]:  # variants need the run's module, given again
        res = red("explain", *args)
        assert res.exit_code == 2, (args, res.stdout)
        assert all(w in res.stderr for w in words), (args, res.stderr)
    assert sha256_of(db_path) == before  # a refused explain writes nothing


@pytest.mark.slow
def test_the_explanation_is_kept_and_shown(red, db_path, tmp_path):
    out = red.json("explain", "--no-variants")
    (cause,) = out["causes"]
    assert cause["condition"]["feature"] == "dtype" and cause["condition"]["dtype"] == "bfloat16"
    assert cause["condition"]["text"].startswith("fails only when the dtype is bfloat16 (1 of 1 failing, 0 of ")
    assert not cause["confirmed"] and cause["variants_run"] == 0 and out["variants_run"] == 0
    stored = rows(db_path, "SELECT run_id, position, cause FROM explanations")
    assert stored == [{"run_id": 1, "position": 0, "cause": cause["cause"]}]
    report = red.json("report")
    assert report["explanations"][0]["condition"]["text"] == cause["condition"]["text"]
    assert "Explained (casedb explain)" in red("report").stdout
    # triage update --group: the entry's comment says what explain found
    target = tmp_path / "triage.yaml"
    res = red("triage", "update", target, "--from-run", "1", "--group")
    assert res.exit_code == 0, res.stdout + res.stderr
    comment = " ".join(ln.strip().lstrip("#").strip() for ln in target.read_text().splitlines())
    assert "review. casedb explain: fails only when the dtype is bfloat16 (1 of 1 failing" in comment
    # the Datasette page per cause
    sql = load_metadata()["databases"]["casedb"]["queries"]["explained_causes"]["sql"]
    import sqlite3

    con = sqlite3.connect(db_path)
    con.create_function("casedb_latest_run", 0, lambda: 1)
    got = con.execute(sql, {"run": "", "cause": "1"}).fetchall()
    assert len(got) == 1 and "bfloat16" in got[0][5]
    assert yaml.safe_load(target.read_text())


@pytest.mark.slow
def test_run_explain_puts_it_in_the_summary_and_leaves_no_variant_behind(cli, db_path):
    assert cli("import", DATA / "cases.yaml").exit_code == 0
    before = rows(db_path, "SELECT name FROM models ORDER BY name")
    res = cli("run", "--model", "explain-demo", "--op", "torch.mul", "--device", "cpu", "-j", "0", "--no-progress",
              "--no-shipped-triage", "--backend", "explain_dtype", "--import", FAULTY, "--explain", "--json")
    assert res.exit_code == 1
    import json

    summary = json.loads(res.stdout)
    (cause,) = summary["explanations"]
    assert cause["confirmed"] and "confirmed: float32 copies pass" in cause["condition"]["text"]
    assert 0 < cause["variants_run"] <= 64
    # the rounds of variants leave no run, case, occurrence or model behind: only the derived case
    assert [r["id"] for r in rows(db_path, "SELECT id FROM runs")] == [summary["run_id"]]
    assert rows(db_path, "SELECT name FROM models ORDER BY name") == [{"name": "derived"}, *before]
    assert rows(db_path, "SELECT count(*) AS n FROM cases")[0]["n"] == 41
