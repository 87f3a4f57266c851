"""What `casedb report` reads (:mod:`casedb.read.report`): one run's rows of the report views
(:mod:`casedb.store.views`), the baseline and the trend. Each function takes anything with
``execute`` (a sqlite-utils Database, a connection) and returns rows as dicts.
"""

from __future__ import annotations

from typing import Any, Iterable

from casedb.store import run_scope

MODEL_COLS = ("model", "occurrences", "executed", "passed", "failed", "errors", "xfailed", "xpassed", "skipped",
              "ref_errors", "not_exercised", "pass_rate", "ops", "ops_passing", "ops_pass_rate")
OP_COLS = ("op", "occurrences", "executed", "passed", "failed", "errors", "xfailed", "xpassed", "skipped",
           "ref_errors", "pass_rate", "models")
VERDICT_COLS = ("model", "case_name", "op", "inputs", "dtype", "outcome", "stage", "reason", "error_type",
                "error_message", "max_abs_err", "rtol", "atol", "repro")
CHANGE_COLS = ("model", "case_name", "op", "inputs", "dtype", "base_outcome", "outcome", "base_max_abs_err",
               "max_abs_err", "err_growth", "error_type", "error_message", "rtol", "atol", "repro")
BLOCKING_COLS = ("op", "models_blocked", "models", "unblocks", "failing", "occurrences", "blocked_models")


def rows(db, sql: str, params: Iterable[Any] = ()) -> list[dict]:
    """The rows of ``sql`` as dicts (column name -> value), whatever the connection's row type."""
    cur = db.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _cols(cols: Iterable[str]) -> str:
    return ", ".join(cols)


def latest_run_id(db) -> int | None:
    """Id of the newest full run: not a `casedb mutants` run, nor a partial rerun of an earlier
    run (casedb.store.run_scope); the newest run where there are only those; None for no run."""
    run_id = db.execute(run_scope.LATEST_FULL_RUN).fetchone()[0]
    return run_id if run_id is not None else db.execute("SELECT max(id) FROM runs").fetchone()[0]


def run_summary(db, run_id: int) -> dict:
    """The run's ``run_summaries`` row."""
    return rows(db, "SELECT * FROM run_summaries WHERE run_id = ?", [run_id])[0]


def previous_run(db, run_id: int) -> int | None:
    """The previous run on the same device and backend (``run_pairs``), None for a first run."""
    return db.execute("SELECT previous_run_id FROM run_pairs WHERE run_id = ?", [run_id]).fetchone()[0]


def slowest_cases(db, run_id: int, top: int) -> list[dict]:
    return rows(db, "SELECT signature, op, inputs, dtype, models, outcome, t_ref, t_compile,"
                    " t_exec, t_total FROM case_runtimes WHERE run_id = ?"
                    " ORDER BY t_total DESC LIMIT ?", [run_id, top])


def model_coverage(db) -> dict[str, dict]:
    """model -> its cases and distinct signatures."""
    return {r["model"]: r for r in rows(db, "SELECT model, cases, signatures FROM model_coverage")}


def model_pass_rates(db, run_id: int) -> list[dict]:
    return rows(db, f"SELECT {_cols(MODEL_COLS)} FROM model_pass_rates WHERE run_id = ?"
                    " ORDER BY pass_rate, model", [run_id])


def op_pass_rates(db, run_id: int) -> list[dict]:
    return rows(db, f"SELECT {_cols(OP_COLS)} FROM op_pass_rates WHERE run_id = ?"
                    " ORDER BY pass_rate, failed + errors DESC, op", [run_id])


def failing_verdicts(db, run_id: int) -> list[dict]:
    """The run's failing judgements (with each one's case signature), by op, model and case."""
    return rows(db, f"SELECT {_cols(VERDICT_COLS)}, signature FROM verdicts WHERE run_id = ?"
                    " AND outcome IN (SELECT outcome FROM outcome_classes WHERE failing)"
                    " ORDER BY op, model, case_name", [run_id])


def xpassed_verdicts(db, run_id: int) -> list[dict]:
    """Cases marked xfail that passed (tt-xla's triage rule: they should lose the mark)."""
    return rows(db, f"SELECT {_cols(VERDICT_COLS)} FROM verdicts WHERE run_id = ?"
                    " AND outcome = 'xpassed' ORDER BY model, op, case_name", [run_id])


def unproven_cases(db, run_id: int) -> list[dict]:
    """Cases the target never computed, and cases whose reference a trivial target would match."""
    return rows(db, "SELECT op, inputs, dtype, outcome, why, reason, models FROM unproven_cases"
                    " WHERE run_id = ? ORDER BY why, op, inputs", [run_id])


def reference_faults(db, run_id: int) -> list[dict]:
    """Where the CPU reference's NaN/inf are wrong and the target agrees with the upcast reference."""
    return rows(db, """
        SELECT c.op, c.shapes AS inputs, c.dtype, r.outcome, json_extract(r.metrics, '$.ref_faults') AS elements,
               (SELECT group_concat(model, ', ') FROM (SELECT DISTINCT mc.model FROM model_cases mc
                 WHERE mc.signature = r.signature ORDER BY mc.model)) AS models
        FROM results r LEFT JOIN cases c ON c.signature = r.signature
        WHERE r.run_id = ? AND json_extract(r.metrics, '$.ref_faults') > 0 ORDER BY c.op, c.shapes""", [run_id])


def op_lowering(db, run_id: int) -> list[dict]:
    return rows(db, "SELECT op, cases, generated, extern, fallback, mixed, no_kernel, generated_pct"
                    " FROM op_lowering WHERE run_id = ? ORDER BY generated_pct, op", [run_id])


def stage_counts(db, run_id: int) -> list[dict]:
    return rows(db, "SELECT stage, count(*) AS cases FROM results WHERE run_id = ? AND stage IS NOT NULL"
                    " GROUP BY stage ORDER BY cases DESC, stage", [run_id])


def op_blocking(db, run_id: int) -> list[dict]:
    """Ops by the models they block."""
    return rows(db, f"SELECT {_cols(BLOCKING_COLS)} FROM op_blocking WHERE run_id = ?"
                    " AND models_blocked > 0 ORDER BY models_blocked DESC, unblocks DESC,"
                    " failing DESC, op", [run_id])


def blocking_matrix(db, run_id: int) -> list[dict]:
    """The model x op counts of the ops that block a model."""
    return rows(db, "SELECT op, model, failing, occurrences FROM model_op_failures"
                    " WHERE run_id = ? AND op IN (SELECT op FROM model_op_failures"
                    " WHERE run_id = ? AND blocked) ORDER BY op, model", [run_id, run_id])


def judged_outputs(db, run_id: int) -> list[tuple]:
    """(signature, its tolerances as JSON text, its wrong result's pattern) of each result of the
    run whose metrics are JSON."""
    return db.execute("SELECT signature, json_extract(metrics, '$.tolerances'), json_extract(metrics, '$.pattern')"
                      " FROM results WHERE run_id = ? AND json_valid(metrics)", [run_id]).fetchall()


# xfailed judgements of occurrences that declare an expected error and no xfail of their own
_EXPECTED_ERRORS = """SELECT j.model, c.op, count(*) FROM judgements j
          JOIN model_cases mc ON mc.id = j.model_case_id JOIN cases c ON c.signature = j.signature
          WHERE j.run_id = ? AND j.outcome = 'xfailed' AND mc.expects_error IS NOT NULL
            AND mc.expects_error != 'null' AND (mc.xfail IS NULL OR mc.xfail = 'null')
          GROUP BY j.model, c.op"""


def expected_error_counts(conn, run_id: int) -> dict[tuple[str, str], int]:
    """(model, op) -> the run's judgements that are a manifest-declared error raised as declared
    (:mod:`casedb.read.expected_errors`)."""
    return {(m, op): n for m, op, n in conn.execute(_EXPECTED_ERRORS, [run_id])}


def baseline_row(db, run_id: int) -> dict:
    return rows(db, "SELECT id AS run_id, started_at, status, device, backend FROM runs WHERE id = ?", [run_id])[0]


_CHANGES = f"SELECT {_cols(CHANGE_COLS)} FROM verdict_changes WHERE run_id = ? AND base_run_id = ?"
_ORDER = " ORDER BY model, op, case_name"


def regressions(db, run_id: int, base: int) -> list[dict]:
    # (the outcome filter only narrows what `change` decides: it lets the (run_id, outcome)
    # index find the failing occurrences instead of comparing every one)
    return rows(db, _CHANGES + " AND change = 'regression' AND outcome IN"
                " (SELECT outcome FROM outcome_classes WHERE failing)" + _ORDER, [run_id, base])


def fixes(db, run_id: int, base: int) -> list[dict]:
    return rows(db, _CHANGES + " AND change = 'fix'" + _ORDER, [run_id, base])


def error_growth(db, run_id: int, base: int, error_factor: float) -> list[dict]:
    return rows(db, _CHANGES + " AND err_growth > ? ORDER BY err_growth DESC, model, case_name",
                [run_id, base, error_factor])


def trend(db, device, backend, run_id: int, count: int) -> list[dict]:
    """The last ``count`` runs on ``device``/``backend`` up to ``run_id``, newest first, with
    their pass rates and new regressions."""
    # The runs first (a list of ids reaches into the grouped view; ORDER BY ... LIMIT would not).
    ids = [r[0] for r in db.execute("SELECT id FROM runs WHERE device IS ? AND backend IS ? AND id <= ?"
                                    " ORDER BY id DESC LIMIT ?", [device, backend, run_id, count]).fetchall()]
    return rows(
        db, "SELECT s.run_id, s.started_at, s.status, s.occurrences, s.executed, s.passed, s.failed, s.errors,"
            " s.pass_rate, (SELECT count(*) FROM regressions g WHERE g.run_id = s.run_id) AS new_regressions"
            f" FROM run_pass_rates s WHERE s.run_id IN ({', '.join('?' * len(ids))}) ORDER BY s.run_id DESC", ids)
