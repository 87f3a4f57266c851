"""``casedb scan`` output (JSON lines) → records.

Line 1 is the header ``{"casedb_scan": 1, "model": ..., "level": ..., "phase": ..., ...}``; it
becomes the ``model`` record. Every further line is already a record (``case`` or ``skipped``,
see README.md); this parser checks its shape, fills in the model name and passes it on.

A scan of a recipe with a matrix adds ``paths`` / ``path_stats`` to the header and a ``paths``
list to each record (which paths made the call; the description's ``Paths:`` line says the
same). Both are optional: files without them read as before.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Iterator

from casedb import files
from importers.record import ImportRecord

FORMAT_VERSION = 1
HEADER_KEYS = ("model", "level", "phase")
RECORD_TYPES = ("case", "skipped")


def sniff(path: Path, head: str) -> bool:
    """True for a ``.jsonl`` file, or one whose first line is a scan header."""
    return Path(path).name.lower().endswith(".jsonl") or head.lstrip().startswith('{"casedb_scan"')


def _json(line: str, path: Path, number: int):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{path}:{number}: JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"{path}:{number}: {e}") from None


def parse(path, *, max_bytes: int | None = None) -> Iterator[ImportRecord]:
    path = Path(path)
    with io.TextIOWrapper(files.open_capped(path, max_bytes), encoding="utf-8") as f:
        first = f.readline()
        header = _json(first, path, 1) if first.strip() else None
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
            rec = _json(line, path, number)
            kind = rec.get("type") if isinstance(rec, dict) else None
            if kind not in RECORD_TYPES:
                raise ValueError(f"{path}:{number}: a record must have type {' or '.join(RECORD_TYPES)}, got {kind!r}")
            if kind == "case":
                if not isinstance(rec.get("case"), dict):
                    raise ValueError(f"{path}:{number}: a case record needs a 'case' mapping")
                rec["model"] = rec.get("model") or model
                rec.setdefault("where", f"{path}:{number}")
                if not isinstance(rec.get("paths", []), list):
                    raise ValueError(f"{path}:{number}: 'paths' must be a list of path names")
            yield rec
