"""Reads of the latencies ``casedb run --measure`` stored in each result's metrics (the figures:
:mod:`casedb.read.latency`)."""

from __future__ import annotations

import json
import math

# (a result's metrics is JSON text casedb wrote; json_extract keeps the latency apart in SQL)
_MEASURED = """
SELECT r.signature, c.op, json_extract(r.metrics, '$.latency') AS latency,
       (SELECT group_concat(DISTINCT mc.model) FROM model_cases mc WHERE mc.signature = r.signature AND mc.retired_at IS NULL) AS models,
       (SELECT sum(mc.count) FROM model_cases mc WHERE mc.signature = r.signature AND mc.retired_at IS NULL) AS calls
FROM results r JOIN cases c ON c.signature = r.signature
WHERE r.run_id = ? AND r.outcome = 'passed' AND ifnull(r.input_values, 'random') = 'random'
  AND json_valid(r.metrics) AND json_extract(r.metrics, '$.latency.target.median_s') IS NOT NULL
ORDER BY r.signature
"""


def measured(db, run_id: int) -> list[dict]:
    """Every measured result of a run: ``{signature, op, latency, models: [..], calls}``."""
    out = []
    for sig, op, latency, models, calls in db.execute(_MEASURED, [run_id]).fetchall():
        out.append({"signature": sig, "op": op, "latency": json.loads(latency),
                    "models": sorted((models or "").split(",")) if models else [], "calls": int(calls or 1)})
    return out


def per_model_calls(db, signatures: list[str]) -> dict[str, dict[str, int]]:
    """signature -> {model: calls}: how often each model calls each case (its shares of time)."""
    out: dict[str, dict[str, int]] = {}
    for i in range(0, len(signatures), 500):
        chunk = signatures[i:i + 500]
        rows = db.execute(f"SELECT signature, model, sum(count) FROM model_cases WHERE retired_at IS NULL AND signature IN "
                          f"({','.join('?' * len(chunk))}) GROUP BY signature, model", chunk).fetchall()
        for sig, model, n in rows:
            out.setdefault(sig, {})[model] = int(n or 1)
    return out


def totals(db, run_id: int) -> dict | None:
    """``{measured, cost_s, speedup (geometric mean), baseline}`` of a run, None when it measured nothing."""
    rows = measured(db, run_id)
    if not rows:
        return None
    return {"measured": len(rows), "cost_s": round(sum(r["latency"].get("cost_s") or 0 for r in rows), 2),
            "speedup": geomean(r["latency"].get("speedup") for r in rows),
            "baseline": rows[0]["latency"]["baseline"].get("backend")}


def geomean(xs) -> float | None:
    """The geometric mean of the positive values (speedups, ratios), None when there are none."""
    xs = [x for x in xs if x and x > 0]
    return round(math.exp(sum(map(math.log, xs)) / len(xs)), 4) if xs else None
