"""Run history: the ``runs``, ``results`` and ``judgements`` rows. The only module that writes them.

A run is a ``runs`` row (its selection, target, status and summary), a ``results`` row per
executed case and a ``judgements`` row per model occurrence judged. Rows are written by the
recording process as each case's report arrives and committed per case, so a run killed with
SIGKILL keeps everything reported so far, and ``--resume`` runs the rest exactly once (unique
indexes make a second write of the same case a no-op). :func:`summarize` computes a run's
figures from its rows, so a resumed or merged run sums every part.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import sqlite3
import sys
import uuid

from casedb import __version__, causes, outcomes
from casedb.errors import InputError, NotFound
from casedb.serial import dumps, dumps_measured, loads, now
from casedb.store import latency, run_scope
from casedb.store.database import connect as _connect_store
from casedb.store.run_scope import MUTANT_LABEL, NOT_MUTANT_RUN  # noqa: F401 (their home was here)

from casedb.store.records import Payload, ResultRow, RunSummary
from casedb.store.result_columns import RESULT_COLUMNS  # the columns of `results`, listed once there

JUDGEMENT_COLUMNS = ("run_id", "result_id", "model_case_id", "model", "signature", "outcome", "reason", "rtol",
                     "atol", "stage", "triage", "triage_where", "created_at")


def connect(path: str | os.PathLike) -> sqlite3.Connection:
    """The store's connection (casedb.store.database.connect), rows as sqlite3.Row."""
    conn = _connect_store(path)
    conn.row_factory = sqlite3.Row
    return conn


def torch_version() -> str | None:
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # not installed as a distribution: unknown
        return None


# ---------------------------------------------------------------------------------------- runs

# The id a new run gets: after every run there is and every run deleted (ids are never reused;
# migration m152 keeps the highest deleted one).
NEXT_RUN_ID = ("(SELECT max(ifnull((SELECT max(id) FROM runs), 0), ifnull((SELECT max(id) FROM run_id_high_water), 0))"
               " + 1)")


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


# ------------------------------------------------------------------------------------- figures

def summarize(conn: sqlite3.Connection, run_id: int) -> RunSummary:
    """A run's figures, from its rows (so a resumed or merged run sums every part)."""
    run = get_run(conn, run_id)
    sel = run["selection"]
    out: RunSummary = {"run_id": run_id, "status": run["status"], "device": run["device"],
                       "backend": run["backend"], "started_at": run["started_at"],
                       "finished_at": run["finished_at"]}
    out.update(run_counts(conn, run_id))
    out["judge"] = (sel.get("options") or {}).get("judge")
    out["values"] = (sel.get("options") or {}).get("values") or "random"
    # the bias judge (casedb.judge.bias): results it measured, and those it failed (Bias.reason's words)
    out["bias"] = dict(zip(("measured", "biased"), conn.execute(
        """SELECT count(bias_count), count(CASE WHEN outcome = 'failed' AND reason LIKE '%biased rounding%' THEN 1 END)
           FROM results WHERE run_id = ?""", [run_id]).fetchone()))
    # results where the CPU reference's NaN/inf are wrong and the target's agree with the upcast reference
    out["reference_faults"] = conn.execute("""SELECT count(*) FROM results WHERE run_id = ?
                                              AND json_extract(metrics, '$.ref_faults') > 0""", [run_id]).fetchone()[0]
    out["latency"] = latency.totals(conn, run_id)  # casedb run --measure
    out["vacuous"] = conn.execute("SELECT count(*) FROM results WHERE run_id = ? AND vacuous IS NOT NULL",
                                  [run_id]).fetchone()[0]
    out["lowering"] = dict(conn.execute("""SELECT lowering, count(*) FROM results WHERE run_id = ? AND lowering IS NOT NULL
                                           GROUP BY lowering ORDER BY lowering""", [run_id]).fetchall())
    out["stages"] = dict(conn.execute("""SELECT stage, count(*) FROM results WHERE run_id = ? AND stage IS NOT NULL
                                         GROUP BY stage ORDER BY stage""", [run_id]).fetchall())
    # how the judgements read under the run's triage files: new failures apart from regressions
    out["triage"] = dict(conn.execute("""SELECT triage, count(*) FROM judgements WHERE run_id = ? AND triage IS NOT NULL
                                         GROUP BY triage ORDER BY triage""", [run_id]).fetchall())
    out["triage"]["remove"] = conn.execute("""SELECT count(*) FROM judgements WHERE run_id = ? AND triage = 'known'
                                              AND outcome = 'xpassed'""", [run_id]).fetchone()[0]
    out["failures"] = failure_groups(conn, run_id)
    out["planned"] = sel.get("planned")
    out["options"] = sel.get("options")
    out["triage_files"] = list((sel.get("options") or {}).get("triage") or [])
    out["time"] = _times(conn, run_id, out["executed"])
    models: dict[str, dict] = {}
    for model, outcome, n in conn.execute(
            "SELECT model, outcome, count(*) FROM judgements WHERE run_id = ? GROUP BY model, outcome ORDER BY model",
            [run_id]):
        m = models.setdefault(model, dict(dict.fromkeys(outcomes.COUNT_KEYS.values(), 0), occurrences=0))
        m["occurrences"] += n
        if outcome in outcomes.COUNT_KEYS:
            m[outcomes.COUNT_KEYS[outcome]] += n
    out["models"] = models
    if run["started_at"] and run["finished_at"]:
        out["duration_s"] = _r((_dt.datetime.fromisoformat(run["finished_at"])
                                - _dt.datetime.fromisoformat(run["started_at"])).total_seconds())
    # what tells it apart from other runs (casedb.store.run_scope)
    out["front_end"], out["selected"] = run_scope.front_end(sel), run_scope.selection_words(sel)
    out["rerun_of"] = run_scope.rerun_of(conn, run_id)
    return out


def run_counts(conn, run_id: int) -> dict:
    """A run's counts, the one way `casedb run` and `casedb report` count: cases executed (results:
    a case shared by several models counts once), each outcome under its summary name
    (outcomes.COUNT_KEYS: passed does not include xpassed), skipped cases, occurrences judged,
    duplicates skipped, unexpected outcomes, and the pass rate: (passed + xpassed) / the cases
    whose outcome counts as executed (outcomes.Outcome.executed)."""
    sel = get_run(conn, run_id)["selection"]
    counts = dict.fromkeys(outcomes.COUNT_KEYS.values(), 0)
    executed = 0
    for outcome, n in conn.execute("SELECT outcome, count(*) FROM results WHERE run_id = ? GROUP BY outcome", [run_id]):
        executed += n
        if outcome in outcomes.COUNT_KEYS:
            counts[outcomes.COUNT_KEYS[outcome]] += n
    dedupe = (sel.get("options") or {}).get("dedupe", True)
    skipped_q = ("SELECT count(DISTINCT signature) FROM judgements WHERE run_id = ? AND result_id IS NULL" if dedupe
                 else "SELECT count(*) FROM judgements WHERE run_id = ? AND result_id IS NULL")
    counts["skipped"] = conn.execute(skipped_q, [run_id]).fetchone()[0]
    occurrences = conn.execute("SELECT count(*) FROM judgements WHERE run_id = ?", [run_id]).fetchone()[0]
    cases = executed + counts["skipped"]
    judged = sum(counts[o.key] for o in outcomes.OUTCOMES if o.executed)
    passing = sum(counts[o.key] for o in outcomes.OUTCOMES if o.passed)
    return {"executed": executed, **counts, "occurrences": occurrences, "cases": cases,
            "duplicates_skipped": occurrences - cases if dedupe else 0,
            "unexpected": sum(counts[outcomes.COUNT_KEYS[o]] for o in outcomes.UNEXPECTED),
            "pass_rate": round(100.0 * passing / judged, 2) if judged else None}


def _times(conn: sqlite3.Connection, run_id: int, executed: int) -> dict:
    """Where a run's time went: seconds per phase, and milliseconds per case."""
    t = conn.execute("""SELECT sum(t_ref), sum(t_compile), sum(t_exec), sum(duration), count(t_compile), count(t_exec),
                        count(CASE WHEN json_valid(metrics) AND json_extract(metrics, '$.notes.reference_cache') = 'hit'
                              THEN 1 END),
                        count(CASE WHEN json_valid(metrics) AND json_extract(metrics, '$.notes.input_cache') = 'hit'
                              THEN 1 END)
                        FROM results WHERE run_id = ?""", [run_id]).fetchone()
    return {"ref_s": _r(t[0]), "compile_s": _r(t[1]), "exec_s": _r(t[2]), "cases_s": _r(t[3]),
            "references_from_cache": t[6], "inputs_from_cache": t[7],  # casedb.run.refcache
            "compile_ms_per_case": _r(1000 * t[1] / t[4]) if t[4] else None,
            "exec_ms_per_case": _r(1000 * t[2] / t[5]) if t[5] else None,
            "ref_ms_per_case": _r(1000 * t[0] / executed) if executed and t[0] is not None else None}


def _r(x, digits: int = 4):
    return None if x is None else round(float(x), digits)


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


# ------------------------------------------------------------------------------- managing runs



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


def failure_groups(conn: sqlite3.Connection, run_id: int, *, limit: int | None = None) -> list[dict]:
    """The run's failing cases (failed, error, crashed, timeout), grouped by cause: op × stage ×
    the normalized first error line or a wrong result's pattern (:mod:`casedb.causes`), biggest first."""
    failing = sorted(o.name for o in outcomes.OUTCOMES if o.failing)
    groups: dict[tuple, dict] = {}
    for r in conn.execute(
            f"""SELECT r.signature, r.outcome, r.stage, r.error_type, r.error_message, r.reason, c.op,
                       CASE WHEN json_valid(r.metrics) THEN json_extract(r.metrics, '$.pattern') END AS pattern,
                       (SELECT mc.model || '::' || mc.name FROM model_cases mc WHERE mc.signature = r.signature
                        ORDER BY mc.model, mc.name LIMIT 1) AS example, c.shapes
                FROM results r JOIN cases c ON c.signature = r.signature
                WHERE r.run_id = ? AND r.outcome IN ({', '.join('?' * len(failing))})
                ORDER BY c.op, example, r.signature""", [run_id, *failing]):
        why = causes.cause(r[1], r[2], r[3], r[4], r[5], r[7])
        g = groups.setdefault((r[6], why), {"op": r[6], "cause": why, "stage": r[2], "outcome": r[1],
                                            "count": 0, "examples": [], "example_inputs": [], "signatures": []})
        g["count"] += 1
        g["outcome"] = outcomes.worst([g["outcome"], r[1]])
        if len(g["signatures"]) < 20:
            g["signatures"].append(r[0])
        if len(g["examples"]) < 3 and r[8]:
            g["examples"].append(r[8])
            g["example_inputs"].append(r[9])  # (with each tensor's layout: casedb.cases.layout)
    out = sorted(groups.values(), key=lambda g: (-g["count"], g["op"], g["cause"]))
    return out if limit is None else out[:limit]
