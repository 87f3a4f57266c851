"""A database from elsewhere whose schema objects are hostile (issue 24, item 5), and the names
in it that hold terminal escape sequences.

Every connection checks ``sqlite_master`` against what casedb's migrations create before it
reads or writes: a foreign trigger or view, a redefined casedb view, a table that is a view,
refuse the file (exit 2, naming the objects, the file byte-identical) for every command. Names
read from a database are printed with their control characters escaped.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests import runs_data
from tests.helpers import rows, write_sql
from tests.hostile.bounded import refused_within_bounds, run_casedb, snapshot

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def own(cli, tmp_path) -> Path:
    """A casedb file with two recorded runs, alone in its folder."""
    folder = tmp_path / "own"
    folder.mkdir()
    db = folder / "cases.db"
    runs_data.two_runs(lambda *a: cli(*a, db=db), tmp_path, db)
    return db


FLIP = ("CREATE TRIGGER flip AFTER INSERT ON judgements WHEN new.outcome = 'ref_error' BEGIN "
        "UPDATE judgements SET outcome = 'passed' WHERE id = new.id; END")
COMMANDS = {
    "report": ["report"], "report --markdown": ["report", "--markdown"], "cases": ["cases"], "stats": ["stats"],
    "models": ["models"], "show": ["show", "a_add"], "check": ["check"], "export": ["export", "--model", "model_a"],
    "import": ["import", "{manifest}"],
    "run": ["run", "--model", "model_a", "--device", "cpu", "--backend", "eager", "-j", "0", "--limit", "1"],
    "run --resume": ["run", "--resume", "2", "-j", "0"],
    "triage check": ["triage", "check", "{triage}"],
    "merge into it": ["merge", "{shard}", "--into", "{db}"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_foreign_trigger_refuses_the_file_for_every_command(command, cli, own, tmp_path):
    write_sql(own, FLIP)
    shard = tmp_path / "shard" / "shard.db"
    if command == "merge into it":
        shard.parent.mkdir()
        runs_data.two_runs(lambda *a: cli(*a, db=shard), shard.parent, shard)
    triage_file = tmp_path / "triage.yaml"
    triage_file.write_text("version: 1\ncases:\n  - {model: model_a, status: expected_pass}\n", encoding="utf-8")
    names = {"manifest": tmp_path / "model_a.yaml", "triage": triage_file, "shard": shard, "db": own}
    before = snapshot(own.parent)
    res = cli(*[a.format(**names) for a in COMMANDS[command]], db=own)
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert f"{own}: its schema is not casedb's: trigger 'flip' on 'judgements' is not casedb's" in said
    assert snapshot(own.parent) == before


def test_a_database_given_by_path_to_the_library_is_checked_too(own, tmp_path):
    from casedb import triage
    from casedb.store.schema_check import UnusableDatabase

    write_sql(own, FLIP)
    triage_file = tmp_path / "triage.yaml"
    triage_file.write_text("version: 1\ncases:\n  - {model: model_a, status: expected_pass}\n", encoding="utf-8")
    with pytest.raises(UnusableDatabase, match="trigger 'flip' on 'judgements' is not casedb's"):
        triage.check([triage_file], own)


def test_a_redefined_verdicts_view_is_refused_not_printed(cli, own):
    view = rows(own, "SELECT sql FROM sqlite_master WHERE name = 'verdicts'")[0]["sql"]
    assert "'casedb repro '" in view
    write_sql(own, "DROP VIEW verdicts", view.replace("'casedb repro '", "'casedb repro $(touch pwned) '"))
    before = snapshot(own.parent)
    res = cli("report", "--markdown", db=own)
    assert res.exit_code == 2 and "$(touch" not in res.stdout
    assert "view 'verdicts' is not defined as casedb defines it" in " ".join(res.stderr.split())
    assert snapshot(own.parent) == before
    write_sql(own, "DROP VIEW verdicts", view, "CREATE VIEW mine AS SELECT 1")  # a view of its own: refused too
    res = cli("report", db=own)
    assert res.exit_code == 2 and "view 'mine' is not casedb's" in " ".join(res.stderr.split())


@pytest.mark.parametrize("command", [["report"], ["serve", "--port", "{port}"]])
def test_runs_as_a_recursive_view_is_refused_quickly(command, own):
    write_sql(own, "DROP TABLE runs", "CREATE VIEW runs AS WITH RECURSIVE r(id, device, backend) AS "
                                "(SELECT 1, 'cpu', 'eager' UNION ALL SELECT id + 1, device, backend FROM r) SELECT * FROM r")
    before = snapshot(own.parent)
    cost = run_casedb(own, *[a.format(port=runs_data.free_port()) for a in command], timeout=30)
    refused_within_bounds(cost, "'runs' is a view on 'runs', casedb's is a table")
    assert snapshot(own.parent) == before


def test_files_that_are_not_casedb_s_are_refused_and_left_as_they_were(cli, tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all\n" * 500)
    res = cli("stats", db=junk)
    assert res.exit_code == 2 and "is not an SQLite database casedb can read" in res.stderr
    other = tmp_path / "other.db"
    write_sql(other, "CREATE TABLE notes (x)")
    before = snapshot(tmp_path)
    res = cli("stats", db=other)
    assert res.exit_code == 2 and "is an SQLite database but not casedb's (it has notes" in " ".join(res.stderr.split())
    assert snapshot(tmp_path) == before


def test_an_older_casedb_s_views_are_accepted_while_a_migration_recreates_them(tmp_path, cli):
    import sqlite_utils

    from casedb.store.migrations import REPORT_VIEWS, migrations

    db = tmp_path / "old.db"
    migrations.apply(sqlite_utils.Database(db), stop_before="m121_triage")
    older = REPORT_VIEWS["latest_runs"].replace("max(id)", "max(id) /* as casedb 0.x wrote it */")
    write_sql(db, "DROP VIEW latest_runs", f"CREATE VIEW latest_runs AS {older}", "CREATE TABLE my_notes (x)")
    assert cli("stats", db=db).exit_code == 0  # m121 is pending: it recreates every view
    assert rows(db, "SELECT sql FROM sqlite_master WHERE name = 'latest_runs'") == [
        {"sql": f"CREATE VIEW latest_runs AS {REPORT_VIEWS['latest_runs'].strip()}"}]
    write_sql(db, "DROP VIEW latest_runs", f"CREATE VIEW latest_runs AS {older}")
    res = cli("stats", db=db)  # nothing pending: the view is not casedb's
    assert res.exit_code == 2 and "view 'latest_runs' is not defined as casedb defines it" in res.stderr



def test_an_older_casedb_without_a_later_view_opens_and_gets_it(tmp_path, cli):
    # a default DB made before m130 (seen: data/casedb.sqlite of an older checkout was refused)
    import sqlite_utils

    from casedb.store.migrations import migrations

    db = tmp_path / "old.db"
    migrations.apply(sqlite_utils.Database(db), stop_before="m130_occurrences_view")
    write_sql(db, "DROP VIEW occurrences")
    assert cli("stats", db=db).exit_code == 0
    assert rows(db, "SELECT name FROM sqlite_master WHERE name = 'occurrences'") == [{"name": "occurrences"}]
    write_sql(db, "DROP VIEW occurrences")
    res = cli("stats", db=db)  # nothing pending: a missing view is not casedb's schema
    assert res.exit_code == 2 and "casedb's view 'occurrences' is missing" in res.stderr


# ------------------------------------------------------------------------- terminal escapes

ESC = "\x1b]52;c;cHduZWQ=\x07"  # OSC 52: set the clipboard
CSI = "\x1b[2J"  # clear the screen
C1 = "\x9b31m"  # an 8-bit CSI


@pytest.mark.parametrize("command", [["cases"], ["show", "a_add"], ["models"], ["report"], ["report", "--markdown"],
                                     ["cases", "--model", "nosuch"]])
def test_control_characters_from_the_database_are_printed_escaped(command, cli, own):
    con = sqlite3.connect(own)
    con.execute("UPDATE model_cases SET description = ? || description, name = name || ? WHERE name != 'a_add'",
                [CSI, ESC])
    con.execute("UPDATE model_cases SET description = ? WHERE name = 'a_add'", [f"residual {CSI}add{C1}"])
    con.execute("UPDATE models SET source = ?", [f"hub{ESC}"])
    con.execute("UPDATE results SET error_message = ? WHERE error_message IS NOT NULL", [f"boom{C1}{CSI}"])
    con.execute("UPDATE runs SET device = ?", [f"cpu{CSI}"])
    for table, col in (("models", "name"), ("model_cases", "model"), ("judgements", "model")):
        con.execute(f"UPDATE {table} SET {col} = ? WHERE {col} = 'model_b'", [f"model_b{ESC}"])
    con.commit()
    con.close()
    res = cli(*command, db=own)
    out = res.stdout + res.stderr
    assert res.exit_code in (0, 2), out
    assert not {"\x1b", "\x9b", "\x07"} & set(out), repr(out)
    assert "\\x1b" in out


def test_sql_is_compared_token_by_token_literals_exact(cli, own):
    """Quoting a plain name is no change (older sqlite-utils wrote [name]); text inside a string
    literal, or a quoted name that is not one identifier (a string in SQLite's eyes), is."""
    from casedb.store.schema_check import normalized

    view = "CREATE VIEW v AS SELECT max(id) AS run_id, device FROM runs WHERE x GLOB '*[^a-z]*'"
    assert normalized(view.replace("max(id)", 'max("id")').replace("FROM runs", "FROM  [runs]")) == normalized(view)
    assert normalized(view.replace("[^a-z]", "^a-z")) != normalized(view)
    assert normalized(view.replace("device", '"runs.device"')) != normalized(view.replace("device", "runs.device"))
    requoted = ('CREATE VIEW latest_runs AS SELECT max("id") AS run_id, [device], backend FROM "runs" '
                "GROUP BY device, backend")
    write_sql(own, "DROP VIEW latest_runs", requoted)
    assert cli("stats", db=own).exit_code == 0
