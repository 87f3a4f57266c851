"""What tests share that is not a fixture: the data folder, a file's hash, rows of a casedb file
read as a hand with sqlite3 would. Fixtures are in conftest.py; tests import these from here."""

import hashlib
import sqlite3
from pathlib import Path

DATA = Path(__file__).parent / "data"


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


def import_manifests(cli, folder: Path, manifests: dict[str, str], *args) -> list[Path]:
    """Write each manifest (file name under ``folder`` -> YAML text) and bring them all in with one
    ``casedb import`` through ``cli`` (the ``cli`` fixture, or ``runs_data.make_cli``'s for a
    module-scoped DB); the import must succeed. Returns the files' paths."""
    paths = []
    for name, text in manifests.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    result = cli("import", *paths, *args)
    assert result.exit_code == 0, result.output
    return paths



def store_conn(path) -> sqlite3.Connection:
    """A connection with rows by name to the DB at ``path``, as ``Store.conn`` makes it, after
    casedb's one opener has applied its migrations; the caller closes it."""
    from casedb.store.database import connect, open_store

    open_store(path).close()
    conn = connect(path)
    conn.row_factory = sqlite3.Row
    return conn
