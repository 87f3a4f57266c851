"""What `casedb serve` (:mod:`casedb.read.serve`, :mod:`casedb.read.datasette_plugin`) asks of the
database file: the WAL folded into the file before it is served immutable, the cap on SQLite's
heap for the serving process, and the latest full run a served connection pins."""

from __future__ import annotations

import sqlite3

from casedb.store import run_scope


def fold_wal(store) -> bool:
    """Fold the WAL of ``store`` (an open Store) into its file; True when a writer kept it busy
    (a run writing for longer than a second: not waited for)."""
    store.db.execute("PRAGMA busy_timeout = 1000")
    busy, _, _ = store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return bool(busy)


def limit_sqlite_heap(limit: int) -> None:
    """Cap SQLite's heap for this whole process (a query past it fails with SQLITE_NOMEM)."""
    con = sqlite3.connect(":memory:")  # (the pragma is process-wide: any connection sets it)
    try:
        con.execute(f"PRAGMA hard_heap_limit = {int(limit)}")
    finally:
        con.close()


def latest_run(conn) -> tuple[bool, int | None]:
    """(whether ``conn`` holds a casedb database, its latest full run: not a `casedb mutants`
    run, not a partial rerun, as `casedb report` takes it; the newest run where there are only
    those, or a database from before run labels)."""
    try:
        latest = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
    except sqlite3.Error:  # not a casedb database
        return False, None
    try:
        latest = conn.execute(run_scope.LATEST_FULL_RUN).fetchone()[0] or latest
    except sqlite3.Error:  # a database from before run labels
        pass
    return True, latest
