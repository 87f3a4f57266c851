"""`casedb runs`: list, label and delete recorded runs (casedb.store.run_listing)."""

from __future__ import annotations

from typing import List, Optional

import typer

from casedb.cli.common import app, console, emit_json, err_console, fail, open_db
from casedb.errors import CasedbError
from casedb.read.tables import Format
from casedb.console import clean

runs_app = typer.Typer(help="Recorded runs: list them, label them, delete them.", invoke_without_command=True)
app.add_typer(runs_app, name="runs")


RUN_COLUMNS = ("run_id", "label", "status", "device", "backend", "front_end", "selection", "rerun_of", "triage",
               "started_at", "duration_s", "executed", "passed", "failed", "errors", "xfailed", "xpassed")


@runs_app.callback()
def runs_cmd(
    ctx: typer.Context,
    backend: Optional[str] = typer.Option(None, "--backend", help="Only runs of this backend."),
    device: Optional[str] = typer.Option(None, "--device", help="Only runs on this device."),
    label: Optional[str] = typer.Option(None, "--label", help="Only runs whose label matches (wildcards * ? [])."),
    mutants: bool = typer.Option(True, "--mutants/--no-mutants", help="Include the runs of `casedb mutants`."),
    limit: Optional[int] = typer.Option(None, "--limit", help="The newest N runs only."),
    fmt: Optional[Format] = typer.Option(None, "--format",
                                         help="table, plain (tab-separated rows) or json; default: a table "
                                              "on a terminal, plain rows in a pipe."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (--format json)."),
):
    """List runs, newest first: label, status, front end (casedb run, pytest, casedb mutants, merge),
    target, selection (its shard among it), the earlier run a partial rerun re-ran part of, the
    triage files applied, start and duration, and counts."""
    if ctx.invoked_subcommand is not None:
        return
    from casedb.store.run_listing import list_runs

    try:
        with open_db() as store:
            rows = list_runs(store.conn, backend=backend, device=device, label=label, mutants=mutants, limit=limit)
    except CasedbError as e:
        fail(e)
    from casedb.read import tables

    if not as_json and fmt is not tables.Format.json:  # a cell holds text: the triage files as a list of names
        rows = [{**r, "triage": ", ".join(r["triage"])} for r in rows]
    tables.emit(rows, RUN_COLUMNS, console=console, fmt=tables.Format.json if as_json else fmt,
                headers={"run_id": "run", "started_at": "started", "front_end": "front end",
                         "rerun_of": "rerun of", "duration_s": "seconds"})


@runs_app.command("label")
def runs_label_cmd(
    run: int = typer.Argument(..., help="The run to label."),
    label: Optional[str] = typer.Argument(None, help="Its label (leave out with --clear)."),
    clear: bool = typer.Option(False, "--clear", help="Remove the run's label."),
):
    """Give a run a label (what `casedb runs --label` and report show)."""
    from casedb.store.run_listing import set_label

    if (label is None) == (not clear):
        fail(CasedbError("give a LABEL, or --clear to remove the run's label"))
    try:
        with open_db() as store:
            set_label(store.conn, run, None if clear else label)
    except CasedbError as e:
        fail(e)
    err_console.print(f"run {run}: " + ("label removed" if clear else f"labelled {clean(label)!r}"), highlight=False)


def label_run(run_id: int, label: str) -> None:
    """Label run ``run_id`` (`casedb run --label`: as `casedb runs label` does)."""
    from casedb.store.run_listing import set_label

    with open_db() as store:
        set_label(store.conn, run_id, label)


@runs_app.command("delete")
def runs_delete_cmd(
    runs: List[int] = typer.Argument(..., help="The runs to delete."),
    force: bool = typer.Option(False, "--force", help="Delete a run even while its process is alive."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Delete runs with their results and judgements, in one transaction (cases stay)."""
    from casedb.store.run_listing import delete_runs

    try:
        with open_db() as store:
            done = delete_runs(store.conn, runs, force=force)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(done)
    else:
        err_console.print(f"deleted {done['runs']} run(s) ({', '.join(map(str, done['run_ids']))}): "
                          f"{done['results']} results, {done['judgements']} judgements", highlight=False)
