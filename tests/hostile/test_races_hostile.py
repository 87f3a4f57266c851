"""Races and odd values (issue 24, item 9): `import --replace` during a run, a triage timeout no
timer can hold, `serve` on a rollback-journal database, malformed RFC configs for `triage import`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from tests import runs_data
from tests.helpers import rows
from tests.hostile.bounded import snapshot

pytestmark = pytest.mark.timeout(300)

CPU = ("--backend", "eager", "--device", "cpu")


def naps(n: int, seconds: float) -> str:
    cases = "\n".join(f"  - name: nap{i}\n    op: torch.ops.casedb_test.sleep\n    inputs:\n"
                      f"      - tensor: {{shape: [{i + 1}, 64]}}\n      - value: {seconds}" for i in range(n))
    return f"model: naps\ndefault: {{dtype: fp16}}\ncases:\n{cases}\n"


def _results(db) -> int:
    try:
        return rows(db, "SELECT count(*) AS n FROM results")[0]["n"]
    except sqlite3.OperationalError:
        return 0


@pytest.mark.slow
def test_import_replace_during_a_run_leaves_the_run_whole(cli, db_path, tmp_path, data_dir):
    manifest = tmp_path / "naps.yaml"
    manifest.write_text(naps(8, 0.5), encoding="utf-8")
    assert cli("import", manifest).exit_code == 0
    cmd = [sys.executable, "-m", "casedb", "--db", str(db_path), "run", *CPU, "-j", "0", "--import",
           str(data_dir / "custom_ops.py"), "--no-progress", "-m", "", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _results(db_path) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # the run has planned all eight; the manifest now keeps two of them
        manifest.write_text(naps(2, 0.5), encoding="utf-8")
        report = cli.json("import", "--replace", manifest)
        assert (report["retired"], report["removed"]) == (6, 0)  # a run is in progress: nothing deleted
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert "INTERNALERROR" not in err, err[-3000:]
    summary = json.loads(out)
    assert (summary["status"], summary["executed"], summary["passed"], proc.returncode) == ("finished", 8, 8, 0)
    assert rows(db_path, "SELECT count(*) AS n FROM judgements WHERE model_case_id IS NULL") == [{"n": 0}]
    # retired, not listed or planned again
    assert [r["name"] for r in cli.json("cases")] == ["nap0", "nap1"]


def test_the_recorder_keeps_a_judgement_whose_occurrence_was_deleted_under_it(cli, db_path, tmp_path):
    """`pytest --casedb-model` plans before it records its run: an occurrence deleted in that
    window is recorded without its link, and the session goes on."""
    from casedb.store import recorder, run_lifecycle
    from tests.helpers import store_conn
    from casedb.run.plan import build_plan
    from casedb.store.database import Store

    manifest = tmp_path / "naps.yaml"
    manifest.write_text(naps(2, 0.0), encoding="utf-8")
    assert cli("import", manifest).exit_code == 0
    with Store(db_path) as store:
        item = build_plan(store, ["naps"], dedupe=False)[1]
    mcid = item.occurrences[0].model_case_id
    con = sqlite3.connect(db_path)
    con.execute("DELETE FROM model_cases WHERE id = ?", [mcid])
    con.commit()
    con.close()
    conn = store_conn(db_path)
    try:
        run_id = run_lifecycle.start_run(conn, selection={}, args=[], device="cpu", backend="eager")
        payload = {"result": {"outcome": "passed"}, "judgements": [
            {"model_case_id": mcid, "model": "naps", "outcome": "passed", "reason": None, "rtol": None, "atol": None}]}
        assert recorder.Recorder(conn, run_id).record(item, payload) is True
    finally:
        conn.close()
    assert rows(db_path, "SELECT model_case_id, model, signature, outcome FROM judgements") == [
        {"model_case_id": None, "model": "naps", "signature": item.signature, "outcome": "passed"}]
    assert rows(db_path, "SELECT model_case_id, outcome FROM results") == [{"model_case_id": None, "outcome": "passed"}]


def test_a_triage_timeout_no_timer_can_hold_is_refused_before_the_run(cli, db_path, tmp_path, data_dir):
    manifest = tmp_path / "naps.yaml"
    manifest.write_text(naps(1, 0.0), encoding="utf-8")
    assert cli("import", manifest).exit_code == 0
    triage = tmp_path / "triage.yaml"
    triage.write_text("version: 1\ncases:\n  - model: naps\n    status: expected_pass\n    timeout: 1e30\n")
    res = cli("run", *CPU, "-j", "0", "--import", data_dir / "custom_ops.py", "--triage", triage, "-m", "")
    said = " ".join(res.stderr.split())
    assert res.exit_code == 2 and f"{triage}:5: timeout: takes a number > 0 and at most 604800, not" in said, said
    assert "INTERNALERROR" not in res.output
    assert rows(db_path, "SELECT count(*) AS n FROM runs") == [{"n": 0}]
    check = cli("triage", "check", triage, "--no-db")
    assert check.exit_code == 2 and f"{triage}:5: timeout" in check.stderr


def test_serve_leaves_a_rollback_journal_database_as_it_was(cli, tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    db = folder / "cases.db"
    runs_data.two_runs(lambda *a: cli(*a, db=db), tmp_path, db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    con.close()
    before = snapshot(folder)
    with runs_data.Server(db, tmp_path / "serve.log") as server:
        assert [r["name"] for r in server.json("/casedb/models.json?_shape=array&_col=name")] == ["model_a", "model_b"]
    assert snapshot(folder) == before
    assert rows(db, "PRAGMA journal_mode") == [{"journal_mode": "delete"}]


# ------------------------------------------------------------------------ triage import (RFC)

CONFIG = """\
test_suite_config:
  global:
    supported_dtypes:
      - name: float16
        precision: {{atol: 5e-3, rtol: 5e-3}}
  files:
    - path: tests/test_model_ops.py
      unlisted_test_mode: skip
      tests:
        - names: [TestModelOps::test_model_ops_db]
          mode: mandatory_success
          tags: [model__granite4h]
{extra}"""

MALFORMED = {
    # name: (the config text, what the refusal says, its line)
    "global a list": (CONFIG.format(extra="").replace("  global:\n", "  global: [1]\n  unused:\n"),
                      "global: takes a mapping, not '[1]'", 2),
    "NaN precision": (CONFIG.format(extra="").replace("rtol: 5e-3", "rtol: .nan"),
                      "precision: rtol: takes a number >= 0, not nan", 4),
    "negative precision": (CONFIG.format(extra="").replace("atol: 5e-3", "atol: -1.0e-3"),
                           "precision: atol: takes a number >= 0, not -0.001", 4),
    "a mode that is a list": (CONFIG.format(extra="").replace("mode: mandatory_success", "mode: [xfail]"),
                              "mode: takes text, not \"['xfail']\"", 10),
    "tests a number": (CONFIG.format(extra="").split("      tests:")[0] + "      tests: 5\n", "tests: takes a list, not '5'", 7),
    "an op name that is a list": ("test_suite_config:\n  global:\n    supported_ops:\n      - name: [add]\n"
                                  "        force_xfail: true\n", "supported_ops: name: takes text, not \"['add']\"", 4),
    "edits.ops.exclude a number": (CONFIG.format(extra="          edits: {ops: {exclude: 3}}\n"),
                                   "ops: exclude: takes a list, not '3'", 10),
    "a control character in a tag": (CONFIG.format(extra="").replace("model__granite4h", '"model__gran\\eite4h"'),
                                     "holds a control character or line break", 10),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_triage_import_refuses_a_malformed_rfc_config_naming_file_and_line(name, cli, tmp_path):
    text, said, line = MALFORMED[name]
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "triage.yaml"
    res = cli("triage", "import", path, "-o", out)
    assert res.exit_code == 2, res.output
    assert f"{path}:{line}: " in res.stderr and said in " ".join(res.stderr.split()), res.stderr
    assert not out.exists()


def test_a_file_name_cannot_inject_yaml_into_an_imported_triage_file(cli, tmp_path):
    path = tmp_path / "skip\ndefaults: {unlisted: exclude}\n#.yaml"
    path.write_text("skip:\n  - models/granite4-h/test_mul_1.py\n", encoding="utf-8")
    out = tmp_path / "triage.yaml"
    assert cli("triage", "import", path, "-o", out).exit_code == 0
    doc = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert set(doc) == {"version", "cases"}
    assert doc["cases"] == [{"model": "granite4-h", "name": "mul_1", "status": "not_supported",
                             "reason": "listed under skip in skip\ndefaults: {unlisted: exclude}\n#.yaml"}]
    assert cli("triage", "check", out, "--no-db").exit_code == 0
