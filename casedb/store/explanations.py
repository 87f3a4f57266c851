"""What `casedb explain` reads and writes: a run's cases with their outcome and failure cause, the
tolerances their occurrences judge them with, the explanations per cause (table
``explanations``) and the derived cases' lineage (``derived_cases``); and removing the cases
that only a round of variants used.
"""

from __future__ import annotations

import sqlite3

from casedb import causes, outcomes
from casedb.serial import dumps, loads, now

_RESULTS = """SELECT r.signature, r.outcome, r.stage, r.error_type, r.error_message, r.reason,
       CASE WHEN json_valid(r.metrics) THEN json_extract(r.metrics, '$.pattern') END AS pattern,
       r.max_abs_err, r.max_rel_err, r.ulp_err, r.input_values,
       ifnull(r.t_ref, 0) + ifnull(r.t_compile, 0) + ifnull(r.t_exec, 0) AS seconds,
       c.op, c.inputs, c.attrs, c.dtype, c.seed
FROM results r JOIN cases c ON c.signature = r.signature WHERE r.run_id = ? ORDER BY r.id"""


def run_cases(conn: sqlite3.Connection, run_id: int) -> list[dict]:
    """Every result of run ``run_id`` as {signature, op, inputs, attrs, dtype, seed, outcome,
    failing, cause, max_abs_err, ulp_err, values, seconds} (the cause as
    :func:`casedb.causes.cause` groups failures)."""
    failing = {o.name for o in outcomes.OUTCOMES if o.failing}
    out = []
    for r in conn.execute(_RESULTS, [run_id]).fetchall():
        r = tuple(r)
        bad = r[1] in failing
        out.append({"signature": r[0], "outcome": r[1], "failing": bad,
                    "cause": causes.cause(r[1], r[2], r[3], r[4], r[5], r[6]) if bad else None,
                    "max_abs_err": r[7], "max_rel_err": r[8], "ulp_err": r[9], "values": r[10] or "random",
                    "seconds": r[11], "op": r[12], "inputs": loads(r[13]) or [], "attrs": loads(r[14]) or {},
                    "dtype": r[15], "seed": r[16]})
    return out


def tolerances(conn: sqlite3.Connection, signature: str) -> dict:
    """The rtol/atol a case's first occurrence judges it with (its own, else its model's
    defaults; none when neither sets one)."""
    row = conn.execute("""SELECT mc.rtol, mc.atol, m.defaults FROM model_cases mc JOIN models m ON m.name = mc.model
                          WHERE mc.signature = ? ORDER BY mc.retired_at IS NOT NULL, mc.id LIMIT 1""",
                       [signature]).fetchone()
    if row is None:
        return {}
    defaults = loads(row[2]) or {}
    got = {"rtol": row[0] if row[0] is not None else defaults.get("rtol"),
           "atol": row[1] if row[1] is not None else defaults.get("atol")}
    return {k: v for k, v in got.items() if v is not None}


def save(conn: sqlite3.Connection, run_id: int, bodies: list[dict]) -> None:
    """Replace run ``run_id``'s explanations with ``bodies`` (one per cause, in order)."""
    with conn:
        conn.execute("DELETE FROM explanations WHERE run_id = ?", [run_id])
        conn.executemany("INSERT INTO explanations (run_id, position, cause, body, created_at) VALUES (?, ?, ?, ?, ?)",
                         [(run_id, i, b.get("cause"), dumps(b), now()) for i, b in enumerate(bodies)])


def load(conn: sqlite3.Connection, run_id: int) -> list[dict] | None:
    """Run ``run_id``'s stored explanations (None: never explained)."""
    rows = conn.execute("SELECT body FROM explanations WHERE run_id = ? ORDER BY position", [run_id]).fetchall()
    if not rows:
        stamp = conn.execute("SELECT 1 FROM explanations WHERE run_id = ? AND position = -1", [run_id]).fetchone()
        return [] if stamp else None
    return [loads(r[0]) for r in rows if loads(r[0]).get("cause") is not None]


def mark_explained(conn: sqlite3.Connection, run_id: int) -> None:
    """Record that run ``run_id`` was explained and had nothing to explain."""
    with conn:
        conn.execute("DELETE FROM explanations WHERE run_id = ?", [run_id])
        conn.execute("INSERT INTO explanations (run_id, position, cause, body, created_at) VALUES (?, -1, NULL, ?, ?)",
                     [run_id, dumps({"cause": None}), now()])


def save_lineage(conn: sqlite3.Connection, signature: str, parent: str, transformation: list[str], run_id: int,
                 cause: str) -> None:
    with conn:
        conn.execute("""INSERT INTO derived_cases (signature, parent_signature, transformation, run_id, cause, created_at)
                        VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (signature) DO UPDATE SET
                        parent_signature = excluded.parent_signature, transformation = excluded.transformation,
                        run_id = excluded.run_id, cause = excluded.cause""",
                     [signature, parent, dumps(transformation), run_id, cause, now()])


def lineage(conn: sqlite3.Connection, signature: str) -> dict | None:
    row = conn.execute("SELECT parent_signature, transformation, run_id, cause FROM derived_cases WHERE signature = ?",
                       [signature]).fetchone()
    if row is None:
        return None
    return {"parent": row[0], "transformation": loads(row[1]), "run_id": row[2], "cause": row[3]}


def drop_unused_cases(conn: sqlite3.Connection, signatures: list[str]) -> int:
    """Delete those of ``signatures`` that no occurrence, result, judgement or lineage names (the
    cases only a round of variants used)."""
    gone = 0
    with conn:
        for sig in dict.fromkeys(signatures):
            gone += conn.execute(
                """DELETE FROM cases WHERE signature = ?
                   AND NOT EXISTS (SELECT 1 FROM model_cases WHERE signature = ?)
                   AND NOT EXISTS (SELECT 1 FROM results WHERE signature = ?)
                   AND NOT EXISTS (SELECT 1 FROM judgements WHERE signature = ?)
                   AND NOT EXISTS (SELECT 1 FROM derived_cases WHERE signature = ?)""", [sig] * 5).rowcount
    return gone


def latest_run(conn: sqlite3.Connection) -> int | None:
    """The newest run that is neither `casedb mutants`' nor a round of variants."""
    row = conn.execute("""SELECT max(id) FROM runs WHERE label IS NULL
                          OR (label NOT GLOB 'mutant:*' AND label NOT GLOB 'explain:*')""").fetchone()
    return row[0] if row else None


def drop_empty_model(conn: sqlite3.Connection, name: str) -> None:
    """Delete model ``name`` once nothing names it (the variants' model between rounds)."""
    with conn:
        conn.execute("""DELETE FROM models WHERE name = ? AND NOT EXISTS (SELECT 1 FROM model_cases WHERE model = ?)
                        AND NOT EXISTS (SELECT 1 FROM judgements WHERE model = ?)""", [name] * 3)
