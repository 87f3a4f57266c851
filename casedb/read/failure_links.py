"""Where a cell of a failure page leads in `casedb serve` (the Datasette plugin's render_cell for
queries and views): a run id to the run, a signature or case name to the case (its inputs), a
cause or a cause's count to every case of that cause in the run (the ``cause_cases`` query), and
a ``link`` cell (JSON a query writes: ``{"path": "cases/<signature>"}``, ``{"query":
"cause_cases", ...}``) to that page. Every link is built here from checked parts (a run id is an
integer, a signature 64 hex digits, query arguments URL-encoded): nothing from the database
becomes a URL as it is.
"""

from __future__ import annotations

import json
import re
import urllib.parse

from markupsafe import Markup, escape

from casedb.read.serve_settings import DB_NAME

_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_PATH = re.compile(r"(cases/[0-9a-f]{64}|runs/[0-9]{1,18})")
_QUERIES = {"cause_cases": ("run", "op", "cause"), "repro": ("judgement",)}
_LABELS = {"cases": "the case and its inputs", "runs": "the run", "cause_cases": "every case of this cause"}


def _get(row, key):
    try:
        return row[key]
    except (KeyError, IndexError, TypeError):
        return None


def _a(datasette, path: str, text, title: str | None = None) -> Markup:
    href = datasette.urls.path(f"/{DB_NAME}/{path}")
    extra = f' title="{escape(title)}"' if title else ""
    return Markup(f'<a href="{escape(href)}"{extra}>{escape(text)}</a>')


def _query(name: str, args: dict) -> str | None:
    keys = _QUERIES.get(name)
    if keys is None or any(not isinstance(args.get(k), (str, int)) or isinstance(args.get(k), bool) for k in keys):
        return None
    return f"{name}?{urllib.parse.urlencode({k: args[k] for k in keys})}"


def _run_id(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def cell(row, value, column: str, datasette) -> Markup | None:
    """The cell as a link, or None (Datasette shows it as it is)."""
    if column in ("run_id", "previous_run_id", "base_run_id") and _run_id(value) is not None:
        return _a(datasette, f"runs/{value}", value, "the run")
    if column in ("signature", "example_signature") and isinstance(value, str) and _SIGNATURE.fullmatch(value):
        return _a(datasette, f"cases/{value}", value[:16] + "…", "the case and its inputs")
    if column == "case_name" and isinstance(value, str) and _SIGNATURE.fullmatch(str(_get(row, "signature"))):
        return _a(datasette, f"cases/{_get(row, 'signature')}", value, "the case and its inputs")
    if column in ("cause", "cases") and isinstance(_get(row, "cause"), str) and isinstance(_get(row, "op"), str):
        run = _run_id(_get(row, "run_id"))
        path = _query("cause_cases", {"run": run if run is not None else "", "op": _get(row, "op"),
                                      "cause": _get(row, "cause")})
        return _a(datasette, path, value, "every case of this cause in the run") if path and value is not None else None
    if column == "link":
        return _link(value, datasette)
    if column == "value" and _get(row, "field") == "command" and isinstance(value, str):
        return Markup(f"<code>{escape(value)}</code>")
    return None


def _link(value, datasette) -> Markup | None:
    try:
        target = json.loads(value) if isinstance(value, str) else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(target, dict):
        return None
    path = target.get("path")
    if isinstance(path, str) and _PATH.fullmatch(path):
        return _a(datasette, path, _LABELS[path.split("/")[0]])
    name = target.get("query")
    query = _query(name, target) if isinstance(name, str) else None
    return _a(datasette, query, _LABELS.get(name, name)) if query else None
