"""What triage reads of a casedb database: the case occurrences it plans, and a run's target and
judgements. Reads only; runs are looked up through :mod:`casedb.store.history`."""

from __future__ import annotations

import json
from pathlib import Path

from casedb.errors import NotFound
from casedb.store import history
from casedb.store.database import connect


class Reading:
    """``with Reading(store) as db``: something with ``execute`` for a Store, a sqlite-utils
    Database, a connection, or a path (opened here through the store's connection, closed after;
    never created)."""

    def __init__(self, store):
        self.store, self.conn = store, None

    def __enter__(self):
        store = self.store
        if hasattr(store, "db") and hasattr(store.db, "execute"):
            return store.db
        if hasattr(store, "execute"):
            return store
        path = Path(store)
        if not path.is_file():
            raise NotFound(f"no database at {path}")
        self.conn = connect(path)  # (checks its schema first: its views and triggers may be anyone's)
        return self.conn

    def __exit__(self, *exc):
        if self.conn is not None:
            self.conn.close()


def _marks(*texts) -> list[str]:
    out: set = set()
    for t in texts:
        out |= set(json.loads(t) if t else ())
    return sorted(out)


_OCC_SQL = """SELECT mc.id, mc.model, mc.name, c.op, mc.signature, c.dtype, c.marks, mc.marks
              FROM model_cases mc JOIN cases c ON c.signature = mc.signature
              WHERE mc.retired_at IS NULL ORDER BY mc.model, mc.position, mc.id"""


def occurrences(store) -> list[dict]:
    """Every case occurrence the DB plans (not retired), as triage matches them."""
    with Reading(store) as db:
        rows = db.execute(_OCC_SQL).fetchall()
    return [{"model_case_id": i, "model": m, "name": n, "op": op, "signature": s, "dtype": d, "marks": _marks(cm, om)}
            for i, m, n, op, s, d, cm, om in rows]


def run_target(db, run_id: int) -> dict:
    """The target (device, backend, arch) run ``run_id`` ran on; NotFound naming the last run."""
    run = history.get_run(db, run_id)
    selection = run["selection"]
    options = selection.get("options") or {}
    return {"device": run["device"], "backend": run["backend"], "arch": options.get("arch") or selection.get("arch")}


_RUN_ROWS = """SELECT j.model_case_id, j.model, mc.name, c.op, j.signature, c.dtype, c.marks, mc.marks, j.outcome,
                      coalesce(j.stage, r.stage), r.error_type, r.error_message, j.reason, r.max_abs_err, j.rtol, j.atol,
                      r.tolerance, CASE WHEN json_valid(r.metrics) THEN json_extract(r.metrics, '$.pattern') END
               FROM judgements j LEFT JOIN results r ON r.id = j.result_id
               LEFT JOIN model_cases mc ON mc.id = j.model_case_id LEFT JOIN cases c ON c.signature = j.signature
               WHERE j.run_id = ? ORDER BY j.model, mc.name"""
_RUN_COLUMNS = ("model_case_id", "model", "name", "op", "signature", "dtype", "case_marks", "marks", "outcome", "stage",
                "error_type", "error_message", "reason", "max_abs_err", "rtol", "atol", "tolerance",
                "pattern")


def run_rows(db, run_id: int) -> list[dict]:
    """Run ``run_id``'s judgements of occurrences still in the DB, with their case and result."""
    rows = []
    for found in db.execute(_RUN_ROWS, [run_id]).fetchall():
        r = dict(zip(_RUN_COLUMNS, found))
        if r["name"] is None:
            continue
        r["marks"] = _marks(r.pop("case_marks"), r["marks"])
        rows.append(r)
    return rows
