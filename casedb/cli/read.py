"""`casedb` commands that read the DB: report, serve, check.

Each command imports the library module it calls (see casedb.cli.common)."""

from __future__ import annotations

from typing import List, Optional

import typer

from casedb.cli.common import app, console, emit_json, err_console, fail, from_store, state
from casedb.errors import CasedbError
from casedb.console import clean

@app.command("report")
def report_cmd(
    run: Optional[int] = typer.Option(None, "--run", help="Run to report (default: the latest)."),
    compare: Optional[int] = typer.Option(
        None, "--compare", help="Baseline run (default: the previous run on the same device and backend)."),
    error_factor: float = typer.Option(10.0, "--error-factor", help="List cases whose max abs error grew more than this."),
    trend: int = typer.Option(5, "--trend", help="Runs shown in the trend."),
    latency_threshold: float = typer.Option(
        10.0, "--latency-threshold", help="List cases whose latency changed by more than this many percent "
        "(and beyond the measurement's noise)."),
    top: int = typer.Option(10, "--top", help="Slowest cases shown."),
    limit: int = typer.Option(20, "--limit", help="Rows per list in text and Markdown (--json has all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
    markdown: bool = typer.Option(False, "--markdown", help="Markdown, for a CI job summary."),
):
    """Pass rates per model and op, coverage, dedupe, runtime, trend, and changes since a baseline run."""
    from casedb.read import report

    data = from_store(lambda store: report.build(store.db, run, compare, error_factor=error_factor, trend=trend,
                                                 top=top, latency_threshold=latency_threshold / 100))
    if as_json:
        emit_json(data)
    elif markdown:
        typer.echo(clean(report.to_markdown(data, limit=limit)))
    else:
        report.print_report(data, console, limit=limit)


@app.command("serve")
def serve_cmd(
    port: int = typer.Option(8001, "--port", help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    open_browser: bool = typer.Option(False, "--open", help="Open the browser at the database page."),
):
    """Browse the DB in Datasette, read-only: pass-rate views, canned queries, charts, search."""
    from casedb.read import serve

    try:
        serve.serve(state.db, host=host, port=port, open_browser=open_browser)
    except CasedbError as e:
        fail(e)


# ------------------------------------------------------------------------------------- check

@app.command("check")
def check_cmd(
    model: Optional[List[str]] = typer.Option(None, "--model", help="Only these models (repeatable; default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """List cases whose inputs are invalid for their op (e.g. an index beyond the indexed dim); exit 1 if any."""
    from casedb.ingest import check

    found = from_store(lambda store: check.check_store(store, model))
    if as_json:
        emit_json(found)
    else:
        for r in found:
            for problem in r["problems"]:
                console.print(f"{r['source']}: {r['model']}::{r['case']}: {problem}", highlight=False, soft_wrap=True)
        err_console.print(f"{len(found)} invalid cases")
    if found:
        raise typer.Exit(1)

