"""Managing recorded runs: listing them (what tells each apart), labelling and deleting them."""

from __future__ import annotations

import os
import socket
import sqlite3

from casedb.errors import InputError
from casedb.serial import loads
from casedb.store import run_scope
from casedb.store.run_lifecycle import pid_alive
from casedb.store.run_rows import get_run
from casedb.store.run_scope import MUTANT_LABEL, NOT_MUTANT_RUN


def mutant_run(label: str | None) -> bool:
    """Whether a run labelled ``label`` is a `casedb mutants` run (NOT_MUTANT_RUN's negation, for
    SQL that cannot be built here: the dashboard's, through the SQL function casedb_mutant_run)."""
    return label is not None and label.startswith(MUTANT_LABEL)


def list_runs(conn: sqlite3.Connection, *, backend: str | None = None, device: str | None = None,
              label: str | None = None, mutants: bool = True, limit: int | None = None) -> list[dict]:
    """Runs, newest first, with their target, label and counts (from each run's summary).
    ``label`` is a shell-style wildcard; ``mutants=False`` leaves out the runs of `casedb mutants`."""
    where, params = [], []
    for col, value in (("backend", backend), ("device", device)):
        if value is not None:
            where.append(f"{col} = ?")
            params.append(value)
    if label is not None:
        where.append("label GLOB ?")
        params.append(label)
    if not mutants:
        where.append(NOT_MUTANT_RUN)
    sql = ("SELECT id, label, status, device, backend, started_at, finished_at, torch_version, summary, selection"
           " FROM runs"
           + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC")
    if limit is not None:
        sql += " LIMIT ?"
        params.append(int(limit))
    rows = []
    for r in conn.execute(sql, params).fetchall():
        summary = loads(r["summary"]) or {}
        counts = {k: summary.get(k) for k in ("executed", "passed", "failed", "errors", "crashed", "timeouts",
                                              "xfailed", "xpassed", "skipped")}
        rows.append({"run_id": r["id"], "label": r["label"], "status": r["status"], "device": r["device"],
                     "backend": r["backend"], "started_at": r["started_at"], "finished_at": r["finished_at"],
                     "torch_version": r["torch_version"], **_told_apart(r["selection"], summary, r), **counts})
    return rows


def _told_apart(selection: str | None, summary: dict, run) -> dict:
    """What tells a listed run apart: its front end, selection, shard, duration, the triage files
    it applied and the run it re-ran part of."""
    try:
        sel = loads(selection) or {}
    except ValueError:
        sel = {}
    options = sel.get("options") if isinstance(sel.get("options"), dict) else {}
    triage = options.get("triage") if isinstance(options.get("triage"), list) else []
    return {"front_end": run_scope.front_end(sel), "selection": run_scope.selection_words(sel),
            "shard": options.get("shard"), "duration_s": run_scope.duration_s(run["started_at"], run["finished_at"]),
            "triage": [os.path.basename(str(t)) for t in triage], "rerun_of": summary.get("rerun_of")}


def check_label(label: str) -> str:
    """``label`` if it can label a run (1 to 200 printable characters), else InputError."""
    if not label.strip() or len(label) > 200 or any(ord(c) < 32 for c in label):
        raise InputError(f"a run label is 1 to 200 printable characters, not {label!r}")
    return label


def set_label(conn: sqlite3.Connection, run_id: int, label: str | None) -> dict:
    """Give run ``run_id`` a label (None clears it); returns the run."""
    get_run(conn, run_id)
    if label is not None:
        check_label(label)
    conn.execute("UPDATE runs SET label = ? WHERE id = ?", [label, run_id])
    return get_run(conn, run_id)


def delete_runs(conn: sqlite3.Connection, run_ids: list[int], *, force: bool = False) -> dict:
    """Delete runs with their results and judgements, in one transaction. A run
    whose recording process is alive is refused unless ``force``. Returns what was deleted."""
    runs = [get_run(conn, int(i)) for i in dict.fromkeys(run_ids)]
    alive = [r["id"] for r in runs if not force and r["status"] == "running" and r["host"] == socket.gethostname()
             and any(pid_alive(s.get("pid")) for s in [r["selection"], *r["selection"].get("resumed", [])])]
    if alive:
        raise InputError(f"run {alive[0]} is still running (its process is alive): wait for it, "
                         "or stop it first (--force deletes it anyway)")
    counts = {"runs": 0, "results": 0, "judgements": 0}
    conn.execute("BEGIN IMMEDIATE")
    try:
        for r in runs:
            for table, col in (("judgements", "run_id"), ("results", "run_id"), ("runs", "id")):
                counts[table] += conn.execute(f"DELETE FROM {table} WHERE {col} = ?", [r["id"]]).rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    counts["run_ids"] = [r["id"] for r in runs]
    return counts
