"""What a run's plan reads (:mod:`casedb.run.plan`): the occurrences it plans, with their case and
their model's defaults."""

from __future__ import annotations

# One query, JSON decoded by the plan (10k cases plan in well under a second).
_PLAN_SQL = """SELECT mc.id, mc.model, mc.name, mc.signature, mc.op, mc.shapes, mc.dtype, mc.seed, mc.inputs,
                      mc.attrs, mc.marks, mc.rtol, mc.atol, mc.skip_if, mc.expects_error, mc.xfail, mc.source,
                      m.defaults
               FROM occurrences mc JOIN models m ON m.name = mc.model
               WHERE mc.retired_at IS NULL {where}
               ORDER BY mc.model, mc.position, mc.id"""


def plan_rows(db, models: list[str] | None = None):
    """The occurrences to plan (not retired) of ``models`` (stored names; every model when none),
    in manifest order, as tuples (id, model, name, signature, op, shapes, dtype, seed, inputs,
    attrs, marks, rtol, atol, skip_if, expects_error, xfail, source, the model's defaults), JSON
    columns as text."""
    where, params = "", []
    if models:
        where = f"AND mc.model IN ({','.join('?' * len(models))})"
        params = list(models)
    return db.execute(_PLAN_SQL.format(where=where), params)
