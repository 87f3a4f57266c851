"""What triage reads of a casedb database (:mod:`casedb.triage.reading`): the case occurrences it
plans, and a run's judgements with their case and result. Reads only."""

from __future__ import annotations

import os

from casedb.errors import NotFound
from casedb.store.database import open_store


class Reading:
    """``with Reading(store) as db``: something with ``execute`` for a Store, a sqlite-utils
    Database, a connection, or a path (opened here as every DB is, :func:`open_store`, closed
    after; never created)."""

    def __init__(self, store):
        self.store, self.opened = store, None

    def __enter__(self):
        store = self.store
        if hasattr(store, "db") and hasattr(store.db, "execute"):
            return store.db
        if hasattr(store, "execute"):
            return store
        if not os.path.isfile(store):
            raise NotFound(f"no database at {store}")
        # (its schema checked first: its views and triggers may be anyone's; its journal mode kept)
        self.opened = open_store(store, wal=False)
        return self.opened.db

    def __exit__(self, *exc):
        if self.opened is not None:
            self.opened.close()


_OCC_SQL = """SELECT mc.id, mc.model, mc.name, c.op, mc.signature, c.dtype, c.marks, mc.marks
              FROM model_cases mc JOIN cases c ON c.signature = mc.signature
              WHERE mc.retired_at IS NULL ORDER BY mc.model, mc.position, mc.id"""


def occurrence_rows(db) -> list[tuple]:
    """Every case occurrence the DB plans (not retired), in manifest order: (id, model, name, op,
    signature, dtype, the case's marks, the occurrence's marks; marks as JSON text)."""
    return db.execute(_OCC_SQL).fetchall()


_RUN_ROWS = """SELECT j.model_case_id, j.model, mc.name, c.op, j.signature, c.dtype, c.marks, mc.marks, j.outcome,
                      coalesce(j.stage, r.stage), r.error_type, r.error_message, j.reason, r.max_abs_err, j.rtol, j.atol,
                      r.tolerance, CASE WHEN json_valid(r.metrics) THEN json_extract(r.metrics, '$.pattern') END
               FROM judgements j LEFT JOIN results r ON r.id = j.result_id
               LEFT JOIN model_cases mc ON mc.id = j.model_case_id LEFT JOIN cases c ON c.signature = j.signature
               WHERE j.run_id = ? ORDER BY j.model, mc.name"""
RUN_COLUMNS = ("model_case_id", "model", "name", "op", "signature", "dtype", "case_marks", "marks", "outcome", "stage",
               "error_type", "error_message", "reason", "max_abs_err", "rtol", "atol", "tolerance",
               "pattern")


def judgement_rows(db, run_id: int) -> list[dict]:
    """Run ``run_id``'s judgements with their case and result, keyed by :data:`RUN_COLUMNS` (marks
    as JSON text; ``name`` None for an occurrence no longer in the DB)."""
    return [dict(zip(RUN_COLUMNS, found)) for found in db.execute(_RUN_ROWS, [run_id]).fetchall()]
