"""Datasette plugin loaded by `casedb serve`: readable tensor specs, repro links, the latest run.

* `inputs` cells holding a case's JSON input specs render as ``bf16[1, 11, 2880], bf16[2880]``
  (the raw JSON stays in the cell's title);
* `repro` cells (``casedb repro model::case``) link to the `repro` canned query of that
  judgement: the command with the error and traceback it reproduces;
* `outcome` and `verdict` cells are coloured;
* in queries and views, a failure leads somewhere (:mod:`casedb.read.failure_links`): its run, its
  case, the other cases of its cause;
* every request other than GET/HEAD is answered 405: the server is read-only by construction,
  not only because no view happens to write (Datasette 0.65 answers a POST to a table with 500);
* SQL function ``casedb_mutant_run(label)``: whether a run's label marks a `casedb mutants` run;
* SQL function ``casedb_latest_run()``: the newest full run's id (not a mutant run's, nor a partial
  rerun's: :data:`casedb.store.run_scope.LATEST_FULL_RUN`). The served file
  is immutable, so it is a constant per connection, which lets SQLite push ``run_id = casedb_latest_run()`` into the
  grouped views (a subquery for the newest run id would make them aggregate every run);
* every connection gets SQLite's length limit (``serve_settings.MAX_VALUE_BYTES``) and a row factory
  that stops a query once it has returned ``serve_settings.MAX_RESULT_BYTES`` of values;
* errors: a refused request (bad or too costly SQL, 404, 403) is answered as Datasette would and
  logged as one line; only a bug logs a traceback (this replaces Datasette's handler, which
  prints a traceback with locals, hundreds of lines, for every refused query).
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import traceback

from datasette import Response, hookimpl
from datasette.utils import add_cors_headers
from datasette.utils.asgi import Base400

from casedb import causes
from datasette.views.base import DatasetteError
from markupsafe import Markup, escape

from casedb import outcomes
from casedb.read.serve_settings import DB_NAME, MAX_RESULT_BYTES, MAX_SQLITE_HEAP, MAX_VALUE_BYTES
from casedb.read import failure_links
from casedb.store import run_scope, serving
from casedb.store.run_listing import mutant_run
from casedb.store.views import REPORT_VIEWS

_COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "error": "#cf222e", "xfail": "#9a6700", "skip": "#57606a",
            "ref_error": "#8250df"}
_OUTCOME_VERDICT = {o.name: o.verdict for o in outcomes.OUTCOMES}
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


def capped_rows(limit: int = MAX_RESULT_BYTES):
    """A row factory making ``sqlite3.Row`` rows that raises ``sqlite3.DataError`` once one
    cursor (one query) has returned more than `limit` bytes of values."""
    current = None
    total = 0

    def factory(cursor, row):
        nonlocal current, total
        if cursor is not current:
            current, total = cursor, 0
        for v in row:
            total += len(v) if v.__class__ is str or v.__class__ is bytes else 8
        if total > limit:
            raise sqlite3.DataError(f"the query returns more than {limit >> 20} MiB; select fewer rows or "
                                    "columns (length(data) instead of data, a LIMIT)")
        return sqlite3.Row(cursor, row)

    return factory


@hookimpl
def prepare_connection(conn, database, datasette):
    if database != DB_NAME:
        return
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.row_factory = capped_rows()
    ours, latest = serving.latest_run(conn)  # (casedb.store.serving)
    if not ours:  # not a casedb database
        return
    conn.create_function("casedb_latest_run", 0, lambda: latest, deterministic=True)
    conn.create_function("casedb_mutant_run", 1, mutant_run, deterministic=True)
    # what tells runs apart (casedb.store.run_scope): a run's selection in words
    conn.create_function("casedb_run_selection", 1, _run_selection, deterministic=True)
    # a failure's cause, as the run summary and `casedb report` group them (casedb.causes); it reads
    # at most causes.MAX_INPUT_CHARS of a message, so a call is quick and the query time limit,
    # checked between calls, holds
    conn.create_function("casedb_cause", 6, causes.cause, deterministic=True)


def _json_object(text) -> dict:
    if not isinstance(text, str) or not text.startswith("{"):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _run_selection(selection) -> str:
    return run_scope.selection_words(_json_object(selection))


def _row_get(row, key):
    try:
        return row[key]
    except (KeyError, IndexError, TypeError):
        return None


def _inputs(value, row) -> Markup | None:
    if not isinstance(value, str) or not value.startswith("[{"):
        return None
    from casedb.store.database import shape_summary

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
    if table is None or table in REPORT_VIEWS:  # a query's or a view's rows: where each failure leads
        return failure_links.cell(row, value, column, datasette)
    return None


def _error(exception) -> tuple[int, str, str | None, dict, bool]:
    """(status, message, title, extra JSON fields, is a bug) of an exception a request raised."""
    if isinstance(exception, Base400):
        return exception.status, str(exception.args[0]) if exception.args else "", None, {}, False
    if isinstance(exception, DatasetteError):
        message = Markup(exception.message) if exception.message_is_html else exception.message
        return exception.status, message, exception.title, dict(exception.error_dict or {}), exception.status >= 500
    if isinstance(exception, MemoryError):  # SQLITE_NOMEM: past the heap limit
        return (400, f"the query needs more than the {MAX_SQLITE_HEAP >> 20} MiB of memory casedb serve allows; "
                "select fewer or smaller values", "Query too large", {}, False)
    if isinstance(exception, sqlite3.Error):
        return 400, str(exception), "Invalid SQL", {}, False
    return 500, str(exception), None, {}, True


@hookimpl
def handle_exception(datasette, request, exception):
    async def inner():
        status, message, title, info, bug = _error(exception)
        if bug:
            traceback.print_exception(exception)
        elif not isinstance(exception, sqlite3.Error):  # Datasette logged those already (one line)
            text = " ".join(re.sub(r"<[^>]+>", "", str(message)).split())
            sys.stderr.write(f"casedb serve: {status} {request.path}: {text[:300]}\n")
            sys.stderr.flush()
        info.update({"ok": False, "error": message, "status": status, "title": title})
        headers = {}
        if datasette.cors:
            add_cors_headers(headers)
        if request.path.split("?")[0].endswith(".json"):
            return Response.json(info, status=status, headers=headers)
        template = datasette.jinja_env.select_template([f"{status}.html", "error.html"])
        html = await template.render_async(dict(info, urls=datasette.urls, app_css_hash=datasette.app_css_hash(),
                                                menu_links=lambda: []))
        return Response.html(html, status=status, headers=headers)

    return inner
