"""The database schema, as sqlite-utils migrations. Imports never alter the schema."""

from __future__ import annotations

from sqlite_utils import Migrations

from casedb import outcomes

migrations = Migrations("casedb")
# The migrations that drop and recreate every report view (casedb.store.schema_check: while one is
# pending, a file's views may be an older casedb's text).
VIEW_MIGRATIONS: set[str] = set()


def _recreates_views(fn):
    VIEW_MIGRATIONS.add(fn.__name__)
    return fn


@migrations()
def m001_initial(db):
    db["models"].create(
        {"name": str, "key": str, "family": str, "variant_of": str, "source": str,
         "description": str, "defaults": str, "created_at": str, "updated_at": str},
        pk="name",
    )
    db["models"].create_index(["key"], unique=True)
    db["cases"].create(
        {"signature": str, "op": str, "inputs": str, "attrs": str, "dtype": str, "seed": int,
         "marks": str, "shapes": str, "created_at": str},
        pk="signature",
    )
    db["cases"].create_index(["op"])
    db["model_cases"].create(
        {"id": int, "model": str, "signature": str, "name": str, "description": str, "source": str,
         "position": int, "count": int, "marks": str, "dtype": str, "rtol": float, "atol": float,
         "skip_if": str, "expects_error": str, "xfail": str},
        pk="id",
        foreign_keys=[("model", "models", "name"), ("signature", "cases", "signature")],
        not_null={"model", "signature", "name"},
    )
    db["model_cases"].create_index(["model", "name"], unique=True)
    db["model_cases"].create_index(["signature"])
    db["blobs"].create({"sha256": str, "data": bytes, "size": int}, pk="sha256")
    db["runs"].create(
        {"id": int, "started_at": str, "finished_at": str, "status": str, "device": str,
         "backend": str, "torch_version": str, "casedb_version": str, "host": str, "args": str},
        pk="id",
    )
    db["results"].create(
        {"id": int, "run_id": int, "signature": str, "model_case_id": int, "outcome": str,
         "compare_mode": str, "max_abs_err": float, "max_rel_err": float, "mismatch_count": int,
         "nan_inf_mismatch": int, "t_ref": float, "t_compile": float, "t_exec": float,
         "error_type": str, "error_message": str, "traceback": str, "metrics": str, "created_at": str},
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("signature", "cases", "signature"),
                      ("model_case_id", "model_cases", "id")],
    )
    db["results"].create_index(["run_id", "signature"])
    db["results"].create_index(["signature"])


@migrations()
def m002_judgements(db):
    # One execution (results row) is judged once per model occurrence, with that occurrence's
    # own tolerance and expectations; the `verdicts` view (report migrations) joins these.
    db["judgements"].create(
        {"id": int, "run_id": int, "result_id": int, "model_case_id": int, "model": str, "signature": str,
         "outcome": str, "reason": str, "rtol": float, "atol": float, "created_at": str},
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("result_id", "results", "id"),
                      ("model_case_id", "model_cases", "id"), ("model", "models", "name"),
                      ("signature", "cases", "signature")],
    )
    db["judgements"].create_index(["run_id", "model"])
    db["judgements"].create_index(["model_case_id"])
    db["runs"].add_column("summary", str)
    db["runs"].add_column("selection", str)


@migrations()
def m003_run_history(db):
    # uid: a run's identity across databases (`casedb merge` copies a run once, however often
    # it is given the same shard file). reason/duration/worker/test_id: what the runner saw.
    db["runs"].add_column("uid", str)
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_runs_uid ON runs (uid)")
    for col, kind in (("reason", str), ("duration", float), ("worker", str), ("test_id", str)):
        db["results"].add_column(col, kind)
    # Exactly once: a case (or, without dedupe, an occurrence) has at most one result per run,
    # and an occurrence at most one judgement per run, whatever resumes and merges happen.
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_results_once "
               "ON results (run_id, signature, ifnull(model_case_id, 0))")
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_judgements_once "
               "ON judgements (run_id, model_case_id) WHERE model_case_id IS NOT NULL")



# ------------------------------------------------------------------------------- report views
# The RFC's metrics (pass rates, coverage, dedupe, trend, runtime) are defined once, here, as SQL
# views over one classification table: `casedb report` and Datasette both read them. A change to
# a view is a new migration that calls _create_views() again (each view is dropped and
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


def repro_sql(signature: str, model: str, device: str, backend: str) -> str:
    """The `casedb repro` command of a judged occurrence, on its run's device and backend: the
    case by signature prefix (names can hold anything), every other word shell-quoted."""
    return (f"'casedb repro ' || substr({signature}, 1, 16) || ' --model ' || {shell_quote_sql(model)}"
            f" || ifnull(' --device ' || {shell_quote_sql(device)}, '')"
            f" || ifnull(' --backend ' || {shell_quote_sql(backend)}, '')")


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
                          _of('runs', 'backend', 'id', 'j.run_id'))} AS repro
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
               {repro_sql('cj.signature', 'cj.model', 'ru.device', 'ru.backend')} AS repro
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
               {repro_sql('cj.signature', 'cj.model', 'rp.device', 'rp.backend')} AS repro
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


def _create_views(db) -> None:
    for name in reversed(list(REPORT_VIEWS)):  # dependents first
        db.execute(f"DROP VIEW IF EXISTS {name}")
    for name, sql in REPORT_VIEWS.items():
        db.execute(f"CREATE VIEW {name} AS {sql.strip()}")


# judgement_counts: judgements tallied per run x model x op x outcome, kept by triggers. It is
# what makes per-run pass rates cheap: a run of 100k occurrences is a few thousand rows here,
# where counting judgements means joining each one to its case for the op. It holds counts
# only; what an outcome means is in outcome_classes.
_COUNT_KEY = ("{0}.run_id, ifnull({0}.model, '?'), "
              "ifnull((SELECT op FROM cases WHERE signature = {0}.signature), '?'), ifnull({0}.outcome, '?')")


def _count_in(row: str) -> str:
    # (an upsert after INSERT ... SELECT needs the WHERE to parse)
    return (f"INSERT INTO judgement_counts (run_id, model, op, outcome, n) "
            f"SELECT {_COUNT_KEY.format(row)}, 1 WHERE {row}.run_id IS NOT NULL "
            f"ON CONFLICT (run_id, model, op, outcome) DO UPDATE SET n = n + 1;")


def _count_out(row: str) -> str:
    key = f"(run_id, model, op, outcome) = ({_COUNT_KEY.format(row)})"
    return (f"UPDATE judgement_counts SET n = n - 1 WHERE {key};"
            f"DELETE FROM judgement_counts WHERE {key} AND n <= 0;")


@migrations()
@_recreates_views
def m100_views(db):
    db["outcome_classes"].create(
        {"outcome": str, "verdict": str, "executed": int, "passed": int, "failing": int, "meaning": str},
        pk="outcome", replace=True)
    db["outcome_classes"].insert_all(outcomes.class_rows())
    db.execute("""CREATE TABLE IF NOT EXISTS judgement_counts (
        run_id INTEGER NOT NULL, model TEXT NOT NULL, op TEXT NOT NULL, outcome TEXT NOT NULL,
        n INTEGER NOT NULL, PRIMARY KEY (run_id, model, op, outcome)) WITHOUT ROWID""")
    db.execute("DELETE FROM judgement_counts")
    db.execute(f"""INSERT INTO judgement_counts (run_id, model, op, outcome, n)
        SELECT {_COUNT_KEY.format('j')}, count(*) FROM judgements j WHERE j.run_id IS NOT NULL
        GROUP BY 1, 2, 3, 4""")
    for name, body in (
        ("judgement_counts_ai", f"AFTER INSERT ON judgements BEGIN {_count_in('new')} END"),
        ("judgement_counts_ad", f"AFTER DELETE ON judgements BEGIN {_count_out('old')} END"),
        ("judgement_counts_au", "AFTER UPDATE OF run_id, model, signature, outcome ON judgements BEGIN "
                                f"{_count_out('old')} {_count_in('new')} END"),
    ):
        db.execute(f"DROP TRIGGER IF EXISTS {name}")
        db.execute(f"CREATE TRIGGER {name} {body}")
    # The failing (or passing) occurrences of a run, without reading the others.
    db.execute("CREATE INDEX IF NOT EXISTS idx_judgements_run_outcome ON judgements (run_id, outcome)")
    # The slowest cases of a run, in order from the index.
    db.execute("CREATE INDEX IF NOT EXISTS idx_results_run_time ON results "
               "(run_id, (ifnull(t_ref, 0) + ifnull(t_compile, 0) + ifnull(t_exec, 0)))")
    # A run's time split, summed from the index.
    db.execute("CREATE INDEX IF NOT EXISTS idx_results_run_timing ON results (run_id, t_ref, t_compile, t_exec)")
    # Distinct input signatures per model, counted from the index.
    db.execute("CREATE INDEX IF NOT EXISTS idx_model_cases_model_signature ON model_cases (model, signature)")
    _create_views(db)


@migrations()
def m101_search(db):
    # Full-text search over case names and descriptions; triggers keep it in step with imports.
    db["model_cases"].enable_fts(["name", "description"], create_triggers=True, replace=True)


# Named m004 but defined, and so applied, after m101 (sqlite-utils applies migrations in the order
# they are defined); databases record it by this name, so the name stays.
@migrations()
def m004_retired_occurrences(db):
    # `casedb import --replace` retires an occurrence that runs have judged instead of deleting
    # it: results and judgements keep their link (and its name and tolerance); listings and plans
    # skip rows whose retired_at is set. Importing the name again clears it.
    db["model_cases"].add_column("retired_at", str)


@migrations()
@_recreates_views
def m110_quoted_repro(db):
    # The repro command names the case by signature prefix and shell-quotes every other word.
    _create_views(db)


# The dtype defaults (rtol, atol) as casedb.judge.numerics had them when m111 was written, frozen
# here: a migration reads what earlier imports stored, whatever today's policy says.
_M111_DTYPE_TOLERANCES = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7),
    "float8_e4m3fn": (0.125, 1e-3), "float8_e5m2": (0.25, 1e-3), "float8_e4m3fnuz": (0.125, 1e-3),
    "float8_e5m2fnuz": (0.25, 1e-3),
}


@migrations()
def m111_own_tolerances(db):
    # model_cases.rtol/atol hold what the case itself sets; NULL lets casedb.judge.numerics choose per
    # compared dtype. Earlier imports stored the manifest default (or the dtype default) on
    # every case: a value equal to what those defaults gave was not the case's own.
    import json

    models = {name: json.loads(defaults or "{}") for name, defaults in db.execute("SELECT name, defaults FROM models")}
    rows = db.execute("SELECT id, model, dtype, rtol, atol FROM model_cases").fetchall()
    for mcid, model, declared, rtol, atol in rows:
        d = models.get(model) or {}
        case_dtype = declared or d.get("dtype") or "float32"
        dtype_default = _M111_DTYPE_TOLERANCES.get(case_dtype, (0.0, 0.0))
        want = (d.get("rtol", dtype_default[0]), d.get("atol", dtype_default[1]))
        own = (None if rtol == want[0] else rtol, None if atol == want[1] else atol)
        if own != (rtol, atol):
            db.execute("UPDATE model_cases SET rtol = ?, atol = ? WHERE id = ?", [own[0], own[1], mcid])


@migrations()
@_recreates_views
def m112_judging(db):
    # What a result was judged by and what it proves: the failure stage, the judge and where the
    # tolerance came from, the errors in ULPs, whether the reference could catch a bug at all
    # (vacuous), whether the target computed the op (exercised) and what inductor made of it.
    for col, kind in (("stage", str), ("judge", str), ("tolerance", str), ("ulp_err", float),
                      ("ref_ulp_err", float), ("vacuous", str), ("exercised", int), ("lowering", str)):
        db["results"].add_column(col, kind)
    db["judgements"].add_column("stage", str)
    db["outcome_classes"].upsert_all(outcomes.class_rows(), pk="outcome")
    _create_views(db)


@migrations()
@_recreates_views
def m120_blocking_views(db):
    # What blocks what: model_op_failures, model_blockers and op_blocking (casedb report, Datasette).
    _create_views(db)


@migrations()
@_recreates_views
def m121_triage(db):
    # How each judgement reads under the triage files of its run (casedb.triage.entries.verdict): known,
    # new, regression, expected, unspecified, not_supported; and the entry that said so.
    db["judgements"].add_column("triage", str)
    db["judgements"].add_column("triage_where", str)
    _create_views(db)


@migrations()
@_recreates_views
def m130_occurrences_view(db):
    # One definition of an occurrence with its case and marks (the occurrences view), read by the
    # store's listings and the run plan.
    _create_views(db)


@migrations()
def m131_bias_values(db):
    # The bias judge's measure of each result (casedb.judge.bias: the target's mean signed error
    # and its mean toward the reference's magnitude, in ULPs, over bias_count elements) and the
    # inputs' values it ran with (casedb.cases.value_ranges: random or extremal), so the variants
    # of one case stay apart in the same results table.
    for col, kind in (("bias_mean", float), ("bias_toward", float), ("bias_count", int), ("input_values", str)):
        db["results"].add_column(col, kind)


@migrations()
def m132_run_labels(db):
    # A run's label (`casedb run --label`, `casedb runs label`): what a person calls it; mutant
    # runs are labelled by `casedb mutants` so that report and the charts can leave them out.
    db["runs"].add_column("label", str)
    db.execute("CREATE INDEX IF NOT EXISTS idx_runs_label ON runs (label)")
