"""The `casedb` command line: thin commands over the library (options in, one library call, a
CasedbError out as exit 2; no SQL here). Each module registers its commands on :data:`app`:
cases (import, models, cases, show, stats, export), run (scan, run, repro, merge), read (report,
serve, check), runs (list, label, delete), triage, mutants, explain."""

from __future__ import annotations

# each module registers its commands, in the order `casedb --help` lists them
from casedb.cli import cases, run, read, runs, triage, mutants  # noqa: F401
from casedb.cli import cache, coverage, explain  # noqa: F401,E402
from casedb.cli.common import app

__all__ = ["app", "main"]


# Commands whose exit status is a verdict (a red run is 1): a reader gone (`| head`) keeps it 1,
# since the verdict could not be read; every other command exits 0 quietly then.
VERDICT_COMMANDS = {"run", "mutants", "check"}


def main():
    import sys

    try:
        app()
    except SystemExit:
        if _reader_gone() and _command(sys.argv[1:]) not in VERDICT_COMMANDS:
            _quiet_stdout()
            raise SystemExit(0) from None
        raise


def _reader_gone() -> bool:
    """Whether stdout's reader went away (EPIPE): click swaps stdout then exits 1; Rich (the
    tables) makes its console quiet then exits 1."""
    import sys

    from casedb.cli.common import console

    return type(sys.stdout).__name__ in ("PacifyFlushWrapper", "PacketizingStream") or console.quiet


def _command(args: list[str]) -> str | None:
    """The command named in ``args`` (after the global options)."""
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--db":
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def _quiet_stdout() -> None:
    """stdout to /dev/null: the flush at exit must not print a BrokenPipeError."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno())
    finally:
        os.close(devnull)
