"""``casedb scan`` output (JSON lines) → records.

Line 1 is the header ``{"casedb_scan": 1, "model": ..., "level": ..., "phase": ..., ...}``; it
becomes the ``model`` record. Every further line is already a record (``case`` or ``skipped``,
see README.md); this parser checks its shape, fills in the model name and passes it on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

FORMAT_VERSION = 1
HEADER_KEYS = ("model", "level", "phase")
RECORD_TYPES = ("case", "skipped")


def sniff(path: Path, head: str) -> bool:
    return head.lstrip().startswith('{"casedb_scan"')


def parse(path) -> Iterator[dict]:
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        first = f.readline()
        try:
            header = json.loads(first) if first.strip() else None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:1: the header is not JSON ({e.msg})") from None
        if not isinstance(header, dict) or "casedb_scan" not in header:
            raise ValueError(f"{path}:1: not a casedb scan file (the first line must be the "
                             '{"casedb_scan": 1, ...} header that `casedb scan` writes)')
        if header["casedb_scan"] != FORMAT_VERSION:
            raise ValueError(f"{path}:1: scan format {header['casedb_scan']!r} is not supported "
                             f"(this casedb reads format {FORMAT_VERSION}); scan the model again")
        missing = [k for k in HEADER_KEYS if not header.get(k)]
        if missing:
            raise ValueError(f"{path}:1: the header lacks {', '.join(missing)}")
        model = str(header["model"])
        yield {"type": "model", "name": model, "family": header.get("family"),
               "variant_of": header.get("variant_of"), "description": header.get("description"),
               "defaults": header.get("defaults") or {}, "source": str(path)}
        for number, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
            kind = rec.get("type") if isinstance(rec, dict) else None
            if kind not in RECORD_TYPES:
                raise ValueError(f"{path}:{number}: a record must have type {' or '.join(RECORD_TYPES)}, got {kind!r}")
            if kind == "case":
                if not isinstance(rec.get("case"), dict):
                    raise ValueError(f"{path}:{number}: a case record needs a 'case' mapping")
                rec["model"] = rec.get("model") or model
                rec.setdefault("where", f"{path}:{number}")
            yield rec
