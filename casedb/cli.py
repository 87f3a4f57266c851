"""The `casedb` command line: thin commands over the library (no SQL here)."""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from casedb import __version__
from casedb.run.console import clean, terminal
from casedb.errors import CasedbError
from casedb.read.tables import Format

app = typer.Typer(
    help="casedb: operator cases from real models, in one SQLite DB, run on any PyTorch backend.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Data (model and case names, messages) is printed as written: never read as Rich markup or
# emoji codes (a case named "[/m]" is a name, not a closing tag), never sent as control codes
# (casedb.run.console.clean: a name from a database may hold ESC sequences).
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
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
):
    state.db = db


def open_db():
    from casedb.store.database import open_store

    return open_store(state.db)


def fail(e: Exception, code: int = 2):
    err_console.print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False, soft_wrap=True)
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
    strict: bool = typer.Option(False, "--strict", help="Records the store cannot represent, and cases with invalid inputs "
                                                        "(see casedb check), are an error, not skipped or warned about."),
    replace: bool = typer.Option(False, "--replace", help="Each imported model's cases become exactly the imported "
                                                          "ones (cases runs have judged are retired: kept for history)."),
    allow_outside: bool = typer.Option(False, "--allow-outside", help="Read file: inputs outside the manifest's "
                                                                      "folder too (only for manifests you trust)."),
    max_input_mb: Optional[int] = typer.Option(None, "--max-input-mb", min=1,
                                               help="Largest input file, after decompression, in MiB (default 1024)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Parse, validate and count; write nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report."),
):
    """Import case files into the DB (one transaction: any error leaves it unchanged)."""
    from casedb.ingest.save import import_paths

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
                                  replace=replace, options={"level": level, "symbols": symbols or None},
                                  allow_outside=allow_outside,
                                  max_bytes=max_input_mb << 20 if max_input_mb else None)
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
    if report.retired or report.removed:
        console.print(f"--replace: {report.removed} case(s) no longer imported were removed; {report.retired} that "
                      "runs have judged were retired (kept for history, no longer listed or run)", highlight=False)
    for f in report.files:
        for w in f.warnings:
            err_console.print(f"warning: {w['where']}: case {w['case']!r}: {w['problem']}", highlight=False,
                              soft_wrap=True)
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
    console.print(Text.assemble((detail["op"], "bold"), f"  {detail['shapes']}"), highlight=False)
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
    from casedb.read import export

    try:
        if format not in ("yaml", "oplog"):
            fail(f"--format must be yaml or oplog, not {format!r}")
        with open_db() as store:
            left_out: list = []
            if output:
                n = export.write_file(store, model, output, format, skipped=left_out)
            else:
                with _stdout() as f:
                    n = (export.write_yaml(store, model, f) if format == "yaml"
                         else export.write_oplog(store, model, f, skipped=left_out))
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
    path: Optional[str] = typer.Option(None, "--path", help="Scan only this path of the recipe's matrix "
                                                            "(e.g. static-eager-grouped_mm-b2-s256)."),
    report: bool = typer.Option(False, "--report", help="Coverage report: ops and unique cases per path, and the "
                                                        "ops each runtime choice alone brings."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable summary."),
):
    """Build a model from its config on the meta device and record every operator call, along
    every path of its recipe's matrix (cache, attention, experts, batch, sequence length)."""
    from contextlib import nullcontext

    from casedb.scan.scanner import PHASES, scan_command

    try:
        with (open_db() if do_import else nullcontext()) as store:
            summary = scan_command(model, output=output, level=level, phases=phase or PHASES, arch=arch, store=store,
                                   path=path, report=report)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(summary)
        return
    if report:
        from casedb.scan.report import markdown

        console.print(markdown(summary["report"]), markup=False, highlight=False, soft_wrap=True)
    for p in summary.get("paths", []):
        err_console.print(f"  {p['path']}: {p['unique_calls']} unique calls of {p['ops']} ops in {p['seconds']} s",
                          highlight=False)
    err_console.print(f"{summary['model']}: {summary['unique_calls']} unique calls of {summary['ops']} ops "
                      f"({summary['calls']} calls, {summary['skipped']} skipped) in {summary['seconds']} s "
                      f"-> {summary['output']}", highlight=False)
    if "import" in summary:
        t = summary["import"]
        err_console.print(f"imported: {t['new_cases']} new cases, {t['duplicates']} duplicates", highlight=False)


# ------------------------------------------------------------------------------- run / repro

def _spec_parameters(*, skip: tuple = (), helps: dict | None = None) -> list[inspect.Parameter]:
    """`casedb run`'s options, one per RunSpec field that has `casedb run` flags (but ``skip``;
    ``helps`` rewords a field's help where another command gives it another meaning)."""
    from casedb.run.runspec import SAME, field_default, negative, spec_fields

    types = {"list": Optional[List[str]], "bool": bool, "int": int, "float": float, "str": str,
             "str | None": Optional[str], "int | None": Optional[int]}
    params = []
    for f, flag in spec_fields():
        if not flag.cli or f.name in skip:
            continue
        default = field_default(f.name) if flag.cli_default is SAME else flag.cli_default
        decls = list(flag.cli)
        if default is True:
            decls[0] = f"{decls[0]}/{negative(decls[0])}"
        if isinstance(default, list):
            default = None
        annotation = types[f.type]
        if flag.choices:  # Typer checks and lists the values of an Enum
            annotation = enum.Enum(f.name.title(), {c: c for c in flag.choices}, type=str)
            default = annotation(default)
        option = typer.Option(default, *decls, help=(helps or {}).get(f.name, flag.help), metavar=flag.metavar,
                              show_default=default not in (None, ""))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return params


def _option(name: str, annotation, default, *decls, help: str) -> inspect.Parameter:
    """A command's own option (beside the RunSpec ones), for a signature built at import."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, *decls, help=help))


def run_cmd(**options):
    """Run cases on the device against the CPU reference; record the run in the DB."""
    from casedb.run import console as run_console
    from casedb.run import runner
    from casedb.run.runspec import RunSpec

    resume, as_json, no_progress = options.pop("resume"), options.pop("as_json"), options.pop("no_progress")
    options = {k: v.value if isinstance(v, enum.Enum) else v for k, v in options.items()}
    try:
        spec = RunSpec(**options)
        summary = runner.run(spec, db=state.db, resume=resume, progress=not (no_progress or as_json), console=err_console)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(run_console.summary_json(summary))
    else:
        table, line = run_console.summary_tables(summary)
        console.print(table)
        console.print(line)
        for note in run_console.summary_notes(summary):
            err_console.print(run_console.text(note))
    raise typer.Exit(1 if summary["unexpected"] or summary["status"] != "finished" else 0)


run_cmd.__signature__ = inspect.Signature([
    *_spec_parameters(),
    inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int], default=typer.Option(
        None, "--resume", metavar="RUN_ID",
        help="Finish run RUN_ID (its selection and target; give its --import modules again).")),
    _option("as_json", bool, False, "--json", help="Print the summary as JSON."),
    _option("no_progress", bool, False, "--no-progress", help="No progress bar."),
])
app.command("run")(run_cmd)


@app.command("repro")
def repro_cmd(
    name: str = typer.Argument(..., help="Signature prefix, case name, or model::name."),
    device: Optional[str] = typer.Option(None, "--device", help="Target device written into the script (default: cuda when available, else cpu)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Dynamo backend, or eager (default: env TEST_COMPILE_BACKEND, else inductor)."),
    imports: Optional[List[str]] = typer.Option(None, "--import", help="Module (or .py file) the script imports first (repeatable)."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Tolerance (default: the case's)."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Tolerance (default: the case's)."),
    no_device_replace: bool = typer.Option(False, "--no-device-replace", help="Keep device strings recorded in the case."),
    model: Optional[str] = typer.Option(None, "--model", help="Use this model's tolerances (when models share the case)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the script here (default: stdout)."),
):
    """Print a standalone Python script (torch only) that reproduces one case."""
    from casedb.read import repro

    try:
        with open_db() as store:
            script = repro.script(store, name, device=device, backend=backend, imports=list(imports or []),
                                  rtol=rtol, atol=atol, replace_device=not no_device_replace, model=model)
    except CasedbError as e:
        fail(e)
    if output:
        output.write_text(script, encoding="utf-8")
        err_console.print(f"wrote {output}: run it with python {output}", markup=False, highlight=False)
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
    from casedb.store import merge
    from casedb.store.database import db_path

    try:
        report = merge.merge(into or db_path(state.db), list(sources), combine=combine)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report)
        return
    for part in report["sources"]:
        console.print(f"{part['source']}: {part['runs']} runs, {part['results']} results, {part['judgements']} judgements, "
                      f"{part['new_cases']} new cases ({part['runs_already_merged']} runs already there)",
                      markup=False, highlight=False)
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
    from casedb.read import report

    try:
        with open_db() as store:
            data = report.build(store.db, run, compare, error_factor=error_factor, trend=trend, top=top)
    except CasedbError as e:
        fail(e)
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

    try:
        with open_db() as store:
            found = check.check_store(store, model)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(found)
    else:
        for r in found:
            for problem in r["problems"]:
                console.print(f"{r['source']}: {r['model']}::{r['case']}: {problem}", highlight=False, soft_wrap=True)
        err_console.print(f"{len(found)} invalid cases")
    if found:
        raise typer.Exit(1)


# -------------------------------------------------------------------------------------- runs

runs_app = typer.Typer(help="Recorded runs: list them, label them, delete them.", invoke_without_command=True)
app.add_typer(runs_app, name="runs")


@contextlib.contextmanager
def _history():
    """The DB's run history connection (the store opened first: its migrations, its checks)."""
    from casedb.store import history

    with open_db() as store:
        conn = history.connect(store.path)
    try:
        yield conn
    finally:
        conn.close()


RUN_COLUMNS = ("run_id", "label", "status", "device", "backend", "started_at", "executed", "passed", "failed",
               "errors", "xfailed", "xpassed")


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
    """List runs, newest first: target, label, status and counts."""
    if ctx.invoked_subcommand is not None:
        return
    from casedb.store import history

    try:
        with _history() as conn:
            rows = history.list_runs(conn, backend=backend, device=device, label=label,
                                     mutants=mutants, limit=limit)
    except CasedbError as e:
        fail(e)
    from casedb.read import tables

    tables.emit(rows, RUN_COLUMNS, console=console, fmt=tables.Format.json if as_json else fmt,
                headers={"run_id": "run", "started_at": "started"})


@runs_app.command("label")
def runs_label_cmd(
    run: int = typer.Argument(..., help="The run to label."),
    label: Optional[str] = typer.Argument(None, help="Its label (leave out with --clear)."),
    clear: bool = typer.Option(False, "--clear", help="Remove the run's label."),
):
    """Give a run a label (what `casedb runs --label` and report show)."""
    from casedb.store import history

    if (label is None) == (not clear):
        fail(CasedbError("give a LABEL, or --clear to remove the run's label"))
    try:
        with _history() as conn:
            history.set_label(conn, run, None if clear else label)
    except CasedbError as e:
        fail(e)
    err_console.print(f"run {run}: " + ("label removed" if clear else f"labelled {clean(label)!r}"), highlight=False)


@runs_app.command("delete")
def runs_delete_cmd(
    runs: List[int] = typer.Argument(..., help="The runs to delete."),
    force: bool = typer.Option(False, "--force", help="Delete a run even while its process is alive."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Delete runs with their results and judgements, in one transaction (cases stay)."""
    from casedb.store import history

    try:
        with _history() as conn:
            done = history.delete_runs(conn, runs, force=force)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(done)
    else:
        err_console.print(f"deleted {done['runs']} run(s) ({', '.join(map(str, done['run_ids']))}): "
                          f"{done['results']} results, {done['judgements']} judgements", highlight=False)


# ------------------------------------------------------------------------------------ triage

triage_app = typer.Typer(
    help="Triage files: the expected status of each case per target (known failures, not supported, "
         "tolerances); see casedb.triage.entries.",
    no_args_is_help=True,
)
app.add_typer(triage_app, name="triage")


def _triage_files(files) -> list[Path]:
    from casedb.triage import entries as triage

    paths = list(files or triage.default_paths())
    if not paths:
        fail("no triage files: give FILE..., or keep them in triage/*.yaml")
    return paths


@triage_app.command("check")
def triage_check_cmd(
    files: Optional[List[Path]] = typer.Argument(None, help="Triage files (default: triage/*.yaml)."),
    no_db: bool = typer.Option(False, "--no-db", help="Skip the checks that need the DB (stale entries)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Check triage files: unknown keys, bad values and patterns, stale entries, entries that tie and
    disagree. Exit 2 when there is a problem (each with file:line); the DB is only read."""
    from casedb.triage import entries as triage

    paths = _triage_files(files)
    try:
        if no_db:
            problems = triage.check(paths)
        else:
            with open_db() as store:
                problems = triage.check(paths, store)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json({"files": [str(p) for p in paths], "problems": [p.to_dict() for p in problems]})
    else:
        for p in problems:
            err_console.print(str(p), highlight=False, soft_wrap=True)
        err_console.print(f"{len(paths)} file(s): " + (f"{len(problems)} problem(s)" if problems else "no problems"),
                          highlight=False, soft_wrap=True)
    raise typer.Exit(2 if problems else 0)


@triage_app.command("update")
def triage_update_cmd(
    file: Optional[Path] = typer.Argument(
        None, help="The triage file to edit (default: the one triage/*.yaml; created when missing)."),
    from_run: int = typer.Option(..., "--from-run", metavar="RUN", help="The run whose results to triage."),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="Write the result here ('-': stdout) instead of editing FILE."),
    scope: str = typer.Option("device", "--scope", help="Target keys new entries are scoped to: device, backend, "
                                                        "arch (comma-separated), or none."),
    as_json: bool = typer.Option(False, "--json", help="Print the changes as JSON."),
):
    """Propose triage changes from a run, as a minimal edit of FILE: new failures become known_failure
    (stage, first error line), known failures that pass are removed, unspecified cases that pass are
    promoted to expected_pass. Tolerances are never loosened. The DB is only read."""
    from casedb.triage import entries as triage

    keys = [] if scope.strip() == "none" else [k.strip() for k in scope.split(",") if k.strip()]
    bad = [k for k in keys if k not in triage.TARGET_KEYS]
    if bad:
        fail(f"--scope takes device, backend, arch (comma-separated) or none, not {', '.join(bad)}")
    if file is None:
        found = triage.default_paths()
        if not found:  # the first triage file: the one -o names, else triage/triage.yaml
            file = output if output is not None and str(output) != "-" else Path("triage") / "triage.yaml"
        elif len(found) == 1:
            file = found[0]
        else:
            fail(f"give the triage FILE to edit (triage/ has {len(found)})")
    others = [p for p in triage.default_paths() if p.resolve() != file.resolve()]
    try:
        with open_db() as store:
            prop = triage.propose(store, from_run, file, others=others, scope=tuple(keys))
    except CasedbError as e:
        fail(e)
    written = None
    if output is not None and str(output) == "-":
        typer.echo(prop.text, nl=False)
    elif prop.changed or output is not None:
        written = output or file
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(prop.text, encoding="utf-8")
    if as_json:
        emit_json({**prop.to_dict(), "written": str(written) if written else None})
        return
    for what, items in (("known_failure added", prop.added), ("promoted to expected_pass", prop.promoted)):
        for d in items:
            sel = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("status", "reason"))
            err_console.print(f"{what}: {sel}", highlight=False, soft_wrap=True)
    for where in prop.removed:
        err_console.print(f"removed (passes now): the known_failure entry at {where}", highlight=False, soft_wrap=True)
    for where in prop.rewritten:
        err_console.print(f"now expected_pass (passes; tolerance kept): the entry at {where}", highlight=False, soft_wrap=True)
    for where, why in prop.kept:
        err_console.print(f"kept: the entry at {where}: {why}", highlight=False, soft_wrap=True)
    for case, where in prop.regressions:
        err_console.print(f"regression left as it is: {case} is expected to pass ({where}) and failed",
                          highlight=False, soft_wrap=True)
    counts = (f"{len(prop.added)} added, {len(prop.removed) + len(prop.rewritten)} removed or made expected_pass, "
              f"{len(prop.promoted)} promoted")
    err_console.print(f"{written}: {counts}" if written else f"printed, not written: {counts}"
                      if output is not None else "no changes", highlight=False, soft_wrap=True)


@triage_app.command("import")
def triage_import_cmd(
    files: List[Path] = typer.Argument(..., help="The RFC implementation's skip_files.yaml and test-suite configs."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the triage file here (default: stdout)."),
    device: Optional[str] = typer.Option(None, "--device", help="Scope every entry to this device (e.g. spyre)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Scope every entry to this backend."),
    arch: Optional[str] = typer.Option(None, "--arch", help="Scope every entry to this architecture."),
):
    """Turn the RFC implementation's skip/xfail lists and test-suite config (modes, unlisted_test_mode,
    per-dtype precision) into a triage file."""
    from casedb.triage import entries as triage

    try:
        text = triage.import_rfc(files, scope={"device": device, "backend": backend, "arch": arch})
    except CasedbError as e:
        fail(e)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        err_console.print(f"wrote {output}: check it with casedb triage check {output}", highlight=False)


# ----------------------------------------------------------------------------------- mutants

MUTANT_BASE_HELP = ("The real backend the mutants wrap (default eager: dynamo's, the captured graph run by PyTorch; "
                    "aot_eager, inductor, or one registered by an --import module).")


def mutants_cmd(**options):
    """Mutation score: run the control and faulty backends (casedb.mutation.mutants) over a model's cases;
    per mutant, the cases it changes and how many of them fail. Exit 1 on a false alarm.

    The selection and target options are casedb run's (every mark unless -m is given)."""
    from casedb.mutation import score as mutation
    from casedb.run.runspec import RunSpec

    mutant, show, list_only = options.pop("mutant"), options.pop("show"), options.pop("list_only")
    as_json, no_progress = options.pop("as_json"), options.pop("no_progress")
    options = {k: v.value if isinstance(v, enum.Enum) else v for k, v in options.items()}
    base = options.pop("backend")  # None: casedb.mutation.mutants.DEFAULT_BASE
    try:
        if list_only:
            known = mutation.registry(options.get("imports") or [])
            rows = [{"name": m.name, "kind": m.kind, "backend": m.backend, "doc": m.doc} for m in known.values()]
            if as_json:
                emit_json(rows)
            else:
                for r in rows:
                    console.print(f"{r['name']} ({r['kind']}): {r['doc']}", highlight=False, soft_wrap=True)
            return
        spec = RunSpec(**options).validate()
        report = mutation.run_mutants(spec, mutants=mutant, base=base, db=state.db,
                                      progress=not (no_progress or as_json), console=err_console)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report)
    else:
        mutation.print_report(report, console, show=show)
    if report["control"]["false_alarms"]:
        raise typer.Exit(1)


mutants_cmd.__signature__ = inspect.Signature([
    *_spec_parameters(helps={"backend": MUTANT_BASE_HELP}),
    _option("mutant", Optional[List[str]], None, "--mutant", help="Only this mutant (repeatable; default: all)."),
    _option("show", int, 5, "--show", help="Survivors and false alarms listed per mutant (--json has all)."),
    _option("list_only", bool, False, "--list", help="List the registered mutants (with --import's) and exit."),
    _option("as_json", bool, False, "--json", help="Machine-readable report."),
    _option("no_progress", bool, False, "--no-progress", help="No progress output."),
])
app.command("mutants")(mutants_cmd)


class _stdout:
    def __enter__(self):
        return sys.stdout

    def __exit__(self, *exc):
        sys.stdout.flush()


def main():
    app()
