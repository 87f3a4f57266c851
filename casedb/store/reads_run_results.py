"""A run's results as the commands that compare or replay them read them: `casedb mutants`
(:mod:`casedb.mutation.score`: each result with its case, the occurrences judged),
`casedb coverage --against` (:mod:`casedb.coverage.agreement`: outcomes and error messages) and
`casedb repro --run` (:mod:`casedb.read.repro_run`: one case's result and judgement)."""

from __future__ import annotations

_RESULTS_WITH_CASES = """SELECT r.signature, r.outcome, r.reason, r.max_abs_err, r.max_rel_err, r.ulp_err,
                                r.ref_ulp_err, r.bias_toward, r.bias_count, r.tolerance, r.metrics, c.op, c.inputs,
                                c.attrs
                         FROM results r JOIN cases c ON c.signature = r.signature
                         WHERE r.run_id = ? ORDER BY r.id"""


def results_with_cases(conn, run_id: int) -> list[dict]:
    """Run ``run_id``'s results in the order recorded, each with its case's op, inputs and attrs
    (metrics, inputs and attrs as JSON text); ``conn`` returns rows by name (Store.conn)."""
    return [dict(r) for r in conn.execute(_RESULTS_WITH_CASES, [run_id])]


def judged_occurrences(conn, run_id: int) -> list[tuple[str, str, str]]:
    """(signature, model, case name) of each occurrence run ``run_id`` judged, in judged order."""
    return [tuple(r) for r in conn.execute("""SELECT j.signature, j.model, mc.name FROM judgements j
                                              JOIN model_cases mc ON mc.id = j.model_case_id
                                              WHERE j.run_id = ? ORDER BY j.id""", [run_id])]


def run_exists(db, run_id: int) -> bool:
    return db.execute("SELECT 1 FROM runs WHERE id = ?", [run_id]).fetchone() is not None


def result_errors(db, run_id: int) -> list[tuple]:
    """(signature, outcome, error message) of each result of run ``run_id``."""
    return db.execute("SELECT signature, outcome, error_message FROM results WHERE run_id = ?", [run_id]).fetchall()


def case_result(db, run_id: int, signature: str) -> tuple | None:
    """(outcome, judge, metrics) of run ``run_id``'s first result of case ``signature``, or None."""
    return db.execute("SELECT outcome, judge, metrics FROM results WHERE run_id = ? AND signature = ? "
                      "ORDER BY id LIMIT 1", [run_id, signature]).fetchone()


def case_judgement(db, run_id: int, signature: str, model: str) -> tuple | None:
    """(outcome, rtol, atol) of run ``run_id``'s first judgement of case ``signature`` in ``model``, or None."""
    return db.execute("SELECT outcome, rtol, atol FROM judgements WHERE run_id = ? AND signature = ? AND model = ? "
                      "ORDER BY id LIMIT 1", [run_id, signature, model]).fetchone()
