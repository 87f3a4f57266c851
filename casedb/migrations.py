"""The database schema, as sqlite-utils migrations. Imports never alter the schema."""

from __future__ import annotations

from sqlite_utils import Migrations

migrations = Migrations("casedb")


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
