import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
# torch before any test: pytester restores sys.modules after its test, so a torch first imported
# inside one (by a fixture) is dropped, and importing its C extension again crashes the worker
import torch  # noqa: F401
from typer.testing import CliRunner

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "cases.db"


@pytest.fixture
def cli(db_path):
    """Run `casedb --db <tmp db> ARGS...`; returns the click Result."""
    from casedb.cli import app

    runner = CliRunner()

    def invoke(*args, db=None):
        return runner.invoke(app, ["--db", str(db or db_path), *map(str, args)], catch_exceptions=False)

    invoke.json = lambda *args, db=None: json.loads(invoke(*args, "--json", db=db).stdout)
    return invoke


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def rows(db, sql: str, params=()) -> list[dict]:
    """The rows a query returns from a casedb file, as dicts (read-only; a fresh connection)."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql, list(params))]
    finally:
        con.close()


def write_sql(db, *statements: str) -> None:
    """Run statements on a database as a hand with sqlite3 would (foreign keys off, no casedb)."""
    con = sqlite3.connect(db)
    try:
        for s in statements:
            con.execute(s)
        con.commit()
    finally:
        con.close()
