"""A coverage prediction against a real run: each predicted case's recorded result, read as "no
kernel" when the target raised torch's "Could not run 'aten::X' with arguments from the 'D'
backend", and where the two disagree.
"""

from __future__ import annotations

import re

from casedb.errors import InputError
from casedb.store.reads_run_results import result_errors, run_exists

_NO_KERNEL = re.compile(r"Could not run '([\w:.]+)' with arguments from the '[^']*' backend")


def no_kernel(message: str | None) -> str | None:
    """The operator a "no kernel" error names, else None."""
    m = _NO_KERNEL.search(message or "")
    return m.group(1) if m else None


def against_run(conn, run_id: int, cases: list) -> dict:
    """Predicted (``enabled``) against run ``run_id``'s results of the same cases: agreement
    counts, and every case that disagrees (predicted blocked but ran, predicted runnable but
    failed for want of a kernel)."""
    if not run_exists(conn, run_id):
        raise InputError(f"--against {run_id}: no such run (casedb runs lists them)")
    return compare(run_id, errors_by_case(conn, run_id), cases)


def errors_by_case(conn, run_id: int) -> dict:
    """signature -> (outcome, error message) of run ``run_id``'s results (the first of a case)."""
    found: dict = {}
    for sig, outcome, message in result_errors(conn, run_id):
        found.setdefault(sig, (outcome, message))
    return found


def compare(run_id: int, results: dict, cases: list) -> dict:
    """The agreement of ``cases`` (predicted) with ``results`` (signature -> (outcome, error
    message)) of run ``run_id``: see :func:`against_run`."""
    compared, agree, disagree = 0, 0, []
    for c in cases:
        if c["enabled"] is None or c["signature"] not in results:
            continue
        outcome, message = results[c["signature"]]
        kernel = no_kernel(message)
        compared += 1
        if (kernel is None) == c["enabled"]:
            agree += 1
        else:
            disagree.append({"signature": c["signature"], "op": c["op"], "predicted_missing": c["missing"],
                             "outcome": outcome, "run_missing": kernel})
    return {"run": run_id, "compared": compared, "agree": agree,
            "agree_pct": round(100.0 * agree / compared, 1) if compared else None, "disagree": disagree}
