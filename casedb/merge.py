"""``casedb merge``: fold runs (with their results and judgements) and any models, cases, blobs
and model cases the target lacks from other casedb files (CI shards) into one; sources are only
read. History rows are written through :mod:`casedb.history`.

A run already in the target (same uid, also as part of a combined run) is not copied again, so
merging the same shard twice changes nothing. ``combine``: all source runs become one run (the
shards of one CI job), its summary computed from the merged rows. A merged run's stored
selection is data only: resuming it asks for its ``--import`` modules again.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from casedb import history
from casedb.errors import CasedbError, NotFound
from casedb.serial import dumps, loads

_COPY_TABLES = ("models", "cases", "blobs")


def merge(target_path: str | os.PathLike, sources: list[str | os.PathLike], *, combine: bool = False) -> dict:
    """Merge ``sources`` into ``target_path`` (created if missing); returns a report."""
    from casedb.store import Store

    target_path = Path(target_path)
    for s in sources:
        if not Path(s).is_file():
            raise NotFound(f"no database file {s}")
        if Path(s).resolve() == target_path.resolve():
            raise CasedbError(f"{s} is the target database itself")
    Store(target_path).close()  # create / migrate the target
    conn = history.connect(target_path)
    report: dict[str, Any] = {"target": str(target_path), "sources": [], "runs": 0, "results": 0, "judgements": 0}
    combined = None
    try:
        for src in sources:
            conn.execute("ATTACH DATABASE ? AS src", [str(src)])
            try:
                conn.execute("BEGIN IMMEDIATE")
                part, combined = _merge_one(conn, str(src), combined if combine else False)
                if combined:
                    _close_combined(conn, combined)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                conn.execute("DETACH DATABASE src")
            report["sources"].append(part)
            for k in ("runs", "results", "judgements"):
                report[k] += part[k]
        if combined:
            report["run_id"] = combined
            report["summary"] = history.get_run(conn, combined)["summary"]
    finally:
        conn.close()
    return report


def _columns(conn, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def _shared_columns(conn, table: str, skip=()) -> list[str]:
    theirs = set(_columns(conn, "src", table))
    return [c for c in _columns(conn, "main", table) if c in theirs and c not in skip]


def _known_uids(conn) -> set:
    uids = {r[0] for r in conn.execute("SELECT uid FROM main.runs WHERE uid IS NOT NULL")}
    for (sel,) in conn.execute("SELECT selection FROM main.runs WHERE selection LIKE '%merged_from%'"):
        uids.update(p.get("uid") for p in (loads(sel) or {}).get("merged_from") or [])
    return uids


def _merge_one(conn, src: str, combined) -> tuple[dict, int | None]:
    """Copy one attached source; ``combined`` is False (copy runs as they are), None (combine,
    no run made yet) or the combined run's id. Returns (report, combined run id)."""
    part = {"source": src, "runs": 0, "runs_already_merged": 0, "results": 0, "judgements": 0,
            "new_cases": 0, "new_models": 0, "conflicts": 0}
    for table in _COPY_TABLES:
        cols = _shared_columns(conn, table)
        cur = conn.execute(f"INSERT OR IGNORE INTO main.{table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM src.{table}")
        if table in ("cases", "models"):
            part[f"new_{table}"] = cur.rowcount
    cols = _shared_columns(conn, "model_cases", skip=("id",))
    conn.execute(f"INSERT OR IGNORE INTO main.model_cases ({', '.join(cols)}) SELECT {', '.join(cols)} FROM src.model_cases")
    # a source occurrence is the target's occurrence with the same (model, name) and signature
    mc_map = {}
    for sid, tid, same in conn.execute("""SELECT s.id, m.id, s.signature = m.signature FROM src.model_cases s
                                          JOIN main.model_cases m ON m.model = s.model AND m.name = s.name"""):
        if same:
            mc_map[sid] = tid
        else:
            part["conflicts"] += 1
    known = _known_uids(conn)
    run_cols = _shared_columns(conn, "runs", skip=("id",))
    res_cols = _shared_columns(conn, "results", skip=("id", "run_id", "model_case_id"))
    for run in [dict(r) for r in conn.execute("SELECT * FROM src.runs ORDER BY id")]:
        uid = run.get("uid") or f"{run.get('host')}:{run.get('started_at')}:{run['id']}"
        if uid in known:
            part["runs_already_merged"] += 1
            continue
        selection = loads(run.get("selection")) or {}
        if combined is False:
            new_run = history.insert_run(conn, {**{c: run.get(c) for c in run_cols}, "uid": uid})
        else:
            if combined is None:
                combined = history.insert_run(conn, {
                    "uid": uuid.uuid4().hex, "started_at": run["started_at"], "status": "finished",
                    "device": run["device"], "backend": run["backend"], "torch_version": run["torch_version"],
                    "casedb_version": run["casedb_version"], "host": run["host"], "args": run["args"],
                    "selection": dumps({"options": {**(selection.get("options") or {}), "shard": None},
                                        "version": selection.get("version"), "merged_from": []})})
            sel = history.get_run(conn, combined)["selection"]
            sel["merged_from"].append(
                {"source": src, "run_id": run["id"], "uid": uid, "status": run["status"], "device": run["device"],
                 "backend": run["backend"], "started_at": run["started_at"], "finished_at": run["finished_at"],
                 "shard": (selection.get("options") or {}).get("shard"), "planned": selection.get("planned")})
            history.set_run(conn, combined, selection=sel)
            new_run = combined
        known.add(uid)
        part["runs"] += 1
        res_map = {}
        for r in conn.execute(f"SELECT id, model_case_id, {', '.join(res_cols)} FROM src.results WHERE run_id = ?",
                              [run["id"]]).fetchall():
            new_id = history.insert_result(conn, {"run_id": new_run, "model_case_id": mc_map.get(r["model_case_id"]),
                                                  **{c: r[c] for c in res_cols}})
            if new_id is not None:
                res_map[r["id"]] = new_id
                part["results"] += 1
        for j in conn.execute("SELECT * FROM src.judgements WHERE run_id = ?", [run["id"]]).fetchall():
            if j["result_id"] is not None and j["result_id"] not in res_map:
                continue  # its result was already in the target run
            part["judgements"] += history.insert_judgement(conn, {
                **{c: j[c] for c in history.JUDGEMENT_COLUMNS if c in j.keys()},
                "run_id": new_run, "result_id": res_map.get(j["result_id"]),
                "model_case_id": mc_map.get(j["model_case_id"])})
        if combined is False:
            history.refresh_summary(conn, new_run)
    return part, (None if combined is False else combined)


def _close_combined(conn, run_id: int) -> None:
    """The combined run's span, status, target and summary, from its parts."""
    parts = history.get_run(conn, run_id)["selection"]["merged_from"]
    status = "finished" if all(p["status"] == "finished" for p in parts) else "interrupted"

    def one(key):
        values = sorted({str(p[key]) for p in parts})
        return values[0] if len(values) == 1 else ",".join(values)

    started = min(p["started_at"] for p in parts if p["started_at"])
    ends = [p["finished_at"] for p in parts if p["finished_at"]]
    history.set_run(conn, run_id, status=status, device=one("device"), backend=one("backend"), started_at=started,
                    finished_at=max(ends) if ends else None)
    planned = [p.get("planned") for p in parts]
    if planned and all(planned):
        totals = {k: sum(p.get(k) or 0 for p in planned) for k in ("cases", "occurrences", "duplicates_skipped")}
        history.update_selection(conn, run_id, planned=totals)
    history.refresh_summary(conn, run_id)
