"""The one rule every importer applies to an op casedb never calls.

A record naming a call casedb cannot run as a case (a tracer's bookkeeping: their registry's
``torch.nn.attention._backend_from_string``, ``torch._C._functorch._vmap_increment_nesting``,
``torch._C._log_api_usage_once``) is skipped and listed with its reason (line, name, why); a
name that reaches files, processes or process-wide state (``torch.save``, ``torch.ops.aten.from_file``,
a dunder walk) refuses the file, as a malformed record does (casedb.cases.ops.refusal decides which).
"""

from __future__ import annotations

from casedb.errors import InputError
from importers.record import SkippedRecord


def verdict(op) -> tuple[str, str] | None:
    """``("unsafe", why)``, ``("not an op", why)`` or None (casedb may run it, or ``op`` is no
    well-formed name, which the case's own checks refuse)."""
    from casedb.cases.ops import refusal
    from casedb.names import normalize_op

    if not isinstance(op, str) or not op.strip():
        return None
    try:
        return refusal(normalize_op(op))
    except ValueError:
        return None


def skipped(op, where: str) -> SkippedRecord | None:
    """The skipped record of a call casedb cannot run as a case, None for any other op."""
    found = verdict(op)
    if found is None or found[0] != "not an op":
        return None
    return {"type": "skipped", "where": where, "op": op, "reason": f"{found[1]} (a call casedb cannot run as a case)"}


def refuse_unsafe(op, where: str) -> None:
    """InputError naming ``where`` when ``op`` reaches files, processes or process-wide state."""
    found = verdict(op)
    if found is not None and found[0] == "unsafe":
        raise InputError(found[1], where=where)
