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
    sym: Optional[List[str]] = typer.Option(None, "--sym", help="Value of a symbolic size in an operator log, e.g. s0=128 (repeatable)."),
    strict: bool = typer.Option(False, "--strict", help="Records the store cannot represent are an error, not skipped."),
    replace: bool = typer.Option(False, "--replace", help="Replace the imported models' cases instead of adding to them."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Parse, validate and count; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
):
    """Import case files into the DB (one transaction: any error leaves it unchanged)."""
    from casedb.ingest import import_paths

    if level is not None and level not in ("top", "leaf"):
        fail(f"--level must be top or leaf, not {level!r}")
    symbols = {}
    for item in sym or []:
        name, eq, value = item.partition("=")
        if not eq or not value.strip().lstrip("-").isdigit():
            fail(f"--sym takes NAME=INT (e.g. s0=128), not {item!r}")
        symbols[name.strip()] = int(value)
    try:
        with open_db() as store:
            report = import_paths(store, paths, format=format, model=model, dry_run=dry_run, strict=strict,
                                  replace=replace, options={"level": level, "symbols": symbols or None})
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report.to_dict())
        return
    table = Table(title="dry run: nothing written" if dry_run else None)
    for col in ("file", "format", "model", "records", "new cases", "duplicates", "skipped"):
        table.add_column(col, overflow="fold",
                         justify="right" if col in ("records", "new cases", "duplicates", "skipped") else "left")
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
            left_out: list = []
            with (open(output, "w", encoding="utf-8") if output else _stdout()) as f:
                if format == "yaml":
                    n = export.write_yaml(store, model, f, output)
                else:
                    n = export.write_oplog(store, model, f, output, skipped=left_out)
    except (CasedbError, ValueError) as e:
        fail(e)
    for s in left_out:
        err_console.print(f"not written (oplog cannot express it): {s['case']}: {s['reason']}", highlight=False)
    if output:
        err_console.print(f"wrote {n} cases to {output}")


# -------------------------------------------------------------------------------------- scan

@app.command("scan")
def scan_cmd(
    model: str = typer.Argument(..., help="Recipe name (granite4h, gpt-oss, ...), a recipe .yaml, or a config.json."),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="Scan JSONL to write (default: data/scans/<model>-<level>.jsonl)."),
    do_import: bool = typer.Option(False, "--import", help="Also import the scan into the DB."),
    level: str = typer.Option("torch", "--level", help="torch (what the model code calls) or aten (ATen overloads)."),
    phase: Optional[List[str]] = typer.Option(None, "--phase", help="prefill or decode (repeatable; default both)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="Model class for a config.json (default: its architectures)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable summary."),
):
    """Build a model from its config on the meta device and record every operator call."""
    from contextlib import nullcontext

    from casedb.scan import PHASES, scan_command

    try:
        with (open_db() if do_import else nullcontext()) as store:
            summary = scan_command(model, output=output, level=level, phases=phase or PHASES, arch=arch, store=store)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(summary)
        return
    err_console.print(f"{summary['model']}: {summary['unique_calls']} unique calls of {summary['ops']} ops "
                      f"({summary['calls']} calls, {summary['skipped']} skipped) in {summary['seconds']} s "
                      f"-> {summary['output']}", highlight=False)
    if "import" in summary:
        t = summary["import"]
        err_console.print(f"imported: {t['new_cases']} new cases, {t['duplicates']} duplicates", highlight=False)


# ------------------------------------------------------------------------------- run / repro

@app.command("run")
def run_cmd(
    model: Optional[List[str]] = typer.Option(None, "--model", help="Run these models' cases (repeatable; default: all)."),
    keyword: Optional[str] = typer.Option(None, "-k", help="pytest -k: op (torch.add, aten.mm), case or model name."),
    markexpr: str = typer.Option(
        "", "-m", help="Marker expression, e.g. 'not constant' (default: every selected case; the pytest front end "
                       "applies the RFC's 'not largedimtensor and not fp32operation and not bf16operation and "
                       "not constant' unless -m is given)."),
    op: Optional[str] = typer.Option(None, "--op", help="Only this op (exact or substring)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N selected cases."),
    shard: Optional[str] = typer.Option(None, "--shard", help="Only slice I/N (stable by signature), e.g. 2/4."),
    dedupe: bool = typer.Option(True, "--dedupe/--no-dedupe", help="Run each unique case once (default) or every occurrence."),
    device: Optional[str] = typer.Option(None, "--device", help="Target device (default: cuda when available, else cpu)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Dynamo backend, or eager (default: env TEST_COMPILE_BACKEND, else inductor)."),
    imports: Optional[List[str]] = typer.Option(None, "--import", help="Module (or .py file) imported in every worker first (repeatable)."),
    reference_dtype: Optional[str] = typer.Option(None, "--reference-dtype", help="Also compare with an upcast reference (float32/float64)."),
    check_determinism: bool = typer.Option(False, "--check-determinism", help="Run the target twice; require identical bits."),
    no_device_replace: bool = typer.Option(False, "--no-device-replace", help="Keep device strings recorded in cases (cuda:0)."),
    jobs: int = typer.Option(1, "-j", "--jobs", help="Worker processes (pytest-xdist); 0: in this process, no isolation."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds per case before it counts as a timeout (0: none)."),
    fail_fast: bool = typer.Option(False, "--fail-fast", "-x", help="Stop at the first unexpected outcome."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Finish run RUN_ID (same selection and target)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
):
    """Run cases on the device against the CPU reference; record the run in the DB."""
    from casedb import runner

    opts = runner.RunOptions(
        models=list(model or []), dedupe=dedupe, keyword=keyword, markexpr=markexpr, op=op, limit=limit, shard=shard,
        device=device, backend=backend, imports=list(imports or []), reference_dtype=reference_dtype,
        check_determinism=check_determinism, replace_device=not no_device_replace, jobs=jobs, timeout=timeout,
        fail_fast=fail_fast)
    try:
        summary = runner.run(opts, db=state.db, resume=resume, progress=not (no_progress or as_json), console=err_console)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(runner.summary_json(summary))
    else:
        table, line = runner.summary_tables(summary)
        console.print(table)
        console.print(line, highlight=False)
        for note in runner.summary_notes(summary):
            err_console.print(note, highlight=False)
    raise typer.Exit(1 if summary["unexpected"] or summary["status"] != "finished" else 0)


@app.command("repro")
def repro_cmd(
    name: str = typer.Argument(..., help="Signature prefix, case name, or model::name."),
    device: Optional[str] = typer.Option(None, "--device", help="Target device written into the script (default: cuda when available, else cpu)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Dynamo backend, or eager (default: env TEST_COMPILE_BACKEND, else inductor)."),
    imports: Optional[List[str]] = typer.Option(None, "--import", help="Module (or .py file) the script imports first (repeatable)."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Tolerance (default: the case's)."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Tolerance (default: the case's)."),
    no_device_replace: bool = typer.Option(False, "--no-device-replace", help="Keep device strings recorded in the case."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the script here (default: stdout)."),
):
    """Print a standalone Python script (torch only) that reproduces one case."""
    from casedb import repro

    try:
        with open_db() as store:
            script = repro.script(store, name, device=device, backend=backend, imports=list(imports or []),
                                  rtol=rtol, atol=atol, replace_device=not no_device_replace)
    except CasedbError as e:
        fail(e)
    if output:
        output.write_text(script, encoding="utf-8")
        err_console.print(f"wrote {output}: run it with python {output}")
    else:
        typer.echo(script, nl=False)


@app.command("merge")
def merge_cmd(
    sources: List[Path] = typer.Argument(..., help="Databases to fold in (e.g. one per CI shard)."),
    into: Optional[Path] = typer.Option(None, "--into", "-o", help="Target DB (default: --db, else the default DB)."),
    combine: bool = typer.Option(False, "--combine", help="Make all source runs one run (the shards of one job)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
):
    """Fold runs, results and judgements (and any cases/models missing) from other DBs into one."""
    import os

    from casedb import runner
    from casedb.store import DEFAULT_DB

    target = into or state.db or os.environ.get("CASEDB_DB") or DEFAULT_DB
    try:
        report = runner.merge(target, list(sources), combine=combine)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report)
        return
    for part in report["sources"]:
        console.print(f"{part['source']}: {part['runs']} runs, {part['results']} results, {part['judgements']} judgements, "
                      f"{part['new_cases']} new cases ({part['runs_already_merged']} runs already there)", highlight=False)
    if report.get("run_id") is not None:
        console.print(f"combined into run {report['run_id']}", highlight=False)


# ---------------------------------------------------------------------------- report / serve

@app.command("report")
def report_cmd(
    run: Optional[int] = typer.Option(None, "--run", help="Run to report (default: the latest)."),
    compare: Optional[int] = typer.Option(
        None, "--compare", help="Baseline run (default: the previous run on the same device and backend)."),
    error_factor: float = typer.Option(10.0, "--error-factor", help="List cases whose max abs error grew more than this."),
    trend: int = typer.Option(5, "--trend", help="Runs shown in the trend."),
    top: int = typer.Option(10, "--top", help="Slowest cases shown."),
    limit: int = typer.Option(20, "--limit", help="Rows per list in text and Markdown (--json has all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
    markdown: bool = typer.Option(False, "--markdown", help="Markdown, for a CI job summary."),
):
    """Pass rates per model and op, coverage, dedupe, runtime, trend, and changes since a baseline run."""
    from casedb import report

    try:
        with open_db() as store:
            data = report.build(store.db, run, compare, error_factor=error_factor, trend=trend, top=top)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(data)
    elif markdown:
        typer.echo(report.to_markdown(data, limit=limit))
    else:
        report.print_report(data, console, limit=limit)


@app.command("serve")
def serve_cmd(
    port: int = typer.Option(8001, "--port", help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    open_browser: bool = typer.Option(False, "--open", help="Open the browser at the database page."),
):
    """Browse the DB in Datasette, read-only: pass-rate views, canned queries, charts, search."""
    from casedb import serve

    try:
        serve.serve(state.db, host=host, port=port, open_browser=open_browser)
    except CasedbError as e:
        fail(e)


class _stdout:
    def __enter__(self):
        return sys.stdout

    def __exit__(self, *exc):
        sys.stdout.flush()


def main():
    app()
