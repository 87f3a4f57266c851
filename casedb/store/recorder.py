"""The ``results`` and ``judgements`` rows of a run: written by the recording process as each
case's report arrives and committed per case, so a run killed with SIGKILL keeps everything
reported so far, and ``--resume`` runs the rest exactly once (unique indexes make a second write
of the same case a no-op)."""

from __future__ import annotations

import sqlite3

from casedb.serial import dumps_measured, now
from casedb.store.records import Payload, ResultRow
from casedb.store.result_columns import RESULT_COLUMNS  # the columns of `results`, listed once there
from casedb.store.run_rows import get_run


JUDGEMENT_COLUMNS = ("run_id", "result_id", "model_case_id", "model", "signature", "outcome", "reason", "rtol",
                     "atol", "stage", "triage", "triage_where", "created_at")


def insert_result(conn: sqlite3.Connection, values: dict) -> int | None:
    """Insert a results row unless the run has this case already; returns its id or None."""
    cols = list(values)
    cur = conn.execute(f"INSERT OR IGNORE INTO results ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       [values[c] for c in cols])
    return cur.lastrowid if cur.rowcount else None


def insert_judgement(conn: sqlite3.Connection, values: dict) -> bool:
    """Insert a judgements row unless the run has judged this occurrence already."""
    cols = [c for c in JUDGEMENT_COLUMNS if c in values]
    cur = conn.execute(f"INSERT OR IGNORE INTO judgements ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       [values[c] for c in cols])
    return cur.rowcount > 0


def done_keys(conn: sqlite3.Connection, run_id: int, *, dedupe: bool, upto: tuple[int, int] | None = None) -> set:
    """Keys of the items run `run_id` already has (a result, or judgements when skipped);
    ``upto`` = (last result id, last judgement id) freezes the set at a moment."""
    r_max, j_max = upto or (1 << 62, 1 << 62)
    keys = set()
    for sig, mcid in conn.execute("SELECT signature, model_case_id FROM results WHERE run_id = ? AND id <= ?",
                                  [run_id, r_max]):
        keys.add((sig, None if dedupe else mcid))
    for sig, mcid in conn.execute("SELECT signature, model_case_id FROM judgements WHERE run_id = ? AND id <= ?",
                                  [run_id, j_max]):
        keys.add((sig, None if dedupe else mcid))
    return keys


def high_water(conn: sqlite3.Connection, run_id: int) -> tuple[int, int]:
    r = conn.execute("SELECT ifnull(max(id), 0) FROM results WHERE run_id = ?", [run_id]).fetchone()[0]
    j = conn.execute("SELECT ifnull(max(id), 0) FROM judgements WHERE run_id = ?", [run_id]).fetchone()[0]
    return r, j


class Recorder:
    """Writes one run's results as reports arrive (the recording process only)."""

    def __init__(self, conn: sqlite3.Connection, run_id: int):
        self.conn = conn
        self.run_id = run_id
        self.device_known = get_run(conn, run_id)["device"] is not None

    def record(self, item, payload: Payload, *, duration: float | None = None,
               worker: str | None = None, test_id: str | None = None) -> bool:
        """Store a payload (casedb.run.target.execute_item's, or a lost_payload) in one transaction;
        False when this run already has the item (exactly once). An occurrence deleted since the
        run planned it (``import --replace`` in another process) is recorded without its link."""
        mcid = None if item.dedupe else item.occurrences[0].model_case_id
        try:
            return self._record(item, payload, mcid, duration, worker, test_id)
        except sqlite3.IntegrityError:
            gone = self._deleted_occurrences([mcid, *(j["model_case_id"] for j in payload["judgements"])])
            if not gone:
                raise
            payload = {**payload, "judgements": [{**j, "model_case_id": None} if j["model_case_id"] in gone else j
                                                 for j in payload["judgements"]]}
            return self._record(item, payload, None if mcid in gone else mcid, duration, worker, test_id)

    def _deleted_occurrences(self, ids: list) -> set:
        ids = [i for i in ids if i is not None]
        found = {r[0] for r in self.conn.execute(
            f"SELECT id FROM model_cases WHERE id IN ({', '.join('?' * len(ids))})", ids)} if ids else set()
        return set(ids) - found

    def _record(self, item, payload: Payload, mcid, duration, worker, test_id) -> bool:
        stamp = now()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result_id = None
            res: ResultRow | None = payload.get("result")
            if res is not None:
                row = {"run_id": self.run_id, "signature": item.signature, "model_case_id": mcid,
                       **{k: res.get(k) for k in RESULT_COLUMNS}, "metrics": dumps_measured(res.get("metrics")),
                       "duration": duration, "worker": worker, "test_id": test_id, "created_at": stamp}
                result_id = insert_result(conn, row)
                if result_id is None:
                    conn.execute("ROLLBACK")
                    return False
            inserted = 0
            for j in payload["judgements"]:
                inserted += insert_judgement(conn, {
                    "run_id": self.run_id, "result_id": result_id, "model_case_id": j["model_case_id"],
                    "model": j["model"], "signature": item.signature, "outcome": j["outcome"], "reason": j["reason"],
                    "rtol": j["rtol"], "atol": j["atol"], "stage": j.get("stage"), "triage": j.get("triage"),
                    "triage_where": j.get("triage_where"), "created_at": stamp})
            if result_id is None and inserted == 0:
                conn.execute("ROLLBACK")
                return False
            if not self.device_known and payload.get("device"):
                conn.execute("UPDATE runs SET device = ? WHERE id = ? AND device IS NULL", [payload["device"], self.run_id])
                self.device_known = True
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return True
