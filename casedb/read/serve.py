"""`casedb serve`: Datasette on the case DB, read-only, with casedb's metadata, charts and cells.

The file is opened immutable (Datasette's ``-i``: SQLite never writes to it, and Datasette offers
no writes). It is served as database ``casedb`` whatever the file is called, so URLs, canned
queries and charts are the same for every DB. Pending migrations (the metric views) are applied
and the WAL folded into the file before serving: an immutable reader sees the main file only.
The served DB is a snapshot: restart `casedb serve` to see runs recorded after it started.

Anyone who can reach the server can run any read-only SQL, so what one query can take is
bounded: Datasette's time limit (3 s) and row limit (1000 rows per page), plus SQLite's length
limit on one value, a cap on the bytes one query returns (:mod:`casedb.read.datasette_plugin`; the figures are
:mod:`casedb.read.serve_settings`) and a
hard limit on SQLite's heap for the whole server process. A refused query is answered 400 with
the reason and logged as one line.
"""

from __future__ import annotations

import asyncio
import os
import webbrowser
from pathlib import Path

import yaml

from casedb.errors import CasedbError
from casedb.read.serve_settings import DB_NAME, MAX_SQLITE_HEAP, SETTINGS
from casedb.store import serving

METADATA = Path(__file__).with_name("datasette_metadata.yaml")


def load_metadata() -> dict:
    with open(METADATA, encoding="utf-8") as f:
        return yaml.safe_load(f)


def prepare(db_path: str | os.PathLike | None) -> Path:
    """Open the DB the way every command does (default path, schema check, migrations), fold the
    WAL into the file, close it; returns the file to serve. Its journal mode stays as it is: a
    served file is not switched to WAL (nothing but a pending migration writes to it)."""
    from casedb.ingest.seed import open_seeded

    with open_seeded(db_path, wal=False) as store:
        if serving.fold_wal(store):  # a run writing for longer than a second: say so, do not wait
            raise CasedbError(f"{store.path} is being written (a run in progress?); serve it when the run is done")
        return store.path.resolve()


def limit_sqlite_heap(limit: int = MAX_SQLITE_HEAP) -> None:
    """Cap SQLite's heap for this whole process (a query past it fails with SQLITE_NOMEM)."""
    serving.limit_sqlite_heap(limit)


def make_datasette(path: Path):
    """A Datasette instance serving `path` immutable as database `casedb`, plugin registered."""
    from datasette.app import Datasette
    from datasette.database import Database
    from datasette.plugins import pm

    from casedb.read import datasette_plugin

    if not pm.is_registered(datasette_plugin):
        pm.register(datasette_plugin, name="casedb")
    # datasette-render-markdown comes with datasette-dashboards, for markdown cards (casedb's
    # dashboard has none); its render_cell looks up plugin config for every cell, which is half
    # the time of a 1000-row page.
    if pm.has_plugin("render_markdown"):
        pm.unregister(name="render_markdown")
    # Datasette's own error handler prints a rich traceback with locals (hundreds of lines) for
    # every refused query; casedb's (datasette_plugin.handle_exception) logs one line.
    if pm.has_plugin("datasette.handle_exception"):
        pm.unregister(name="datasette.handle_exception")
    ds = Datasette([], metadata=load_metadata(), settings=SETTINGS)
    ds.add_database(Database(ds, path=str(path), is_mutable=False), name=DB_NAME)
    if "_memory" in ds.databases:  # added by Datasette when built without files: nothing to serve
        ds.remove_database("_memory")
    return ds


def serve(db_path: str | os.PathLike | None = None, *, host: str = "127.0.0.1", port: int = 8001,
          open_browser: bool = False) -> None:
    """Serve the DB until interrupted."""
    import uvicorn

    path = prepare(db_path)
    limit_sqlite_heap()
    ds = make_datasette(path)
    asyncio.run(ds.invoke_startup())
    url = f"http://{host}:{port}/{DB_NAME}"
    print(f"casedb: serving {path} read-only at {url}", flush=True)
    if open_browser:
        webbrowser.open(url)
    uvicorn.run(ds.app(), host=host, port=port, log_level="warning", lifespan="on")
