"""JSON text and timestamps as casedb stores them (one spelling for the store and the run history)."""

from __future__ import annotations

import datetime as _dt
import json

# json.dumps with these options builds an encoder per call: one, made once, is what a big
# import's thousands of dumps want (the same text).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def dumps(obj) -> str | None:
    """Compact, key-sorted JSON (None stays NULL); values JSON cannot hold are written as text."""
    if obj is None:
        return None
    return _ENCODER.encode(obj)


def loads(text):
    return None if text is None else json.loads(text)


def now() -> str:
    """UTC, to the second, ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
