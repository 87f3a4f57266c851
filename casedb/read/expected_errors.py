"""Manifest-declared expected errors in a report: a case whose manifest says the op raises here
(``expects_error``, e.g. int32 ``torch.histc`` on the CPU) and that raised it is judged xfailed,
but the op does what it should. The report's op ranking and its blocking tables leave those
cases out, so such an op is never the "worst op" nor a blocker (:func:`adjust`); the counts are
:func:`casedb.store.reads_report.expected_error_counts`.
"""

from __future__ import annotations


def adjust(out: dict, expected: dict[tuple[str, str], int]) -> None:
    """The report's ``ops``, ``blocking`` and ``blocking_matrix`` without declared errors."""
    if not expected:
        return
    by_op: dict[str, int] = {}
    for (_, op), n in expected.items():
        by_op[op] = by_op.get(op, 0) + n
    for row in out["ops"]:
        n = by_op.get(row["op"], 0)
        if n:
            row["expected_errors"] = n
            row["xfailed"] -= n
            row["executed"] -= n
            row["pass_rate"] = round(100.0 * row["passed"] / row["executed"], 2) if row["executed"] else None
    # worst first; an op with nothing but declared errors has no pass rate: last
    out["ops"].sort(key=lambda r: (r["pass_rate"] is None, r["pass_rate"] or 0.0, -(r["failed"] + r["errors"]), r["op"]))
    for row in out["blocking_matrix"]:
        row["failing"] -= expected.get((row["model"], row["op"]), 0)
    still = {(r["model"], r["op"]) for r in out["blocking_matrix"] if r["failing"] > 0}
    out["blocking_matrix"] = [r for r in out["blocking_matrix"] if any(op == r["op"] for _, op in still)]
    kept = []
    for row in out["blocking"]:
        models = [m for m, op in still if op == row["op"]]
        if not models:
            continue
        row["models_blocked"] = len(models)
        row["failing"] -= by_op.get(row["op"], 0)
        kept.append(row)
    out["blocking"] = kept
