"""One selector engine (issue 25): tolerance rules and triage entries select and rank alike, and a
run is looked up one way (casedb.store.run_rows) by triage, the report and the history itself."""

from __future__ import annotations

import sqlite3

import pytest
import sqlite_utils

from casedb import triage
from casedb.errors import NotFound
from casedb.judge.numerics import Policy, Rule, Tolerance
from casedb.store import run_lifecycle, run_rows
from tests.helpers import store_conn
from casedb.store.database import open_store


def occ(name: str) -> dict:
    return {"name": name, "model": "m", "rtol": None, "atol": None, "defaults": {}}


CASE = {"op": "torch.add", "signature": "ab12"}


def test_a_literal_name_carries_its_entry_tolerance_to_exactly_that_case(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text('version: 1\ncases:\n  - {model: m, name: "=x[0]", status: expected_pass, rtol: 0.5}\n',
                    encoding="utf-8")
    policy = Policy(triage.load([path]).rules(), device="cpu", backend="eager")
    assert policy.tolerance(occ("x[0]"), CASE, "float32") == Tolerance(
        0.5, 1e-5, f"rtol: rule {path}:3 (name==x[0], model=m); atol: the float32 default", explicit=True)
    # `=` makes it exact: the bracket is no character set, and no other name is selected
    assert policy.tolerance(occ("x0"), CASE, "float32") == Tolerance(1.3e-6, 1e-5, "the float32 default")


def test_a_literal_rule_is_exact_so_it_beats_a_wildcard_for_the_same_name():
    literal = Rule(rtol=0.1, name="=a*", where="literal", order=1)
    wildcard = Rule(rtol=0.2, name="a*", where="wildcard", order=2)   # later, so it wins a tie
    got = Policy([literal, wildcard]).tolerance(occ("a*"), CASE, "float32")
    assert (got.rtol, got.source) == (0.1, "rtol: rule literal (name==a*); atol: the float32 default")
    assert Policy([literal, wildcard]).tolerance(occ("ab"), CASE, "float32").rtol == 0.2


def test_a_rule_and_an_entry_with_the_same_selectors_rank_alike():
    for sel in ({"op": "torch.add"}, {"op": "torch.*", "device": "cuda"}, {"model": "M_1", "name": "x?", "dtype": "float32"},
                {"signature": "ab12", "backend": "induc*"}):
        assert Rule(rtol=1.0, **sel).selector.rank == triage.Entry(status="known_failure", where="", selectors=sel).selector.rank


def _db_with_runs(tmp_path, n: int):
    db = tmp_path / "c.db"
    open_store(db).close()
    conn = store_conn(str(db))
    ids = [run_lifecycle.start_run(conn, selection={}, args=[], device="cpu", backend="eager") for _ in range(n)]
    conn.commit()
    conn.close()
    return db, ids


@pytest.mark.parametrize("opener", [lambda p: sqlite3.connect(p), lambda p: sqlite_utils.Database(p),
                                    lambda p: store_conn(p)], ids=["sqlite3", "sqlite-utils", "history"])
def test_a_run_is_looked_up_through_any_connection(tmp_path, opener):
    db, (first, second) = _db_with_runs(tmp_path, 2)
    conn = opener(str(db))
    run = run_rows.get_run(conn, second)
    assert (run["id"], run["device"], run["backend"], run["status"], run["selection"]) == (
        second, "cpu", "eager", "running", {})
    assert triage.run_target(conn, first) == {"device": "cpu", "backend": "eager", "arch": None}
    with pytest.raises(NotFound, match=rf"^no run 99; recent runs: {second}, {first}$"):
        run_rows.get_run(conn, 99)


def test_triage_update_and_the_report_name_a_missing_run_alike(cli, db_path, tmp_path):
    open_store(db_path).close()
    res = cli("triage", "update", tmp_path / "t.yaml", "--from-run", "7")
    assert res.exit_code == 2
    assert "no run 7; no runs recorded yet" in res.output
    conn = store_conn(str(db_path))
    run = run_lifecycle.start_run(conn, selection={}, args=[], device="cpu", backend="eager")
    conn.commit()
    conn.close()
    for args in (("triage", "update", tmp_path / "t.yaml", "--from-run", "7"), ("report", "--run", "7")):
        res = cli(*args)
        assert res.exit_code == 2, res.output
        assert f"no run 7{' (--run)' if args[0] == 'report' else ''}; recent runs: {run}" in res.output, res.output
