"""Hostile input, round four (issue 41): items 1, 4, 7, 8 and part of 12.

Nothing a database names is imported (`repro --run`); a case mark cannot become pytest's own
marker (skip, xfail, timeout...) or another model's mark; a tolerance is finite, a count and a
seed fit SQLite, and no NaN or infinity is written as JSON; a DB path that is not a file, a DB
locked past the busy timeout and an --import that is not a .py file are exit 2 with a message.
Every refused import leaves the DB byte-identical.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.conftest import rows, sha256_of, write_sql

pytestmark = pytest.mark.timeout(600)
CPU_EAGER = ("--device", "cpu", "--backend", "eager", "-j", "0", "--no-progress", "-m", "")
ZEROS = ("--device", "cpu", "--import", "casedb.mutation.mutants", "--backend", "casedb_mutant_zeros", "-j", "0",
         "--no-progress", "-m", "", "--no-shipped-triage")


def add_case(name: str, **extra) -> dict:
    return {"name": name, "op": "torch.add", "inputs": [{"tensor": {"shape": [4, 64]}}, {"tensor": {"shape": [4, 64]}}],
            **extra}


def manifest(path: Path, cases: list[dict], model: str = "m", **default) -> Path:
    text = yaml.safe_dump({"model": model, **({"default": default} if default else {}), "cases": cases},
                          sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def refused(cli, db_path, tmp_path):
    """`casedb import FILE` (and its --dry-run) on a DB holding one model: exit 2, no traceback,
    the DB byte-identical; returns the error message."""
    assert cli("import", manifest(tmp_path / "good.yaml", [add_case("good")], model="good")).exit_code == 0
    before = sha256_of(db_path)

    def run(path: Path) -> str:
        for args in (("--dry-run",), ()):
            res = cli("import", path, *args)
            assert res.exit_code == 2, res.output
            assert "Traceback" not in res.output
            assert sha256_of(db_path) == before
        return flat(res.stderr)

    return run


# ------------------------------------------------- 1: repro imports only what its command line gives

def test_repro_of_a_run_never_imports_the_modules_the_database_names(cli, db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # (a name no other test imports: an in-process import of a module already loaded runs nothing)
    marker = tmp_path / "PWNED"
    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")])).exit_code == 0
    assert cli("run", "--model", "m", *CPU_EAGER).exit_code == 0
    # a shard from elsewhere: its run names a shipped module, and one whose name breaks out of a line
    (tmp_path / "planted_round4_ops.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    sneaky = "x\nimport pathlib; pathlib.Path('PWNED').touch()"  # (no slash: kept as a module name)
    with sqlite3.connect(db_path) as con:
        con.execute("UPDATE runs SET selection = json_set(selection, '$.options.imports', json(?)) WHERE id = 1",
                    [json.dumps(["planted_round4_ops.py", sneaky])])
    con.close()
    res = cli("repro", "m::a", "--run", 1, "-o", tmp_path / "repro.py")
    assert res.exit_code == 0, res.output
    assert not marker.exists()  # not imported by casedb
    assert "run 1 was recorded with --import planted_round4_ops.py" in flat(res.stderr)
    assert "--import planted_round4_ops.py" in flat(res.stderr)  # what to give to import it
    text = (tmp_path / "repro.py").read_text()
    assert '# run 1 was recorded with --import ["planted_round4_ops.py", "x\\nimport pathlib' in text
    compile(text, "repro.py", "exec")  # the name stays inside its comment
    done = subprocess.run([sys.executable, "repro.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()  # nor by the script
    assert "this script does not import them" in done.stderr
    # given on this command line, it is imported (by casedb and by the script)
    res = cli("repro", "m::a", "--run", 1, "--import", "planted_round4_ops.py", "-o", tmp_path / "given.py")
    assert res.exit_code == 0 and marker.exists(), res.output
    assert runpy.run_path(str(tmp_path / "given.py"), run_name="repro")["CASE"]["imports"] == [
        {"module": "planted_round4_ops", "file": str(tmp_path / "planted_round4_ops.py"), "folder": str(tmp_path),
         "given": "file"}]


# ------------------------------------------------------- 4: marks that would be pytest's own markers

@pytest.mark.parametrize("mark", ["skip", "skipif", "xfail", "usefixtures", "filterwarnings", "parametrize",
                                  "timeout", "tryfirst", "model_other"])
def test_a_mark_named_like_a_pytest_marker_or_a_model_mark_is_refused_at_import(refused, tmp_path, mark):
    msg = refused(manifest(tmp_path / "bad.yaml", [add_case("fine"), add_case("hidden", marks=["slow", mark])]))
    assert "bad.yaml:" in msg and "case 'hidden'" in msg and f"mark {mark!r}" in msg and "rename the mark" in msg


def test_a_v2_tag_named_skip_is_refused(refused, tmp_path):
    item = {"name": "torch.add", "tags": ["torch.add.1", "skip"], "sample_inputs_func": {"args": [
        {"tensor": {"shape": [4], "stride": [1], "storage_offset": 0, "dtype": "torch.float32", "device": "cuda",
                    "init": "rand"}}] * 2}}
    config = {"test_suite_config": {"global": {"supported_dtypes": [{"name": "float32"}]}, "files": [{
        "path": "t.py", "tests": [{"names": ["TestSpyreModelOps::test_model_ops_db"], "mode": "mandatory_success",
                                   "tags": ["model__hv2"], "edits": {"ops": {"include": [item]}}}]}]}}
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    msg = refused(tmp_path / "v2.yaml")
    assert "v2.yaml" in msg and "mark 'skip' is a pytest marker" in msg


def test_a_stored_skip_mark_never_skips_a_failing_case(cli, db_path, tmp_path, monkeypatch):
    """A database from elsewhere holds `skip`, `xfail`, `timeout` and `model_other` as a case's own
    marks: the case still fails (run exit 1, JUnit failure), and counts under its own model only."""
    monkeypatch.chdir(tmp_path)
    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")])).exit_code == 0
    write_sql(db_path, """UPDATE model_cases SET marks = '["skip","xfail","timeout","model_other","mine"]'""")
    res = cli("run", "--model", "m", *ZEROS, "--json")
    summary = json.loads(res.stdout)
    assert (res.exit_code, summary["failed"], summary["skipped"], summary["xfailed"]) == (1, 1, 0, 0), res.output
    assert rows(db_path, "SELECT outcome FROM judgements") == [{"outcome": "failed"}]
    # the pytest front end: JUnit says failure; -m model_other selects nothing, -m mine the case
    (tmp_path / "test_ops.py").write_text("from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_ops.py", "--casedb-db", str(db_path),
            "--model", "m", "--device", "cpu", "--casedb-import", "casedb.mutation.mutants",
            "--compile-backend", "casedb_mutant_zeros", "--casedb-no-record", "--casedb-no-shipped-triage"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*base, "-m", "mine", "--junitxml", "j.xml"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    case = ET.parse(tmp_path / "j.xml").getroot().find(".//testcase")
    assert case.find("failure") is not None and case.find("skipped") is None
    other = subprocess.run([*base, "-m", "model_other", "--co"], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env=env)
    assert "1 deselected" in other.stdout and "INTERNALERROR" not in other.stdout + other.stderr, other.stdout


def test_merge_refuses_a_source_whose_occurrence_has_a_pytest_marker_mark(cli, db_path, tmp_path):
    src = tmp_path / "shard.db"
    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")]), db=src).exit_code == 0
    assert cli("run", "--model", "m", *CPU_EAGER, db=src).exit_code == 0
    write_sql(src, """UPDATE model_cases SET marks = '["xfail"]'""")
    res = cli("merge", src)
    msg = flat(res.stderr)
    assert res.exit_code == 2 and "m::a: mark 'xfail' is a pytest marker" in msg and "Nothing was merged" in msg, msg
    assert not db_path.exists() or rows(db_path, "SELECT count(*) AS n FROM model_cases") == [{"n": 0}]


# ---------------------------------------------------------------- 7: non-finite tolerances

@pytest.mark.parametrize("where", ["case", "default"])
def test_an_infinite_or_nan_tolerance_is_refused(refused, tmp_path, where):
    for value in (math.inf, "inf", 1e400, math.nan):
        case = add_case("loose", **({"rtol": value} if where == "case" else {}))
        msg = refused(manifest(tmp_path / "bad.yaml", [case], **({"atol": value} if where == "default" else {})))
        assert "bad.yaml" in msg and "must be a finite number >= 0" in msg
        assert ("case 'loose'" in msg) == (where == "case")


def test_no_nan_or_infinity_is_written_as_json():
    from casedb.errors import CasedbError
    from casedb.serial import dumps, dumps_values

    with pytest.raises(CasedbError, match=r"\$\.metrics\.tolerances\.float32\[0\] = inf"):
        dumps({"metrics": {"tolerances": {"float32": [math.inf, 0.0]}}})
    with pytest.raises(CasedbError, match="nan"):
        dumps([1.0, math.nan])
    assert dumps({"a": [1.5, None]}) == '{"a":[1.5,null]}'
    # a case's own argument values may be infinite (masked_fill(-inf)); only they keep that spelling
    assert dumps_values([{"value": -math.inf}]) == '[{"value":-Infinity}]'


def test_a_database_already_holding_an_infinite_tolerance_is_not_run(cli, db_path, tmp_path):
    """Stored by an older casedb (or by hand): the run stops before any case, naming it, instead of
    passing every result and writing Infinity into the results' JSON."""
    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")])).exit_code == 0
    write_sql(db_path, "UPDATE model_cases SET rtol = 9e999")
    res = cli("run", "--model", "m", *ZEROS)
    assert res.exit_code == 2, res.output
    assert "case m::a: rtol must be a finite number >= 0, got inf" in flat(res.output)
    assert "INTERNALERROR" not in res.output
    assert rows(db_path, "SELECT count(*) AS n FROM results") == [{"n": 0}]
    assert cli("report").exit_code == 0


def test_merge_refuses_a_source_with_an_infinite_tolerance(cli, db_path, tmp_path):
    src = tmp_path / "shard.db"
    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")]), db=src).exit_code == 0
    assert cli("run", "--model", "m", *CPU_EAGER, db=src).exit_code == 0
    write_sql(src, "UPDATE model_cases SET rtol = 9e999")
    assert rows(src, "SELECT rtol FROM model_cases") == [{"rtol": math.inf}]
    res = cli("merge", src)
    msg = flat(res.stderr)
    assert res.exit_code == 2 and "model_cases row 1" in msg and "tolerances" in msg, res.output


# ------------------------------------------------------------------- 8 and 12: counts and seeds

def test_huge_counts_are_refused_and_the_db_keeps_working(refused, cli, tmp_path):
    msg = refused(manifest(tmp_path / "big.yaml", [add_case("a", count=2**63 - 1), add_case("b", count=2**63 - 1)]))
    assert "case 'a'" in msg and "'count'" in msg and "from 1 to 2,147,483,647" in msg
    for n in (2**63, 2**31):
        assert "from 1 to 2,147,483,647" in refused(manifest(tmp_path / "big.yaml", [add_case("a", count=n)]))
    # two unnamed records of one case add up: their sum is bounded too
    same = {"op": "torch.neg", "inputs": [{"tensor": {"shape": [4]}}], "count": 2**31 - 1}
    assert "summed" in refused(manifest(tmp_path / "sum.yaml", [same, same]))
    for command in (("models",), ("stats",)):
        assert cli(*command).exit_code == 0


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 10**30])
@pytest.mark.parametrize("where", ["case", "default"])
def test_a_seed_sqlite_cannot_store_is_refused(refused, tmp_path, seed, where):
    case = add_case("seeded", **({"seed": seed} if where == "case" else {}))
    msg = refused(manifest(tmp_path / "seed.yaml", [case], **({"seed": seed} if where == "default" else {})))
    assert "seed.yaml" in msg and "'seed' must be an integer from" in msg


# ------------------------------------------------------------------------- 12: the DB file itself

@pytest.mark.parametrize("kind", ["folder", "fifo", "devnull"])
def test_a_db_path_that_is_not_a_file_is_exit_2(cli, tmp_path, kind):
    if kind == "folder":
        path = tmp_path / "db"
        path.mkdir()
    elif kind == "fifo":
        path = tmp_path / "db"
        os.mkfifo(path)
    else:
        path = Path(os.devnull)
    good = manifest(tmp_path / "m.yaml", [add_case("a")])
    for args in (("models",), ("import", good), ("run", "--model", "m", *CPU_EAGER)):
        res = cli(*args, db=path)
        assert res.exit_code == 2, res.output
        assert f"database {path} is a" in flat(res.stderr) and "give --db" in flat(res.stderr)
    assert not Path(f"{path}-lock").exists()


def test_a_db_locked_past_the_busy_timeout_is_exit_2_naming_the_file(cli, db_path, tmp_path, monkeypatch):
    from casedb.store import database

    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")])).exit_code == 0
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.2)  # casedb waits 60 s: the same path, sooner
    before = sha256_of(db_path)
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process writing, for longer than casedb waits
        res = cli("import", manifest(tmp_path / "n.yaml", [add_case("b")], model="n"))
    finally:
        holder.close()
    assert res.exit_code == 2, res.output
    msg = flat(res.stderr)
    assert f"{db_path}: the database is locked" in msg and "try again" in msg
    assert sha256_of(db_path) == before
    assert cli("import", tmp_path / "n.yaml").exit_code == 0  # once it is free


def test_an_import_that_is_not_a_py_file_is_exit_2(cli, db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("import pathlib; pathlib.Path('PWNED').touch()\n")
    (tmp_path / "pkgdir").mkdir()
    assert cli("import", manifest(tmp_path / "m.yaml", [add_case("a")])).exit_code == 0
    for given, said in (("./notes.txt", "not a Python source file"), ("missing.py", "no such file"),
                        ("./pkgdir", "a folder")):
        for args in (("run", "--model", "m", *CPU_EAGER), ("repro", "m::a", "--device", "cpu")):
            res = cli(*args, "--import", given)
            assert res.exit_code == 2, res.output
            assert f"--import {given}: " in flat(res.stderr) and said in flat(res.stderr)
    assert rows(db_path, "SELECT count(*) AS n FROM runs") == [{"n": 0}]  # refused before a run begins
    assert not (tmp_path / "PWNED").exists()
