"""Cases whose inputs are invalid for their op: the case's fault, not the backend's.

The rules are :mod:`casedb.cases.valid_inputs`'s (an index input whose values can leave the indexed
dim); this module applies them to what an import brings in (:func:`import_problems`: a warning
per case, an error with ``--strict``) and to a whole database (:func:`check_store`, the
``casedb check`` command).
"""

from __future__ import annotations

from casedb.cases import valid_inputs
from casedb.errors import InputError


def case_problems(case) -> list[str]:
    """:func:`casedb.cases.valid_inputs.problems` of a stored case row or a :class:`~casedb.cases.spec.Normalized`."""
    if isinstance(case, dict):
        op, inputs, attrs = case["op"], case.get("inputs"), case.get("attrs")
    else:
        op, inputs, attrs = case.op, case.inputs, case.attrs
    return valid_inputs.problems({"op": op, "inputs": inputs or [], "attrs": attrs or {}})


def import_problems(norm, *, where: str, case: str) -> list[dict]:
    """Warnings ``{where, case, problem}`` for one imported case."""
    return [{"where": where, "case": case, "problem": problem} for problem in case_problems(norm)]


def fail_on(warnings: list[dict]) -> None:
    """``--strict``: the first warning of a file is an InputError (after the file's other errors)."""
    if warnings:
        w = warnings[0]
        more = f"; {len(warnings) - 1} more in this file" if len(warnings) > 1 else ""
        raise InputError(f"invalid input: {w['problem']} (without --strict this is a warning{more})",
                         where=w["where"], case=w["case"])


def check_store(store, models: list[str] | None = None) -> list[dict]:
    """Every occurrence whose inputs are invalid: ``{model, case, signature, op, source, problems}``."""
    out = []
    cache: dict[str, list[str]] = {}
    for row in store.occurrences(models or None, markexpr=""):
        sig = row["signature"]
        if sig not in cache:
            cache[sig] = case_problems(row)
        if cache[sig]:
            out.append({"model": row["model"], "case": row["name"], "signature": sig, "op": row["op"],
                        "source": row["source"], "problems": cache[sig]})
    return out

