"""The `casedb` command line: thin commands over the library (no SQL here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from casedb import __version__
from casedb.errors import CasedbError

app = typer.Typer(
    help="casedb: operator cases from real models, in one SQLite DB, run on any PyTorch backend.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


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
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
):
    state.db = db


def open_db():
    from casedb.store import open_store

    return open_store(state.db)


def fail(e: Exception, code: int = 2):
    err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


# ------------------------------------------------------------------------------------ import

@app.command("import")
def import_cmd(
    paths: List[Path] = typer.Argument(..., help="Manifests, scan JSONL or traces; folders are expanded."),
    format: Optional[str] = typer.Option(None, "--format", "-f", help="Force a format: yaml, scan, kineto, et, oplog."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (required for traces; overrides the file's)."),
    level: Optional[str] = typer.Option(None, "--level", help="Trace nesting: top (default, what the model called) or leaf."),
    strict: bool = typer.Option(False, "--strict", help="Records the store cannot represent are an error, not skipped."),
    replace: bool = typer.Option(False, "--replace", help="Replace the imported models' cases instead of adding to them."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Parse, validate and count; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
):
    """Import case files into the DB (one transaction: any error leaves it unchanged)."""
    from casedb.ingest import import_paths

    if level is not None and level not in ("top", "leaf"):
        fail(f"--level must be top or leaf, not {level!r}")
    try:
        with open_db() as store:
            report = import_paths(store, paths, format=format, model=model, dry_run=dry_run, strict=strict,
                                  replace=replace, options={"level": level})
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report.to_dict())
        return
    table = Table(title="dry run: nothing written" if dry_run else None)
    for col in ("file", "format", "model", "records", "new cases", "duplicates", "skipped"):
        table.add_column(col, justify="right" if col in ("records", "new cases", "duplicates", "skipped") else "left")
    for f in report.files:
        table.add_row(f.path, f.format, f.model or "", str(f.records), str(f.new_cases), str(f.duplicates), str(f.skipped))
    console.print(table)
    for f in report.files:
        for s in f.skipped_reasons[:20]:
            err_console.print(f"skipped {s.get('where')}: {s.get('op')}: {s.get('reason')}", highlight=False)
        if len(f.skipped_reasons) > 20:
            err_console.print(f"... and {len(f.skipped_reasons) - 20} more skipped in {f.path} (see --json)")


# ----------------------------------------------------------------------------------- listing

@app.command("models")
def models_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """List models with their case counts."""
    try:
        with open_db() as store:
            rows = store.models()
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(rows)
        return
    table = Table()
    for col in ("model", "variant of", "cases", "unique", "ops", "calls", "source"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["variant_of"] or "", str(r["cases"]), str(r["unique_cases"]), str(r["ops"]),
                      str(r["calls"]), r["source"] or "")
    console.print(table)


CASE_KEYS = ("model", "name", "op", "signature", "shapes", "dtype", "marks", "count", "rtol", "atol", "description")


@app.command("cases")
def cases_cmd(
    model: Optional[List[str]] = typer.Option(None, "--model", help="Only these models (repeatable)."),
    op: Optional[str] = typer.Option(None, "--op", help="Only this op (exact or substring)."),
    keyword: Optional[str] = typer.Option(None, "-k", help="Substring of case name, op or model."),
    markexpr: Optional[str] = typer.Option(None, "-m", help="Marker expression, e.g. 'not constant'."),
    show_excluded: bool = typer.Option(False, "--show-excluded",
                                       help="Show the cases the marker expression (default: the RFC's) excludes."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Show at most N."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """List case occurrences."""
    try:
        with open_db() as store:
            rows = store.occurrences(model, op=op, keyword=keyword, markexpr=markexpr, show_excluded=show_excluded)
    except (CasedbError, ValueError) as e:
        fail(e)
    rows = rows[:limit] if limit else rows
    if as_json:
        emit_json([{k: r[k] for k in CASE_KEYS} for r in rows])
        return
    table = Table()
    for col in ("model", "name", "op", "inputs", "marks", "sig"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["model"], r["name"], r["op"], r["shapes"], ",".join(r["marks"]), r["signature"][:12])
    console.print(table)
    err_console.print(f"{len(rows)} cases")


@app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="Case name, model::name, or signature prefix."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Show one case: what is executed and where each model uses it."""
    try:
        with open_db() as store:
            rows = store.find(name)
    except CasedbError as e:
        fail(e)
    first = rows[0]
    detail = {k: first[k] for k in ("signature", "op", "inputs", "attrs", "dtype", "seed", "derived_marks", "shapes")}
    detail["occurrences"] = [
        {k: r[k] for k in ("model", "name", "description", "source", "count", "marks", "rtol", "atol",
                           "skip_if", "expects_error", "xfail")}
        for r in rows if r["signature"] == first["signature"]
    ]
    if as_json:
        emit_json(detail)
        return
    console.print(f"[bold]{detail['op']}[/]  {detail['shapes']}", highlight=False)
    console.print(f"signature {detail['signature']}  dtype {detail['dtype']}  marks {', '.join(detail['derived_marks'])}")
    console.print_json(json.dumps({"inputs": detail["inputs"], "attrs": detail["attrs"]}))
    for o in detail["occurrences"]:
        console.print(f"- {o['model']}::{o['name']} ×{o['count']} rtol={o['rtol']} atol={o['atol']} "
                      f"marks={','.join(o['marks'])}", highlight=False)
        if o["description"]:
            console.print("  " + o["description"].replace("\n", "\n  "), highlight=False)


@app.command("stats")
def stats_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Counts: models, unique cases, occurrences, duplicates."""
    try:
        with open_db() as store:
            s = store.stats()
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(s)
        return
    table = Table(show_header=False)
    for k, v in s.items():
        table.add_row(k, str(v))
    console.print(table)


@app.command("export")
def export_cmd(
    model: str = typer.Option(..., "--model", help="Model to export."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="File to write (default: stdout)."),
    format: str = typer.Option("yaml", "--format", help="yaml (RFC-0186 manifest) or oplog (operator_inp_logs)."),
):
    """Write a model's cases as an RFC YAML manifest (or an operator_inp_logs file)."""
    from casedb import export

    try:
        if format not in ("yaml", "oplog"):
            fail(f"--format must be yaml or oplog, not {format!r}")
        with open_db() as store:
            if output:
                output.parent.mkdir(parents=True, exist_ok=True)
            writer = export.write_yaml if format == "yaml" else export.write_oplog
            with (open(output, "w", encoding="utf-8") if output else _stdout()) as f:
                n = writer(store, model, f, output)
    except (CasedbError, ValueError) as e:
        fail(e)
    if output:
        err_console.print(f"wrote {n} cases to {output}")


class _stdout:
    def __enter__(self):
        return sys.stdout

    def __exit__(self, *exc):
        sys.stdout.flush()


def main():
    app()
