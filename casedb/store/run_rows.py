"""A ``runs`` row: read (:func:`get_run`, selection and summary as data), updated and inserted.
The run's life (start, resume, finish) is :mod:`casedb.store.run_lifecycle`'s."""

from __future__ import annotations

import sqlite3

from casedb.errors import NotFound
from casedb.serial import dumps, loads


# The id a new run gets: after every run there is and every run deleted (ids are never reused;
# migration m152 keeps the highest deleted one).
NEXT_RUN_ID = ("(SELECT max(ifnull((SELECT max(id) FROM runs), 0), ifnull((SELECT max(id) FROM run_id_high_water), 0))"
               " + 1)")


def get_run(conn, run_id: int, what: str | None = None) -> dict:
    """The runs row ``run_id`` (selection and summary as data), through any connection or
    database with ``execute``. NotFound naming the recent runs otherwise (``what``: the option
    that named it, for the message)."""
    cur = conn.execute("SELECT * FROM runs WHERE id = ?", [run_id])
    row = cur.fetchone()
    if row is None:
        recent = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 10")]
        raise NotFound(f"no run {run_id}" + (f" ({what})" if what else "")
                       + (f"; recent runs: {', '.join(map(str, recent))}" if recent else "; no runs recorded yet"))
    d = dict(zip([c[0] for c in cur.description], row))
    d["selection"] = loads(d["selection"]) or {}
    d["summary"] = loads(d["summary"])
    return d


def update_selection(conn: sqlite3.Connection, run_id: int, **changes) -> dict:
    sel = get_run(conn, run_id)["selection"]
    sel.update(changes)
    conn.execute("UPDATE runs SET selection = ? WHERE id = ?", [dumps(sel), run_id])
    return sel


def set_run(conn: sqlite3.Connection, run_id: int, **columns) -> None:
    """Update columns of a runs row (``selection`` and ``summary`` given as data)."""
    for k in ("selection", "summary"):
        if k in columns:
            columns[k] = dumps(columns[k])
    assigns = ", ".join(f"{k} = ?" for k in columns)
    conn.execute(f"UPDATE runs SET {assigns} WHERE id = ?", [*columns.values(), run_id])


def insert_run(conn: sqlite3.Connection, values: dict) -> int:
    """Insert a whole runs row (a copy from another database) under a new id; returns the id."""
    cols = [c for c in values if c != "id"]
    return conn.execute(f"INSERT INTO runs (id, {', '.join(cols)}) VALUES ({NEXT_RUN_ID}, {', '.join('?' * len(cols))})",
                        [values[c] for c in cols]).lastrowid
