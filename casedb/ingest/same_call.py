"""One call, one case, whatever the front end: an imported call that is already a case under another
spelling (``torch.nn.functional.linear`` from a scan, ``torch.ops.aten.linear.default`` from a trace)
is linked to that case instead of adding a second one.

Sameness is the call identity (:mod:`casedb.cases.call_identity`). The case stored first, or first
in this import, keeps its spelling, inputs and signature; the occurrence keeps its own name (the
front end's spelling of it), count, source and judgement. Unnamed calls of one model that become
the same case in one import add up, as identical unnamed calls do.
"""

from __future__ import annotations

import json
from dataclasses import replace

from casedb.cases import call_identity
from casedb.cases.bounds import MAX_COUNT
from casedb.cases.spec import Normalized
from casedb.names import model_key
from casedb.store import identity as identity_sql


def link(store, occurrences: dict, reports: list) -> None:
    """Point each occurrence whose call is already a case (stored, or earlier in this import) at that
    case; `reports`' ``linked`` counts them per file, and merged unnamed occurrences leave
    `occurrences` and their file's keys. Touches nothing in the DB."""
    cases = [o.case for o in occurrences.values()]
    exact = store.existing_signatures(c.signature for c in cases)
    stored = identity_sql.cases_by_identity(store.db.conn, (call_identity.of(c) for c in cases))
    first: dict[str, Normalized] = {}
    for report, keys in reports:
        for key in keys:
            occ = occurrences[key]
            case = occ.case
            ident = call_identity.of(case)
            if case.signature in exact:
                first.setdefault(ident, case)
                continue
            if ident in stored:
                if stored[ident]["signature"] != case.signature:
                    occ.case = _as_stored(case, stored[ident])
                    report.linked += 1
                continue
            known = first.setdefault(ident, case)
            if known.signature != case.signature:
                occ.case = _as_case(case, known)
                report.linked += 1
    _merge_unnamed(occurrences, reports)


def _as_case(case: Normalized, known: Normalized) -> Normalized:
    """``case``'s occurrence (name, tolerances, marks, expectations) of the case ``known`` is."""
    return replace(case, signature=known.signature, op=known.op, inputs=known.inputs, attrs=known.attrs,
                   seed=known.seed, dtype=known.dtype, derived_marks=known.derived_marks, blobs={},
                   identity=known.identity)


def _as_stored(case: Normalized, row: dict) -> Normalized:
    return replace(case, signature=row["signature"], op=row["op"], inputs=json.loads(row["inputs"] or "[]"),
                   attrs=json.loads(row["attrs"] or "{}"), seed=row["seed"], dtype=row["dtype"],
                   derived_marks=json.loads(row["marks"] or "[]"), blobs={}, identity=row["identity"])


def _merge_unnamed(occurrences: dict, reports: list) -> None:
    """Unnamed occurrences of one model now of one case: the first takes the others' calls."""
    seen: dict[tuple[str, str], object] = {}
    for report, keys in reports:
        kept = []
        for key in keys:
            occ = occurrences[key]
            if occ.case.name is not None:
                kept.append(key)
                continue
            first = seen.setdefault((model_key(occ.model), occ.case.signature), occ)
            if first is occ:
                kept.append(key)
                continue
            first.count = min(first.count + occ.count, MAX_COUNT)
            del occurrences[key]
            report.occurrences -= 1
        keys[:] = kept
