"""A run's life: started (a `running` ``runs`` row), reopened by ``--resume``, finished with its
summary (:func:`casedb.store.run_figures.summarize`, from its rows, so a resumed or merged run sums
every part); whether the process recording it is alive."""

from __future__ import annotations

import os
import socket
import sqlite3
import sys
import uuid

from casedb import __version__
from casedb.serial import dumps, now
from casedb.store.records import RunSummary
from casedb.store.run_figures import summarize
from casedb.store.run_rows import NEXT_RUN_ID, get_run, update_selection


def torch_version() -> str | None:
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # not installed as a distribution: unknown
        return None


def start_run(conn: sqlite3.Connection, *, selection: dict, args: list[str], device: str | None,
              backend: str, software: dict | None = None) -> int:
    """Insert a `running` runs row; returns its id (``software``: casedb.run.software.describe)."""
    cur = conn.execute(
        f"""INSERT INTO runs (id, uid, started_at, status, device, backend, torch_version, casedb_version, host, args,
                              selection, software)
           VALUES ({NEXT_RUN_ID}, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)""",
        [uuid.uuid4().hex, now(), device, backend, torch_version(), __version__, socket.gethostname(),
         dumps(list(args)), dumps(selection), None if software is None else dumps(software)])
    return cur.lastrowid


def reopen_run(conn: sqlite3.Connection, run_id: int) -> None:
    """Mark a run running again (``--resume``), noting when and by whom."""
    sel = get_run(conn, run_id)["selection"]
    update_selection(conn, run_id, resumed=sel.get("resumed", []) + [{"at": now(), "pid": os.getpid()}])
    conn.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE id = ?", [run_id])


def finish_run(conn: sqlite3.Connection, run_id: int, status: str, *, error: str | None = None,
               fatal: str | None = None, session: dict | None = None) -> RunSummary:
    """Close a run: status, end time and its summary. ``error``: why it is not complete;
    ``fatal``: the target could not be used at all; ``session``: figures of the last session."""
    conn.execute("UPDATE runs SET finished_at = ?, status = ? WHERE id = ?", [now(), status, run_id])
    summary = summarize(conn, run_id)
    if session:
        summary["session"] = session
    if error or fatal:
        summary["error"] = error or fatal
    if fatal:
        summary["fatal"] = fatal
    conn.execute("UPDATE runs SET summary = ? WHERE id = ?", [dumps(summary), run_id])
    return summary


def refresh_summary(conn: sqlite3.Connection, run_id: int) -> RunSummary:
    summary = summarize(conn, run_id)
    conn.execute("UPDATE runs SET summary = ? WHERE id = ?", [dumps(summary), run_id])
    return summary


def pid_alive(pid: int | None) -> bool:
    if not pid or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
