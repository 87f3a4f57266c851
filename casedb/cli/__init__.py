"""The `casedb` command line: thin commands over the library (options in, one library call, a
CasedbError out as exit 2; no SQL here). Each module registers its commands on :data:`app`:
cases (import, models, cases, show, stats, export), run (scan, run, repro, merge), read (report,
serve, check), runs (list, label, delete), triage, mutants."""

from __future__ import annotations

# each module registers its commands, in the order `casedb --help` lists them
from casedb.cli import cases, run, read, runs, triage, mutants  # noqa: F401
from casedb.cli import cache  # noqa: F401,E402
from casedb.cli import coverage  # noqa: F401,E402
from casedb.cli.common import app

__all__ = ["app", "main"]


def main():
    app()
