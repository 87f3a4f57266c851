"""The database schema, as sqlite-utils migrations. Imports never alter the schema."""

from __future__ import annotations

from sqlite_utils import Migrations

from casedb import outcomes
from casedb.store.views import REPORT_VIEWS, TALLIES, create_views as _create_views  # noqa: F401 (tests, bench)

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
# (their SQL: casedb.store.views; each view migration below recreates them all)

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


@migrations()
@_recreates_views
def m141_repro_run(db):
    # The repro command the views show names its run (`casedb repro ... --run N`), so the script
    # takes that run's imports, judge and tolerances.
    _create_views(db)


@migrations()
def m152_run_ids_never_reused(db):
    # A deleted run's id is never given again (a report, a triage comment or a CI log that names
    # run 7 must not come to mean another run): the highest id deleted is kept here, by a trigger,
    # and casedb.store.run_rows gives a new run the id after both it and every id in runs.
    db.execute("CREATE TABLE run_id_high_water (id INTEGER NOT NULL)")
    db.execute("INSERT INTO run_id_high_water (id) SELECT ifnull(max(id), 0) FROM runs")
    db.execute("CREATE TRIGGER runs_deleted_high_water AFTER DELETE ON runs BEGIN "
               "UPDATE run_id_high_water SET id = old.id WHERE id < old.id; END")


@migrations()
def m160_explanations(db):
    # What `casedb explain` found for each failure cause of a run (the condition, its confirmation,
    # the layer at fault, the smallest failing case; casedb.explain.report's JSON per cause), and the
    # derived cases it stored: each one's parent and the change that made it (lineage).
    db["explanations"].create(
        {"run_id": int, "position": int, "cause": str, "body": str, "created_at": str},
        pk=("run_id", "position"))  # (no foreign key: `casedb runs delete` needs no knowledge of it)
    db["derived_cases"].create(
        {"signature": str, "parent_signature": str, "transformation": str, "run_id": int, "cause": str,
         "created_at": str},
        pk="signature", foreign_keys=[("signature", "cases", "signature")])


@migrations()
def m170_layout_marks(db):
    # Inputs are shown with their layout (casedb.cases.layout: `fp32[4, 8] transposed`; cases.layout:
    # the case's in one facetable word), and the layout derived marks (noncontiguous, transposed,
    # broadcast, offset) join the others: all recomputed from each case's stored inputs. Signatures
    # do not depend on any of them.
    import json

    from casedb.cases.layout import case_layout, inputs_summary
    from casedb.cases.marks import derive
    from casedb.serial import dumps

    db["cases"].add_column("layout", str)
    updates = []
    for signature, inputs, attrs in db.execute("SELECT signature, inputs, attrs FROM cases").fetchall():
        try:
            inputs, attrs = json.loads(inputs or "[]"), json.loads(attrs or "{}")
            updates.append((dumps(derive(inputs, attrs)), inputs_summary(inputs, attrs), case_layout(inputs, attrs),
                            signature))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            continue  # inputs casedb did not store: the row keeps what it has (a run reports the case)
    db.conn.executemany("UPDATE cases SET marks = ?, shapes = ?, layout = ? WHERE signature = ?", updates)
    db.conn.execute("CREATE INDEX IF NOT EXISTS idx_cases_layout ON cases (layout)")


@migrations()
def m171_int0d_mark(db):
    # The int0d derived mark (casedb.cases.marks: a 0-d integer tensor argument after the first)
    # joins the others: every case's marks recomputed from its stored inputs (signatures unchanged).
    import json

    from casedb.cases.marks import derive
    from casedb.serial import dumps

    updates = []
    for signature, inputs, attrs in db.execute("SELECT signature, inputs, attrs FROM cases").fetchall():
        try:
            updates.append((dumps(derive(json.loads(inputs or "[]"), json.loads(attrs or "{}"))), signature))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            continue  # inputs casedb did not store: the row keeps its marks
    db.conn.executemany("UPDATE cases SET marks = ? WHERE signature = ?", updates)


@migrations()
def m190_run_software(db):
    # What software a run's target is made of (casedb.run.software: the --import modules with
    # their versions and file hashes, torch's version, the environment steering torch and the
    # device): runs on one device name told apart.
    db["runs"].add_column("software", str)


@migrations()
def m202_opid44(db):
    # A case's call identity (casedb.cases.call_identity): the same call written by a scan, a Kineto
    # trace and an Execution Trace (F.linear, aten::linear) has one; an import links a call already
    # stored to its case instead of adding a second. Signatures, names and shipped files unchanged.
    import json

    from casedb.cases.call_identity import identity

    db["cases"].add_column("identity", str)
    updates = []
    for signature, op, inputs, attrs, seed in db.execute("SELECT signature, op, inputs, attrs, seed FROM cases").fetchall():
        try:
            updates.append((identity(op, json.loads(inputs or "[]"), json.loads(attrs or "{}"), seed), signature))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, StopIteration):
            continue  # inputs casedb did not store: the case is its own call only (no identity)
    db.conn.executemany("UPDATE cases SET identity = ? WHERE signature = ?", updates)
    db.conn.execute("CREATE INDEX IF NOT EXISTS idx_cases_identity ON cases (identity)")


@migrations()
def m201_device45(db):
    # What `casedb coverage` predicted for a target before anything ran (casedb.coverage; read and
    # written by casedb.store.coverage): per coverage the target and its figures over every case,
    # per model the enabled cases, torch-level ops and aten operators, the missing kernels ranked,
    # and each case's prediction. `casedb report` and Datasette show the newest coverage of a
    # run's device and backend beside its pass rates (view target_coverage).
    figures = {"cases": int, "traced": int, "untraced": int, "enabled_cases": int, "enabled_cases_pct": float,
               "ops": int, "enabled_ops": int, "enabled_ops_pct": float, "aten_ops": int, "enabled_aten_ops": int,
               "enabled_aten_ops_pct": float}
    db["coverages"].create(
        {"id": int, "created_at": str, "device": str, "dispatch_key": str, "backend": str, "fallback": int,
         "target_problem": str, "selection": str, "software": str, "casedb_version": str, **figures},
        pk="id")
    db["coverages"].create_index(["device", "backend"])
    db["coverage_models"].create({"coverage_id": int, "model": str, **figures}, pk=("coverage_id", "model"),
                                 foreign_keys=[("coverage_id", "coverages", "id")])
    db["coverage_missing"].create(
        {"coverage_id": int, "rank": int, "kernel": str, "cases": int, "unblocks": int, "models": str, "ops": str},
        pk=("coverage_id", "rank"), foreign_keys=[("coverage_id", "coverages", "id")])
    db["coverage_cases"].create(
        {"coverage_id": int, "signature": str, "op": str, "models": str, "enabled": int, "missing": str,
         "aten_ops": str, "traced_on": str, "error": str},
        pk=("coverage_id", "signature"), foreign_keys=[("coverage_id", "coverages", "id")])
    db.execute("""CREATE VIEW target_coverage AS
        SELECT cv.id AS coverage_id, cv.created_at, cv.device, cv.backend, cv.dispatch_key, cm.model, cm.cases,
               cm.traced, cm.untraced, cm.enabled_cases, cm.enabled_cases_pct, cm.ops, cm.enabled_ops,
               cm.enabled_ops_pct, cm.aten_ops, cm.enabled_aten_ops, cm.enabled_aten_ops_pct
        FROM coverages cv JOIN coverage_models cm ON cm.coverage_id = cv.id
        WHERE cv.id = (SELECT max(o.id) FROM coverages o WHERE o.device IS cv.device AND o.backend IS cv.backend)""")
