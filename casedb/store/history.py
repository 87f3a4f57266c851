"""The run history's names where they used to live, for the tests that import them from here.
Code imports the module that holds each: :mod:`casedb.store.run_rows` (a ``runs`` row),
:mod:`casedb.store.run_lifecycle` (start, resume, finish), :mod:`casedb.store.recorder` (the
``results`` and ``judgements`` rows), :mod:`casedb.store.run_figures` (a run's figures) and
:mod:`casedb.store.run_listing` (listing, labelling, deleting runs); a connection is
:attr:`casedb.store.database.Store.conn`."""

from __future__ import annotations

import os
import sqlite3

from casedb.store.database import open_store
from casedb.store.recorder import Recorder, insert_judgement, insert_result  # noqa: F401
from casedb.store.result_columns import RESULT_COLUMNS  # noqa: F401
from casedb.store.run_lifecycle import start_run  # noqa: F401
from casedb.store.run_rows import get_run, set_run, update_selection  # noqa: F401


def connect(path: str | os.PathLike) -> sqlite3.Connection:
    """A connection with rows by name to the DB at ``path`` (:func:`open_store`'s ``conn``),
    closed with ``close()`` as the tests do."""
    store = open_store(path)
    conn = store.conn
    store._conn = None  # the caller owns it now
    store.close()
    return conn
