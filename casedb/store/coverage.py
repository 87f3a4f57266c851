"""Stored coverage predictions (``casedb coverage``; tables ``coverages``, ``coverage_models``,
``coverage_missing``, ``coverage_cases`` of migration m201): written whole in one transaction,
read back by id or as the newest of a device and backend."""

from __future__ import annotations

import sqlite3

from casedb import __version__
from casedb.serial import dumps, loads, now

FIGURES = ("cases", "traced", "untraced", "enabled_cases", "enabled_cases_pct", "ops", "enabled_ops",
           "enabled_ops_pct", "aten_ops", "enabled_aten_ops", "enabled_aten_ops_pct")
_HEAD = ("id", "created_at", "device", "dispatch_key", "backend", "fallback", "target_problem", "selection",
         "software", "casedb_version")
_CASE = ("signature", "op", "models", "enabled", "missing", "aten_ops", "traced_on", "error")


def _insert(conn: sqlite3.Connection, table: str, row: dict) -> int:
    cols = list(row)
    cur = conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       [row[c] for c in cols])
    return cur.lastrowid


def save(conn: sqlite3.Connection, report: dict, *, selection: dict, software: dict) -> int:
    """Store a coverage report (casedb.coverage.measure's, cases included); its new id."""
    totals = report["totals"]
    with conn:
        cid = _insert(conn, "coverages", {
            "created_at": now(), "device": report["device"], "dispatch_key": report["dispatch_key"],
            "backend": report["backend"], "fallback": int(bool(report["fallback"])),
            "target_problem": report.get("target_problem"), "selection": dumps(selection),
            "software": dumps(software), "casedb_version": __version__, **{k: totals[k] for k in FIGURES}})
        for m in report["models"]:
            _insert(conn, "coverage_models", {"coverage_id": cid, "model": m["model"], **{k: m[k] for k in FIGURES}})
        for rank, m in enumerate(report["missing"], 1):
            _insert(conn, "coverage_missing", {"coverage_id": cid, "rank": rank, "kernel": m["kernel"],
                                               "cases": m["cases"], "unblocks": m["unblocks"],
                                               "models": dumps(m["models"]), "ops": dumps(m["ops"])})
        conn.executemany(
            f"INSERT OR IGNORE INTO coverage_cases (coverage_id, {', '.join(_CASE)}) VALUES (?{', ?' * len(_CASE)})",
            [(cid, c["signature"], c["op"], dumps(c["models"]), None if c["enabled"] is None else int(c["enabled"]),
              dumps(c["missing"]), dumps(c["aten_ops"]), c["traced_on"], c["error"]) for c in report["cases"]])
    return cid


def newest(conn: sqlite3.Connection, device: str | None, backend: str | None) -> int | None:
    """The id of the newest coverage of ``device`` and ``backend`` (None: never measured)."""
    return conn.execute("SELECT max(id) FROM coverages WHERE device IS ? AND backend IS ?",
                        [device, backend]).fetchone()[0]


def _json(text, kind: type):
    """A stored JSON value of type ``kind`` (list: of strings), else an empty one: a file edited by
    hand reads as "nothing known", never as an error in the middle of a report."""
    try:
        value = loads(text)
    except (ValueError, TypeError, RecursionError):
        return kind()
    if not isinstance(value, kind):
        return kind()
    return [str(v) for v in value] if kind is list else value


def _dicts(cur) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def load(conn: sqlite3.Connection, coverage_id: int, *, cases: bool = True) -> dict | None:
    """Coverage ``coverage_id`` as casedb.coverage.measure reports it (``totals``, ``models``,
    ``missing``, ``cases`` when asked), with its ``id``, ``created_at``, ``selection`` and
    ``software``; None when there is no such coverage."""
    head = _dicts(conn.execute(f"SELECT {', '.join(_HEAD + FIGURES)} FROM coverages WHERE id = ?", [coverage_id]))
    if not head:
        return None
    h = head[0]
    out = {k: h[k] for k in _HEAD}
    out.update(fallback=bool(h["fallback"]), selection=_json(h["selection"], dict),
               software=_json(h["software"], dict))
    out["totals"] = {"model": "all", **{k: h[k] for k in FIGURES}}
    out["models"] = _dicts(conn.execute(f"SELECT model, {', '.join(FIGURES)} FROM coverage_models"
                                        " WHERE coverage_id = ? ORDER BY model", [coverage_id]))
    out["missing"] = [dict(m, models=_json(m["models"], list), ops=_json(m["ops"], list)) for m in _dicts(
        conn.execute("SELECT kernel, cases, unblocks, models, ops FROM coverage_missing WHERE coverage_id = ?"
                     " ORDER BY rank", [coverage_id]))]
    if cases:
        out["cases"] = [_case(c) for c in _dicts(conn.execute(
            f"SELECT {', '.join(_CASE)} FROM coverage_cases WHERE coverage_id = ? ORDER BY signature", [coverage_id]))]
    return out


def _case(c: dict) -> dict:
    return {**c, "models": _json(c["models"], list), "enabled": None if c["enabled"] is None else bool(c["enabled"]),
            "missing": _json(c["missing"], list), "aten_ops": _json(c["aten_ops"], list)}

