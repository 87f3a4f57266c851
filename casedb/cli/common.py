"""What every `casedb` command shares: the Typer app with the global ``--db`` option, the
consoles, and turning a CasedbError into exit 2 (:func:`fail`).

Each command imports the library module it calls in its body: importing them all would cost
every `casedb` command ~3x the start-up time (measured: 610 modules imported instead of 219).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from casedb import __version__
from casedb.errors import CasedbError
from casedb.console import terminal

app = typer.Typer(
    help="casedb: operator cases from real models, in one SQLite DB, run on any PyTorch backend.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Data (model and case names, messages) is printed as written: never read as Rich markup or
# emoji codes (a case named "[/m]" is a name, not a closing tag), never sent as control codes
# (casedb.console.clean: a name from a database may hold ESC sequences).
console = terminal()
err_console = terminal(stderr=True)


class State:
    db: Optional[Path] = None


state = State()


def _version(value: bool):
    if value:
        typer.echo(f"casedb {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    db: Optional[Path] = typer.Option(
        None, "--db", envvar="CASEDB_DB", help="Database file (default: data/casedb.sqlite, created on first use)."
    ),
    # metavar "": a flag takes no value, so its help shows none (Typer would show <bool>)
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                 help="Show the version."),
):
    state.db = db


def open_db():
    """The store of the global --db (default: data/casedb.sqlite)."""
    from casedb.ingest.seed import open_seeded

    return open_seeded(state.db)


def from_store(read, errors=(CasedbError,)):
    """``read(store)`` on the --db store; an error of ``errors`` (bad input) is exit 2."""
    try:
        with open_db() as store:
            return read(store)
    except errors as e:
        fail(e)


def fail(e: Exception, code: int = 2):
    """Print the error and exit (2: bad input)."""
    err_console.print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))



class stdout:
    """sys.stdout as a context (flushed on exit), where a command writes to a file or stdout."""

    def __enter__(self):
        return sys.stdout

    def __exit__(self, *exc):
        sys.stdout.flush()
