"""The report views' SQL: the RFC's metrics (pass rates, coverage, dedupe, trend, runtime) defined
once, over one classification table; `casedb report` and Datasette both read them. The view
migrations of :mod:`casedb.store.migrations` (re)create them with :func:`create_views`."""

from __future__ import annotations

# The RFC's metrics (pass rates, coverage, dedupe, trend, runtime) are defined once, here, as SQL
# views over one classification table: `casedb report` and Datasette both read them. A change to
# a view is a new migration that calls create_views() again (each view is dropped and
# recreated). Views name their columns (no `*`): a migration adding table columns leaves them valid.

# How each outcome counts (the `outcome_classes` table, from casedb.outcomes): `executed` is
# what a pass rate divides by (skipped cases and cases whose CPU reference failed say nothing
# about the device); `failing` is what a regression turns into (xfailed is a failure already
# known). xpassed counts as a pass: the op works; `report` lists it as "remove xfail".

_TALLIES = """sum({n}) AS occurrences,
               sum({n} * {c}.executed) AS executed,
               sum({n} * {c}.passed) AS passed,
               sum({n} * ({c}.verdict = 'fail')) AS failed,
               sum({n} * ({c}.verdict = 'error')) AS errors,
               sum({n} * ({c}.verdict = 'xfail')) AS xfailed,
               sum({n} * ({c}.outcome = 'xpassed')) AS xpassed,
               sum({n} * ({c}.verdict = 'skip')) AS skipped,
               sum({n} * ({c}.verdict = 'ref_error')) AS ref_errors,
               sum({n} * ({c}.verdict = 'not_exercised')) AS not_exercised,
               round(100.0 * sum({n} * {c}.passed) / nullif(sum({n} * {c}.executed), 0), 2) AS pass_rate"""
TALLIES = _TALLIES.format(n="vc.n", c="vc")
_RUN_COLS = ("run_id", "started_at", "finished_at", "status", "device", "backend", "torch_version", "occurrences",
             "executed", "passed", "failed", "errors", "xfailed", "xpassed", "skipped", "ref_errors", "not_exercised",
             "pass_rate")


def shell_quote_sql(expr: str) -> str:
    """SQL giving ``expr`` as one POSIX shell word: as it is when it holds only safe characters,
    else in single quotes (each ' written '"'"'), so a pasted command never runs a name."""
    return (f"(CASE WHEN {expr} GLOB '*[^A-Za-z0-9_.,:/=+@%-]*' OR {expr} = '' "
            f"THEN '''' || replace({expr}, '''', '''\"''\"''') || '''' ELSE {expr} END)")


def repro_sql(signature: str, model: str, device: str, backend: str, run_id: str) -> str:
    """The `casedb repro` command of a judged occurrence, on its run's device and backend and as
    that run judged it (``--run``: its imports, judge and tolerances): the case by signature
    prefix (names can hold anything), every other word shell-quoted."""
    return (f"'casedb repro ' || substr({signature}, 1, 16) || ' --model ' || {shell_quote_sql(model)}"
            f" || ifnull(' --device ' || {shell_quote_sql(device)}, '')"
            f" || ifnull(' --backend ' || {shell_quote_sql(backend)}, '')"
            f" || ifnull(' --run ' || {run_id}, '')")


def _of(table: str, col: str, key: str, value: str) -> str:
    return f"(SELECT {col} FROM {table} WHERE {key} = {value})"


# The marks of an occurrence: its case's derived marks and its own, as one sorted JSON array.
# Most occurrences have no marks of their own: then the case's (stored sorted, casedb.cases.marks.
# derive) are the answer as they are, without a JSON union per row.
_MARKS_UNION = """CASE WHEN mc.marks IS NULL OR mc.marks = '[]' THEN ifnull(c.marks, '[]') ELSE
                   (SELECT json_group_array(value) FROM (
                    SELECT value FROM json_each(CASE WHEN json_valid(c.marks) THEN c.marks ELSE '[]' END)
                    UNION SELECT value FROM json_each(CASE WHEN json_valid(mc.marks) THEN mc.marks ELSE '[]' END)
                    ORDER BY 1)) END"""

REPORT_VIEWS = {
    # Every occurrence (model_cases) with its case (cases), and `marks`: the derived and the
    # occurrence's own marks in one sorted array. Retired occurrences too (retired_at set): readers
    # that list or plan filter them out.
    "occurrences": f"""
        SELECT mc.id, mc.model, mc.name, mc.signature, c.op, c.shapes, c.dtype, c.seed, c.inputs, c.attrs,
               c.marks AS derived_marks, mc.marks AS own_marks, {_MARKS_UNION} AS marks,
               mc.description, mc.source, mc.count, mc.position, mc.rtol, mc.atol, mc.dtype AS declared_dtype,
               mc.skip_if, mc.expects_error, mc.xfail, mc.retired_at
        FROM model_cases mc JOIN cases c ON c.signature = mc.signature""",
    # The latest run of each device/backend, and each run's predecessor on the same device/backend.
    "latest_runs": "SELECT max(id) AS run_id, device, backend FROM runs GROUP BY device, backend",
    "run_pairs": """
        SELECT r.id AS run_id,
               (SELECT max(p.id) FROM runs p
                 WHERE p.device IS r.device AND p.backend IS r.backend AND p.id < r.id) AS previous_run_id,
               r.device, r.backend, r.started_at
        FROM runs r""",
    # One row per model occurrence judged in a run, with that occurrence's own tolerance. Details
    # are scalar subqueries, not joins: a count, or a facet on a judgements column, then reads
    # judgements alone (Datasette counts every table page).
    "verdicts": f"""
        SELECT j.id AS judgement_id, j.run_id, {_of('runs', 'device', 'id', 'j.run_id')} AS device,
               {_of('runs', 'backend', 'id', 'j.run_id')} AS backend,
               {_of('runs', 'started_at', 'id', 'j.run_id')} AS run_started_at,
               j.model, {_of('model_cases', 'name', 'id', 'j.model_case_id')} AS case_name, j.model_case_id,
               j.signature, {_of('cases', 'op', 'signature', 'j.signature')} AS op,
               {_of('cases', 'shapes', 'signature', 'j.signature')} AS inputs,
               {_of('cases', 'dtype', 'signature', 'j.signature')} AS dtype, j.outcome,
               ifnull({_of('outcome_classes', 'verdict', 'outcome', 'j.outcome')}, 'unknown') AS verdict,
               j.reason, j.stage, j.rtol, j.atol, j.result_id,
               {', '.join(f"{_of('results', c, 'id', 'j.result_id')} AS {c}" for c in (
                   'max_abs_err', 'max_rel_err', 'mismatch_count', 't_ref', 't_compile', 't_exec', 'error_type',
                   'error_message'))},
               {repro_sql('j.signature', 'j.model', _of('runs', 'device', 'id', 'j.run_id'),
                          _of('runs', 'backend', 'id', 'j.run_id'), 'j.run_id')} AS repro
        FROM judgements j""",
    # judgement_counts with each outcome's class (unknown outcomes count as occurrences only).
    "verdict_counts": """
        SELECT jc.run_id, jc.model, jc.op, jc.outcome, jc.n, ifnull(oc.verdict, 'unknown') AS verdict,
               ifnull(oc.executed, 0) AS executed, ifnull(oc.passed, 0) AS passed,
               ifnull(oc.failing, 0) AS failing
        FROM judgement_counts jc LEFT JOIN outcome_classes oc ON oc.outcome = jc.outcome""",
    # Per run x model x op: the unit of coverage ("the share of a model's ops that pass").
    "model_op_pass_rates": f"""
        SELECT vc.run_id, ru.device, ru.backend, ru.started_at AS run_started_at, vc.model, vc.op,
               {TALLIES},
               -- an op passes for a model when it ran and every executed occurrence passed
               (sum(vc.n * vc.executed) > 0 AND sum(vc.n * vc.executed) = sum(vc.n * vc.passed)) AS op_passes
        FROM verdict_counts vc JOIN runs ru ON ru.id = vc.run_id
        GROUP BY vc.run_id, vc.model, vc.op""",
    "model_pass_rates": f"""
        SELECT vc.run_id, ru.device, ru.backend, ru.started_at AS run_started_at, vc.model,
               {TALLIES},
               count(DISTINCT vc.op) AS ops,
               -- executed ops minus those with an executed occurrence that did not pass
               count(DISTINCT CASE WHEN vc.executed THEN vc.op END)
                 - count(DISTINCT CASE WHEN vc.executed AND NOT vc.passed THEN vc.op END) AS ops_passing,
               round(100.0 * (count(DISTINCT CASE WHEN vc.executed THEN vc.op END)
                 - count(DISTINCT CASE WHEN vc.executed AND NOT vc.passed THEN vc.op END))
                 / nullif(count(DISTINCT vc.op), 0), 2) AS ops_pass_rate
        FROM verdict_counts vc JOIN runs ru ON ru.id = vc.run_id
        GROUP BY vc.run_id, vc.model""",
    "op_pass_rates": f"""
        SELECT vc.run_id, ru.device, ru.backend, ru.started_at AS run_started_at, vc.op,
               {TALLIES},
               count(DISTINCT vc.model) AS models
        FROM verdict_counts vc JOIN runs ru ON ru.id = vc.run_id
        GROUP BY vc.run_id, vc.op""",
    # What a model's case set covers, whatever has run: occurrences and distinct input signatures.
    "model_coverage": """
        SELECT m.name AS model,
               (SELECT count(*) FROM model_cases mc WHERE mc.model = m.name AND mc.retired_at IS NULL) AS cases,
               (SELECT count(DISTINCT mc.signature) FROM model_cases mc
                 WHERE mc.model = m.name AND mc.retired_at IS NULL) AS signatures
        FROM models m""",
    # Every pair of runs, occurrence by occurrence (cj: current, bj: base). Read it with run_id and
    # base_run_id fixed. Outcomes are compared before any detail is joined (LEFT JOINs keep their
    # order), so a filter on `change` costs an index lookup per occurrence, not five.
    "verdict_changes": f"""
        SELECT cj.run_id, bj.run_id AS base_run_id, ru.device, ru.backend,
               cj.model, mc.name AS case_name, cj.model_case_id, cj.signature, c.op, c.shapes AS inputs, c.dtype,
               bj.outcome AS base_outcome, cj.outcome,
               CASE WHEN bo.passed AND co.failing THEN 'regression'
                    WHEN bo.executed AND NOT bo.passed AND co.passed THEN 'fix'
                    WHEN ifnull(bo.verdict, 'unknown') = ifnull(co.verdict, 'unknown') THEN 'same'
                    ELSE 'changed' END AS change,
               br.max_abs_err AS base_max_abs_err, cr.max_abs_err,
               CASE WHEN br.max_abs_err > 0 THEN cr.max_abs_err / br.max_abs_err END AS err_growth,
               cr.error_type, cr.error_message, cj.rtol, cj.atol, cj.id AS judgement_id,
               {repro_sql('cj.signature', 'cj.model', 'ru.device', 'ru.backend', 'cj.run_id')} AS repro
        FROM judgements cj
        JOIN judgements bj ON bj.model_case_id = cj.model_case_id
        JOIN runs ru ON ru.id = cj.run_id
        LEFT JOIN outcome_classes co ON co.outcome = cj.outcome
        LEFT JOIN outcome_classes bo ON bo.outcome = bj.outcome
        LEFT JOIN model_cases mc ON mc.id = cj.model_case_id
        LEFT JOIN cases c ON c.signature = cj.signature
        LEFT JOIN results cr ON cr.id = cj.result_id
        LEFT JOIN results br ON br.id = bj.result_id""",
    # New regressions: passed in the previous run of the same device/backend, failing now.
    # (Outcome sets as IN subqueries: the (run_id, outcome) index finds the failing ones directly.)
    "regressions": f"""
        SELECT cj.run_id, bj.run_id AS previous_run_id, rp.device, rp.backend,
               cj.model, mc.name AS case_name, c.op, c.shapes AS inputs, c.dtype,
               bj.outcome AS previous_outcome, cj.outcome, cr.error_type, cr.error_message,
               br.max_abs_err AS previous_max_abs_err, cr.max_abs_err, cj.rtol, cj.atol,
               cj.model_case_id, cj.signature, cj.id AS judgement_id,
               {repro_sql('cj.signature', 'cj.model', 'rp.device', 'rp.backend', 'cj.run_id')} AS repro
        FROM run_pairs rp
        JOIN judgements cj ON cj.run_id = rp.run_id
        JOIN judgements bj ON bj.run_id = rp.previous_run_id AND bj.model_case_id = cj.model_case_id
        LEFT JOIN model_cases mc ON mc.id = cj.model_case_id
        LEFT JOIN cases c ON c.signature = cj.signature
        LEFT JOIN results cr ON cr.id = cj.result_id
        LEFT JOIN results br ON br.id = bj.result_id
        WHERE cj.outcome IN (SELECT outcome FROM outcome_classes WHERE failing)
          AND bj.outcome IN (SELECT outcome FROM outcome_classes WHERE passed)""",
    # Per executed case: where its time went (reference, compile, device) and which models use it.
    "case_runtimes": """
        SELECT r.run_id, r.id AS result_id, r.signature, c.op, c.shapes AS inputs, c.dtype, r.outcome,
               (SELECT group_concat(model, ', ') FROM (SELECT DISTINCT mc.model FROM model_cases mc
                 WHERE mc.signature = r.signature ORDER BY mc.model)) AS models,
               r.t_ref, r.t_compile, r.t_exec,
               ifnull(r.t_ref, 0) + ifnull(r.t_compile, 0) + ifnull(r.t_exec, 0) AS t_total
        FROM results r LEFT JOIN cases c ON c.signature = r.signature""",
    # Per run x op: what the compiler made of the op (inductor: generated code, extern kernels,
    # ATen fallbacks; "none": views and copies only) — the RFC's "% of enabled OpFuncs".
    "op_lowering": """
        SELECT r.run_id, c.op, count(*) AS cases,
               sum(r.lowering = 'generated') AS generated, sum(r.lowering = 'extern') AS extern,
               sum(r.lowering = 'fallback') AS fallback, sum(r.lowering = 'mixed') AS mixed,
               sum(r.lowering = 'none') AS no_kernel,
               round(100.0 * sum(r.lowering = 'generated') / count(*), 1) AS generated_pct
        FROM results r JOIN cases c ON c.signature = r.signature
        WHERE r.lowering IS NOT NULL
        GROUP BY r.run_id, c.op""",
    # Per run: the cases that cannot catch a bug (the reference is all zeros or one value) and the
    # cases the target never computed: neither proves anything about the target.
    "unproven_cases": """
        SELECT r.run_id, r.id AS result_id, r.signature, c.op, c.shapes AS inputs, c.dtype, r.outcome,
               CASE WHEN r.outcome = 'not_exercised' THEN 'not exercised' ELSE 'vacuous: ' || r.vacuous END AS why,
               r.reason,
               (SELECT group_concat(model, ', ') FROM (SELECT DISTINCT mc.model FROM model_cases mc
                 WHERE mc.signature = r.signature ORDER BY mc.model)) AS models
        FROM results r LEFT JOIN cases c ON c.signature = r.signature
        WHERE r.vacuous IS NOT NULL OR r.outcome = 'not_exercised'""",
    # Per run: verdict totals (the trend). Grouped by run, device and backend (the last two follow
    # from the run) so a filter on any of them reaches the counts.
    "run_pass_rates": f"""
        SELECT ru.id AS run_id, ru.started_at, ru.finished_at, ru.status, ru.device, ru.backend,
               ru.torch_version, {_TALLIES.format(n='jc.n', c='oc')}
        FROM runs ru
        LEFT JOIN judgement_counts jc ON jc.run_id = ru.id
        LEFT JOIN outcome_classes oc ON oc.outcome = jc.outcome
        GROUP BY ru.id, ru.device, ru.backend""",
    # ... with dedupe (occurrences judged vs cases executed) and where the time went, summed per
    # run from the (run_id, t_ref, t_compile, t_exec) index, for the runs selected only.
    "run_summaries": f"""
        SELECT {', '.join('p.' + c for c in _RUN_COLS)},
               (SELECT count(*) FROM results r WHERE r.run_id = p.run_id) AS executions,
               p.occurrences - (SELECT count(*) FROM results r WHERE r.run_id = p.run_id) AS dedupe_saved,
               (SELECT round(sum(r.t_ref), 6) FROM results r WHERE r.run_id = p.run_id) AS t_ref,
               (SELECT round(sum(r.t_compile), 6) FROM results r WHERE r.run_id = p.run_id) AS t_compile,
               (SELECT round(sum(r.t_exec), 6) FROM results r WHERE r.run_id = p.run_id) AS t_exec
        FROM run_pass_rates p""",
    # What blocks what. A model is blocked by an op when any of its cases of that op fails in the
    # run (failed, error, crashed, timeout, or xfailed: a known failure still blocks). Per run,
    # model and op: the occurrences and how many fail (the model x op matrix).
    "model_op_failures": """
        SELECT vc.run_id, vc.model, vc.op, sum(vc.n) AS occurrences,
               sum(vc.n * (vc.failing OR vc.verdict = 'xfail')) AS failing,
               sum(vc.n * (vc.failing OR vc.verdict = 'xfail')) > 0 AS blocked
        FROM verdict_counts vc
        GROUP BY vc.run_id, vc.model, vc.op""",
    # Per run and model: the ops it calls and the ops that block it.
    "model_blockers": """
        SELECT f.run_id, f.model, count(*) AS ops, sum(f.blocked) AS blocking_ops,
               group_concat(CASE WHEN f.blocked THEN f.op END, ', ') AS blocked_by
        FROM model_op_failures f
        GROUP BY f.run_id, f.model""",
    # Per run and op: the models it blocks (rank by models_blocked), the models that call it, and
    # unblocks: the models it alone blocks (fixing it makes them pass every op).
    "op_blocking": """
        SELECT f.run_id, ru.device, ru.backend, f.op, sum(f.blocked) AS models_blocked, count(*) AS models,
               sum(f.blocked AND mb.blocking_ops = 1) AS unblocks, sum(f.failing) AS failing,
               sum(f.occurrences) AS occurrences,
               group_concat(CASE WHEN f.blocked THEN f.model || ' (' || f.failing || '/' || f.occurrences || ')' END,
                            ', ') AS blocked_models
        FROM model_op_failures f
        JOIN runs ru ON ru.id = f.run_id
        JOIN model_blockers mb ON mb.run_id = f.run_id AND mb.model = f.model
        GROUP BY f.run_id, f.op""",
}


def create_views(db) -> None:
    for name in reversed(list(REPORT_VIEWS)):  # dependents first
        db.execute(f"DROP VIEW IF EXISTS {name}")
    for name, sql in REPORT_VIEWS.items():
        db.execute(f"CREATE VIEW {name} AS {sql.strip()}")


