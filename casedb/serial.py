"""JSON text and timestamps as casedb stores them (one spelling for the store and the run history)."""

from __future__ import annotations

import datetime as _dt
import json
import math

from casedb.errors import CasedbError

# json.dumps with these options builds an encoder per call: one, made once, is what a big
# import's thousands of dumps want (the same text). NaN and infinities are refused: SQLite's JSON
# functions read them as malformed JSON, so one stored `Infinity` broke every summary, report
# and merge that read the row.
_OPTIONS = dict(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
_ENCODER = json.JSONEncoder(allow_nan=False, **_OPTIONS)
# A case's own argument values may be NaN or infinite (masked_fill(-inf), clamp(max=inf)): they
# keep Python's spelling, read back by casedb's Python only (no SQL reads numbers inside inputs).
_VALUES_ENCODER = json.JSONEncoder(allow_nan=True, **_OPTIONS)


class NonFiniteValue(CasedbError):
    """A value casedb would store as JSON is NaN or infinite."""


def dumps(obj) -> str | None:
    """Compact, key-sorted JSON (None stays NULL); values JSON cannot hold are written as text;
    NonFiniteValue (naming where) for a NaN or an infinity, which JSON cannot hold."""
    if obj is None:
        return None
    try:
        return _ENCODER.encode(obj)
    except ValueError:
        where = _non_finite(obj, "$")
        if where is None:
            raise
        raise NonFiniteValue(f"cannot store {where[0]} = {where[1]!r}: JSON holds no NaN or infinity (casedb refuses "
                             "them where they enter: tolerances are finite numbers >= 0); fix the value") from None


def dumps_values(obj) -> str | None:
    """:func:`dumps` for a case's inputs and attrs, whose values may be NaN or infinite."""
    return None if obj is None else _VALUES_ENCODER.encode(obj)


def _non_finite(obj, path: str, depth: int = 0):
    """(the JSON path, the value) of the first NaN or infinity in ``obj``, None without one."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (path, obj)
    if depth > 100:
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        found = _non_finite(v, f"{path}.{k}" if isinstance(obj, dict) else f"{path}[{k}]", depth + 1)
        if found:
            return found
    return None


def loads(text):
    return None if text is None else json.loads(text)


def now() -> str:
    """UTC, to the second, ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
