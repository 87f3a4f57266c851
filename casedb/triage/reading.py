"""What triage reads of a casedb database: the case occurrences it plans, and a run's target and
judgements. Reads only, through
:mod:`casedb.store.reads_triage`; runs are looked up through :mod:`casedb.store.run_rows`."""

from __future__ import annotations

import json

from casedb.store.reads_triage import Reading, judgement_rows, occurrence_rows
from casedb.store.run_rows import get_run


def _marks(*texts) -> list[str]:
    out: set = set()
    for t in texts:
        out |= set(json.loads(t) if t else ())
    return sorted(out)


def occurrences(store) -> list[dict]:
    """Every case occurrence the DB plans (not retired), as triage matches them."""
    with Reading(store) as db:
        rows = occurrence_rows(db)
    return [{"model_case_id": i, "model": m, "name": n, "op": op, "signature": s, "dtype": d, "marks": _marks(cm, om)}
            for i, m, n, op, s, d, cm, om in rows]


def run_target(db, run_id: int) -> dict:
    """The target (device, backend, arch) run ``run_id`` ran on; NotFound naming the last run."""
    run = get_run(db, run_id)
    selection = run["selection"]
    options = selection.get("options") or {}
    return {"device": run["device"], "backend": run["backend"], "arch": options.get("arch") or selection.get("arch")}


def run_rows(db, run_id: int) -> list[dict]:
    """Run ``run_id``'s judgements of occurrences still in the DB, with their case and result."""
    rows = []
    for r in judgement_rows(db, run_id):
        if r["name"] is None:
            continue
        r["marks"] = _marks(r.pop("case_marks"), r["marks"])
        rows.append(r)
    return rows
