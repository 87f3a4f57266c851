"""A run's figures, from its rows: counts, the pass rate, where the time went, its failures
grouped by cause (so a resumed or merged run sums every part)."""

from __future__ import annotations

import datetime as _dt
import sqlite3

from casedb import causes, outcomes
from casedb.store import latency, run_scope
from casedb.store.records import RunSummary
from casedb.store.run_rows import get_run


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
