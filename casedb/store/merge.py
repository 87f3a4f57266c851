"""``casedb merge``: fold runs (with their results and judgements) and any models, cases, blobs
and model cases the target lacks from other casedb files (CI shards) into one. History rows are
written through :mod:`casedb.store.recorder` and :mod:`casedb.store.run_rows`.

Sources are only read (opened read-only) and may come from anywhere: each is verified whole
before anything is written (:mod:`casedb.store.merge_source`: its schema, every case's signature
against its content, every blob's hash, references, JSON and timestamps), and every source is
merged in one transaction, so a refused source leaves the target as it was. What the target
already has (a case, an occurrence, a model) stays as it is.

A run already in the target (same uid, or listed in a combined run's ``merged_from``) is not
copied again when the target's run holds its results and judgements, so merging the same shard
twice changes nothing; a run whose uid names a target run that lacks its rows (a forged claim, or
a shard resumed since) is copied as a new run that records the uid it came with. ``combine``: all
source runs become one run (the shards of one CI job), its summary computed from the merged rows;
runs of more than one target are refused, and two shards' different outcomes of one case are
conflicts, reported, the worse kept (:mod:`casedb.store.merge_combine`).

A merged run was recorded by another process, often on another host: it keeps no host or pid
(its origin is in ``merged_from``), and one copied while it was running is ``interrupted`` (what
it holds is all there is here; ``--resume`` runs the rest). Its stored selection is data only:
resuming it asks for its ``--import`` modules again.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from casedb.store import merge_combine
from casedb.store.recorder import JUDGEMENT_COLUMNS, insert_judgement, insert_result
from casedb.store.run_lifecycle import refresh_summary
from casedb.store.run_rows import get_run, insert_run, set_run, update_selection
from casedb.errors import CasedbError, NotFound
from casedb.store.merge_source import Source
from casedb.serial import dumps, loads


def merge(target_path: str | os.PathLike, sources: list[str | os.PathLike], *, combine: bool = False) -> dict:
    """Merge ``sources`` into ``target_path`` (created if missing); returns a report."""
    from casedb.store.database import Store

    target_path = Path(target_path)
    opened: list[Source] = []
    try:
        for s in sources:
            _not_the_target(Path(s), target_path)
            opened.append(Source(s))
        with Store(target_path) as target:  # created or migrated if need be
            return _merge_all(target.conn, opened, target_path, combine)
    finally:
        for s in opened:
            s.close()


def _not_the_target(source: Path, target: Path) -> None:
    if not source.is_file():
        raise NotFound(f"no database file {source}")
    if source.resolve() == target.resolve() or (target.exists() and os.path.samefile(source, target)):
        raise CasedbError(f"{source} is the target database itself (or a link to it)")


def _merge_all(conn, sources: list[Source], target_path: Path, combine: bool) -> dict:
    """Every source in one transaction: all of them are merged, or none."""
    report: dict[str, Any] = {"target": str(target_path), "sources": [], "runs": 0, "results": 0, "judgements": 0}
    combined = None if combine else False
    if combine:
        merge_combine.one_target(sources)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for src in sources:
            try:
                part, combined = _merge_one(conn, src, combined)
            except sqlite3.Error as e:
                raise CasedbError(f"{src.where}: cannot merge it ({e}); nothing was merged") from None
            report["sources"].append(part)
            for k in ("runs", "results", "judgements"):
                report[k] += part[k]
        report["conflicts"] = sum(p["conflicts"] for p in report["sources"])
        if combined:
            _close_combined(conn, combined)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if combined:
        report["run_id"] = combined
        report["summary"] = get_run(conn, combined)["summary"]
    return report


def _columns(conn, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]


def _shared(conn, src: Source, table: str, skip=()) -> list[str]:
    theirs = set(src.columns(table))
    return [c for c in _columns(conn, table) if c in theirs and c not in skip]


def _insert(conn, table: str, values: dict):
    cols = list(values)
    return conn.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [values[c] for c in cols])


def _merge_one(conn, src: Source, combined) -> tuple[dict, int | None]:
    """Copy one verified source; ``combined`` is False (copy runs as they are), None (combine,
    no run made yet) or the combined run's id. Returns (report, combined run id)."""
    part = {"source": src.where, "runs": 0, "runs_already_merged": 0, "results": 0, "judgements": 0,
            "new_cases": 0, "new_models": 0, "conflicts": 0}
    names = _copy_models(conn, src, part)
    _copy_blobs(conn, src)
    part["new_cases"] = sum(_insert(conn, "cases", case).rowcount for case in src.cases())
    mc_map = _copy_model_cases(conn, src, names, part)
    claims = _claims(conn)
    run_cols = _shared(conn, src, "runs", skip=("id", "summary"))
    for run in src.conn.execute("SELECT * FROM runs ORDER BY id").fetchall():
        uid = run["uid"] or f"{run['host']}:{run['started_at']}:{run['id']}"
        holders = claims.get(uid)
        if holders and _already_there(conn, src, run["id"], holders, names):
            part["runs_already_merged"] += 1
            continue
        selection = loads(run["selection"]) or {}
        origin = {"source": src.where, "run_id": run["id"], "uid": uid, "status": run["status"],
                  "device": run["device"], "backend": run["backend"], "started_at": run["started_at"],
                  "finished_at": run["finished_at"], "shard": (selection.get("options") or {}).get("shard"),
                  "planned": selection.get("planned"), "host": run["host"]}
        if combined is False:
            # its uid names a target run without its rows (holders): a new identity that keeps the old
            new_run = insert_run(conn, _copied_run(run, run_cols, uuid.uuid4().hex if holders else uid,
                                                           selection, origin))
        else:
            combined = combined or _new_combined(conn, run, selection)
            sel = get_run(conn, combined)["selection"]
            sel["merged_from"].append(origin)
            set_run(conn, combined, selection=sel)
            new_run = combined
        claims.setdefault(uid, []).append(new_run)
        part["runs"] += 1
        _copy_history(conn, src, run["id"], new_run, mc_map, names, part, combining=combined is not False)
        if combined is False:
            refresh_summary(conn, new_run)
    return part, (None if combined is False else combined)


def _copied_run(run, run_cols: list[str], uid: str, selection: dict, origin: dict) -> dict:
    """A source runs row as the target keeps it: no host or pid (no process here records it; its
    origin says where it ran), ``interrupted`` where it was copied while running."""
    kept = {k: v for k, v in selection.items() if k not in ("pid", "resumed")}
    kept["merged_from"] = (selection.get("merged_from") or []) + [origin]
    return {**{c: run[c] for c in run_cols}, "uid": uid, "host": None, "selection": dumps(kept),
            "status": "interrupted" if run["status"] == "running" else run["status"]}


def _copy_models(conn, src: Source, part: dict) -> dict[str, str]:
    """Insert the models the target lacks; returns source name -> the target's name (models
    match by key: gpt_oss there is gpt-oss here)."""
    from casedb.names import model_key

    cols = _shared(conn, src, "models", skip=("key",))
    names = {}
    for row in src.conn.execute(f"SELECT {', '.join(cols)} FROM models"):
        key = model_key(row["name"])
        part["new_models"] += _insert(conn, "models", {**dict(zip(cols, row)), "key": key}).rowcount
        names[row["name"]] = conn.execute("SELECT name FROM models WHERE key = ?", [key]).fetchone()[0]
    return names


def _copy_blobs(conn, src: Source) -> None:
    """Copy the blobs the target lacks, in chunks, hashing the bytes as they are written."""
    from casedb.store.merge_source import copy_blob

    for rowid, sha, size in src.blob_rows().fetchall():
        if conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", [sha]).fetchone():
            continue
        new = conn.execute("INSERT INTO blobs (sha256, data, size) VALUES (?, zeroblob(?), ?)",
                           [sha, size, size]).lastrowid
        with conn.blobopen("blobs", "data", new) as out:
            if copy_blob(src.conn, rowid, size, out) != sha:
                raise CasedbError(f"{src.where}: blob {sha} changed while it was merged; nothing was merged")


def _copy_model_cases(conn, src: Source, names: dict, part: dict) -> dict[int, int]:
    """Insert the occurrences the target lacks; returns source id -> target id for every source
    occurrence the target holds with the same case (the others are conflicts: the target's stays)."""
    cols = _shared(conn, src, "model_cases", skip=("id",))
    mc_map = {}
    for row in src.conn.execute(f"SELECT id, {', '.join(cols)} FROM model_cases").fetchall():
        values = {**{c: row[c] for c in cols}, "model": names[row["model"]]}
        _insert(conn, "model_cases", values)
        mine = conn.execute("SELECT id, signature FROM model_cases WHERE model = ? AND name = ?",
                            [values["model"], values["name"]]).fetchone()
        if mine["signature"] == row["signature"]:
            mc_map[row["id"]] = mine["id"]
        else:
            part["conflicts"] += 1
    return mc_map


def _claims(conn) -> dict[str, list[int]]:
    """Run uid -> the target runs said to hold it: the run with that uid, and each run whose
    ``merged_from`` lists it."""
    out: dict[str, list[int]] = {}
    for run_id, uid, sel in conn.execute("SELECT id, uid, CASE WHEN selection LIKE '%merged_from%' THEN selection END"
                                         " FROM runs"):
        if uid:
            out.setdefault(uid, []).append(run_id)
        for part in _parts(sel):
            out.setdefault(part["uid"], []).append(run_id)
    return out


def _parts(selection: str | None) -> list[dict]:
    """A stored selection's ``merged_from`` entries that name a uid (a file merged before casedb
    checked sources may hold anything there)."""
    try:
        parts = (loads(selection) or {}).get("merged_from") if selection else None
    except (ValueError, AttributeError):
        return []
    return [p for p in parts if isinstance(p, dict) and isinstance(p.get("uid"), str)] if isinstance(parts, list) else []


def _already_there(conn, src: Source, run_id: int, holders: list[int], names: dict) -> bool:
    """Whether the target runs ``holders`` hold every result and judgement of source run ``run_id``."""
    marks = ", ".join("?" * len(holders))
    have = set(map(tuple, conn.execute(f"SELECT signature, outcome FROM results WHERE run_id IN ({marks})", holders)))
    if any(tuple(r) not in have for r in src.conn.execute("SELECT signature, outcome FROM results WHERE run_id = ?",
                                                          [run_id])):
        return False
    have = set(map(tuple, conn.execute(f"SELECT model, signature, outcome FROM judgements WHERE run_id IN ({marks})",
                                       holders)))
    return all((names.get(m, m), s, o) in have for m, s, o in src.conn.execute(
        "SELECT model, signature, outcome FROM judgements WHERE run_id = ?", [run_id]))


def _new_combined(conn, run, selection: dict) -> int:
    return insert_run(conn, {
        "uid": uuid.uuid4().hex, "started_at": run["started_at"], "status": "finished",
        "device": run["device"], "backend": run["backend"], "torch_version": run["torch_version"],
        "casedb_version": run["casedb_version"], "host": None, "args": run["args"],
        "selection": dumps({"options": {**(selection.get("options") or {}), "shard": None},
                            "version": selection.get("version"), "merged_from": []})})


def _copy_history(conn, src: Source, run_id: int, new_run: int, mc_map: dict, names: dict, part: dict, *,
                  combining: bool) -> None:
    """A source run's results and judgements, into target run ``new_run`` (``combining``: a
    combined run, where another shard's row of the same case may be there already)."""
    res_cols = _shared(conn, src, "results", skip=("id", "run_id", "model_case_id"))
    res_map, replaced = {}, set()
    conflicts = merge_combine.Conflicts(conn, src, part) if combining else None
    for r in src.conn.execute(f"SELECT id, model_case_id, {', '.join(res_cols)} FROM results WHERE run_id = ?",
                              [run_id]).fetchall():
        values = {"run_id": new_run, "model_case_id": mc_map.get(r["model_case_id"]), **{c: r[c] for c in res_cols}}
        new_id = insert_result(conn, values)
        if new_id is not None:
            res_map[r["id"]] = new_id
            part["results"] += 1
        elif conflicts and (kept := conflicts.result(values)) is not None:
            res_map[r["id"]] = kept
            replaced.add(r["id"])
    for j in src.conn.execute("SELECT * FROM judgements WHERE run_id = ?", [run_id]).fetchall():
        if j["result_id"] is not None and j["result_id"] not in res_map:
            continue  # its result was already in the target run (and stays)
        values = {**{c: j[c] for c in JUDGEMENT_COLUMNS if c in j.keys()},
                  "run_id": new_run, "result_id": res_map.get(j["result_id"]), "model": names.get(j["model"], j["model"]),
                  "model_case_id": mc_map.get(j["model_case_id"])}
        if insert_judgement(conn, values):
            part["judgements"] += 1
        elif conflicts:
            conflicts.judgement(values, replaced=j["result_id"] in replaced)


def _close_combined(conn, run_id: int) -> None:
    """The combined run's span, status, target and summary, from its parts."""
    parts = get_run(conn, run_id)["selection"]["merged_from"]
    status = "finished" if all(p["status"] == "finished" for p in parts) else "interrupted"

    def one(key):
        values = sorted({str(p[key]) for p in parts})
        return values[0] if len(values) == 1 else ",".join(values)

    started = min((p["started_at"] for p in parts if p["started_at"]), default=None)
    ends = [p["finished_at"] for p in parts if p["finished_at"]]
    set_run(conn, run_id, status=status, device=one("device"), backend=one("backend"), started_at=started,
                    finished_at=max(ends) if ends else None)
    planned = [p.get("planned") for p in parts]
    if planned and all(planned):
        totals = {k: sum(p.get(k) or 0 for p in planned) for k in ("cases", "occurrences", "duplicates_skipped")}
        update_selection(conn, run_id, planned=totals)
    refresh_summary(conn, run_id)
