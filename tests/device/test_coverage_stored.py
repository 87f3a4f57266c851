"""A stored `casedb coverage` shown beside the pass rates of a run on the same target: in `casedb
report` (text and --json) and in a real `casedb serve` (issue 45)."""

import sqlite3
import urllib.parse

import pytest

from device_helpers import TESTDEV, as_json, casedb, run_on_testdev
from tests import runs_data

pytestmark = pytest.mark.slow
NO_NONZERO = {"TESTDEV_MISSING": "aten::nonzero"}


@pytest.fixture
def measured(small_db):
    """small.yaml with a stored coverage of the test device without nonzero, and a run agreeing."""
    cov = as_json(casedb(small_db, "coverage", "--device", "testdev", "--import", TESTDEV, "--json", env=NO_NONZERO))
    run = as_json(run_on_testdev(small_db, env=NO_NONZERO))
    return small_db, cov, run


def test_stored_coverage_in_report_json_and_text(measured):
    db, cov, run = measured
    assert cov["coverage_id"] == 1
    report = as_json(casedb(db, "report", "--json"))
    got = report["coverage"]
    assert (got["id"], got["device"], got["backend"], got["dispatch_key"]) == (1, "testdev", "eager", "PrivateUse1")
    [row] = got["models"]
    assert row | {"pass_rate": None} == {
        "model": "devsmall", "cases": 7, "traced": 6, "untraced": 1, "enabled_cases": 5, "enabled_cases_pct": 83.3,
        "ops": 6, "enabled_ops": 5, "enabled_ops_pct": 83.3, "aten_ops": 6, "enabled_aten_ops": 5,
        "enabled_aten_ops_pct": 83.3, "pass_rate": None, "executed": 7, "passed": 5}
    assert row["pass_rate"] == report["models"][0]["pass_rate"]  # beside the run's own figure
    assert got["totals"]["enabled_cases"] == 5
    assert got["missing"] == [{"kernel": "aten::nonzero", "cases": 1, "unblocks": 1, "models": ["devsmall"],
                               "ops": ["torch.Tensor.nonzero"]}]
    a = got["against_run"]
    assert (a["run"], a["compared"], a["agree"], a["disagree"]) == (run["run_id"], 6, 6, [])

    text = casedb(db, "report").stdout
    assert "Coverage predicted for testdev/eager (casedb coverage 1," in text
    assert "devsmall\t71.4%\t5/6 (83.3%)\t5/6 (83.3%)\t5/6 (83.3%)\t1" in text
    assert "this run agrees on 6/6 cases (100.0%)" in text
    assert "aten::nonzero\t1\t1\tdevsmall\ttorch.Tensor.nonzero" in text


def test_coverage_of_another_target_or_not_saved_is_not_shown(small_db):
    assert as_json(casedb(small_db, "coverage", "--device", "testdev", "--import", TESTDEV, "--no-save",
                          "--json"))["coverage_id"] is None
    as_json(casedb(small_db, "coverage", "--device", "cpu", "--json"))  # stored, for cpu/eager
    run_on_testdev(small_db)
    assert as_json(casedb(small_db, "report", "--json"))["coverage"] is None
    con = sqlite3.connect(small_db)
    assert con.execute("SELECT id, device, backend FROM coverages").fetchall() == [(1, "cpu", "eager")]
    con.close()


def test_a_wrong_prediction_is_listed_as_disagreeing(small_db):
    casedb(small_db, "coverage", "--device", "testdev", "--import", TESTDEV)  # every kernel there
    run_on_testdev(small_db, env=NO_NONZERO)  # the run's device lacks nonzero
    a = as_json(casedb(small_db, "report", "--json"))["coverage"]["against_run"]
    assert (a["compared"], a["agree"]) == (6, 5)
    assert [(d["op"], d["predicted_missing"], d["run_missing"]) for d in a["disagree"]] == [
        ("torch.Tensor.nonzero", [], "aten::nonzero")]
    assert "Coverage against this run: cases that disagree" in casedb(small_db, "report").stdout


def test_stored_coverage_in_datasette(measured, tmp_path):
    db, cov, run = measured

    def canned(server, name, **params):
        return server.json(f"/casedb/{name}.json?" + urllib.parse.urlencode({**params, "_shape": "array"}))

    with runs_data.Server(db, tmp_path / "serve.log") as server:
        [rate] = canned(server, "pass_rate_by_model")
        assert (rate["model"], rate["pass_rate"], rate["enabled_cases_pct"], rate["enabled_ops_pct"],
                rate["enabled_aten_ops_pct"], rate["coverage_id"]) == ("devsmall", 71.43, 83.3, 83.3, 83.3, 1)
        [kernel] = canned(server, "missing_kernels")
        assert (kernel["kernel"], kernel["cases"], kernel["unblocks"], kernel["device"]) == (
            "aten::nonzero", 1, 1, "testdev")
        [blocked] = canned(server, "blocked_cases")
        assert (blocked["op"], blocked["missing"]) == ("torch.Tensor.nonzero", '["aten::nonzero"]')
        assert canned(server, "blocked_cases", kernel="aten::eq") == []
        [view] = server.json("/casedb/target_coverage.json?_shape=array")
        assert (view["device"], view["model"], view["enabled_cases"], view["traced"]) == ("testdev", "devsmall", 5, 6)


def test_a_stored_coverage_edited_by_hand_reads_as_nothing_known(tmp_path):
    """Lists of a stored coverage that are not JSON lists (a file edited by hand) read as empty: the
    report still comes, nothing in them is taken for a kernel or a model."""
    import json

    db = tmp_path / "cases.db"
    cli = runs_data.make_cli(db)
    runs_data.import_manifests(cli, tmp_path)
    runs_data.record_run(db, runs_data.RUN1, backend="eager")
    done = cli("coverage", "--device", "cpu", "--json")
    assert done.exit_code == 0, done.output
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE coverage_cases SET enabled = 0, missing = '{not json', models = '[1, {\"a\": 2}]'")
        con.execute("INSERT INTO coverage_missing (coverage_id, rank, kernel, cases, unblocks, models, ops)"
                    " VALUES (1, 1, 'aten::x', 3, 1, '\"a string\"', NULL)")
        con.execute("UPDATE coverages SET selection = '[]', software = 'nope'")
    con.close()
    done = cli("report", "--json")
    assert done.exit_code == 0, done.output
    got = json.loads(done.output)["coverage"]
    assert got["missing"] == [{"kernel": "aten::x", "cases": 3, "unblocks": 1, "models": [], "ops": []}]
    assert got["selection"] == {} and got["against_run"]["compared"] == 5
    assert all(d["predicted_missing"] == [] for d in got["against_run"]["disagree"])
    text = cli("report")
    assert text.exit_code == 0 and "aten::x\t3\t1\t\t" in text.output
