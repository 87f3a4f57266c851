"""Datasette plugin loaded by `casedb serve`: readable tensor specs, repro links, the latest run.

* `inputs` cells holding a case's JSON input specs render as ``bf16[1, 11, 2880], bf16[2880]``
  (the raw JSON stays in the cell's title);
* `repro` cells (``casedb repro model::case``) link to the `repro` canned query of that
  judgement: the command with the error and traceback it reproduces;
* `outcome` and `verdict` cells are coloured;
* every request other than GET/HEAD is answered 405: the server is read-only by construction,
  not only because no view happens to write (Datasette 0.65 answers a POST to a table with 500);
* SQL function ``casedb_latest_run()``: the newest run id. The served file is immutable, so it
  is a constant per connection, which lets SQLite push ``run_id = casedb_latest_run()`` into the
  grouped views (a ``(SELECT max(id) FROM runs)`` subquery would make them aggregate every run).
"""

from __future__ import annotations

import json
import sqlite3

from datasette import hookimpl
from markupsafe import Markup, escape

from casedb.migrations import OUTCOME_CLASSES
from casedb.serve import DB_NAME

_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#cf222e", "xfail": "#9a6700", "skip": "#57606a",
            "ref_error": "#8250df"}
_OUTCOME_VERDICT = {outcome: verdict for outcome, verdict, *_ in OUTCOME_CLASSES}
_READ_ONLY = b"casedb serve is read-only: browse and query (GET), nothing is written to the database\n"


@hookimpl
def asgi_wrapper(datasette):
    def wrap(app):
        async def read_only(scope, receive, send):
            if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
                await send({"type": "http.response.start", "status": 405,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"allow", b"GET, HEAD")]})
                await send({"type": "http.response.body", "body": _READ_ONLY})
                return
            await app(scope, receive, send)

        return read_only

    return wrap


@hookimpl
def prepare_connection(conn, database, datasette):
    if database != DB_NAME:
        return
    try:
        latest = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
    except sqlite3.Error:  # not a casedb database
        return
    conn.create_function("casedb_latest_run", 0, lambda: latest, deterministic=True)


def _row_get(row, key):
    try:
        return row[key]
    except (KeyError, IndexError, TypeError):
        return None


def _inputs(value, row) -> Markup | None:
    if not isinstance(value, str) or not value.startswith("[{"):
        return None
    from casedb.store import shape_summary

    try:
        specs = json.loads(value)
        attrs = _row_get(row, "attrs")
        attrs = json.loads(attrs) if isinstance(attrs, str) and attrs.startswith("{") else {}
        text = shape_summary(specs, attrs)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return Markup(f'<span class="casedb-inputs" title="{escape(value)}">{escape(text)}</span>')


def _repro(value, row, datasette) -> Markup | None:
    if not isinstance(value, str) or not value.startswith("casedb repro "):
        return None
    code = Markup(f"<code>{escape(value)}</code>")
    judgement = _row_get(row, "judgement_id")
    if judgement is None:
        return code
    href = datasette.urls.path(f"/{DB_NAME}/repro?judgement={int(judgement)}")
    return Markup(f'<a href="{escape(href)}" title="the error this command reproduces">{code}</a>')


def _badge(value) -> Markup | None:
    verdict = _OUTCOME_VERDICT.get(value, value)
    colour = _COLOURS.get(verdict) if isinstance(verdict, str) else None
    if colour is None:
        return None
    return Markup(f'<span style="color:{colour};font-weight:600">{escape(value)}</span>')


@hookimpl
def render_cell(row, value, column, table, database, datasette):
    if database != DB_NAME:
        return None
    if column == "inputs":
        return _inputs(value, row)
    if column == "repro":
        return _repro(value, row, datasette)
    if column in ("outcome", "verdict", "base_outcome", "previous_outcome"):
        return _badge(value)
    return None
