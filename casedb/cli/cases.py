"""`casedb` commands over the cases: import, models, cases, show, stats, export.

Each command imports the library module it calls (see casedb.cli.common)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

import importers
from casedb.cli.common import app, console, emit_json, err_console, fail, from_store, open_db, stdout
from casedb.errors import CasedbError
from casedb.read import tables
from casedb.read.tables import Format


def _import_options(level: str | None, dtype: str | None, sym: list[str] | None) -> dict:
    """The importers' options from --level, --dtype and --sym (a bad one: exit 2)."""
    if level is not None and level not in ("top", "leaf"):
        fail(f"--level must be top or leaf, not {level!r}")
    if dtype is not None:
        from importers.trace_values import profiler_dtype

        try:
            dtype = profiler_dtype(dtype)
        except ValueError as e:
            fail(f"--dtype: {e}")
    symbols = {}
    for item in sym or []:
        name, eq, value = item.partition("=")
        if not eq or not value.strip().lstrip("-").isdigit():
            fail(f"--sym takes NAME=INT (e.g. s0=128), not {item!r}")
        symbols[name.strip()] = int(value)
    return {"level": level, "symbols": symbols or None, "dtype": dtype}


@app.command("import")
def import_cmd(
    paths: List[Path] = typer.Argument(..., help="Manifests, scan JSONL or traces; folders are expanded."),
    format: Optional[str] = typer.Option(None, "--format", "-f", help=importers.help_text()),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (required for traces; overrides the file's)."),
    level: Optional[str] = typer.Option(None, "--level", help="Trace nesting: top (default, what the model called) or leaf."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Kineto traces: the dtype of Tensor[] elements (cat's "
                                        "list), which Kineto does not record, where no call of the trace shows it "
                                        "(default: the trace's dominant floating dtype), e.g. bf16."),
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

    options = _import_options(level, dtype, sym)
    try:
        with open_db() as store:
            report = import_paths(store, paths, format=format, model=model, dry_run=dry_run, strict=strict,
                                  replace=replace, options=options,
                                  allow_outside=allow_outside,
                                  max_bytes=max_input_mb << 20 if max_input_mb else None)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report.to_dict())
        return
    # a table on a terminal, one plain row per file in a pipe (casedb.read.tables)
    title = "dry run: nothing written" if dry_run else None
    if title and tables.resolve(None, console) is not tables.Format.table:
        err_console.print(title, highlight=False)
    tables.emit([vars(f) for f in report.files], ("path", "format", "model", "records", "new_cases", "duplicates",
                                                  "skipped"),
                console=console, headers={"path": "file", "new_cases": "new cases"}, title=title)
    linked = sum(f.linked for f in report.files)
    if linked:
        console.print(f"{linked} call(s) already cases under another spelling (a scan's F.linear, a trace's "
                      "aten::linear) joined those cases", highlight=False)
    if report.retired or report.removed:
        console.print(f"--replace: {report.removed} case(s) no longer imported were removed; {report.retired} that "
                      "runs have judged were retired (kept for history, no longer listed or run)", highlight=False)
    for f in report.files:
        if f.their_dedupe:
            console.print(_their_dedupe_line(f.path, f.their_dedupe), highlight=False, soft_wrap=True)
        for w in f.warnings:
            err_console.print(f"warning: {w['where']}: case {w['case']!r}: {w['problem']}", highlight=False,
                              soft_wrap=True)
        for s in f.skipped_reasons[:20]:
            err_console.print(f"skipped {s.get('where')}: {s.get('op')}: {s.get('reason')}", highlight=False)
        if len(f.skipped_reasons) > 20:
            err_console.print(f"... and {len(f.skipped_reasons) - 20} more skipped in {f.path} (see --json)")


# ----------------------------------------------------------------------------------- listing

@app.command("models")
def models_cmd(
    fmt: Optional[Format] = typer.Option(None, "--format", help="table, plain (tab-separated rows) or json; default: "
                                                             "a table on a terminal, plain rows in a pipe."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """List models with their case counts."""
    rows = from_store(lambda store: store.models())
    if as_json:
        emit_json(rows)
        return
    tables.emit(rows, ("name", "variant_of", "cases", "unique_cases", "ops", "calls", "source"), console=console,
                fmt=fmt, headers={"name": "model", "variant_of": "variant of", "unique_cases": "unique"})


CASE_KEYS = ("model", "name", "op", "signature", "shapes", "dtype", "marks", "count", "rtol", "atol", "description")


def cases_cmd(**options):
    """List case occurrences: what `casedb run` with the same selection options runs."""
    from casedb.cases.layout import input_layouts
    from casedb.run.runspec import RunSpec
    from casedb.run.selection import selected_occurrences

    fmt, as_json, show_excluded = options.pop("fmt"), options.pop("as_json"), options.pop("show_excluded")
    try:
        spec = RunSpec(**options).validate()
    except CasedbError as e:
        fail(e)
    rows, tests = from_store(lambda store: selected_occurrences(store, spec, excluded=show_excluded),
                             errors=(CasedbError, ValueError))
    if as_json:
        emit_json([{**{k: r[k] for k in CASE_KEYS}, "layouts": input_layouts(r["inputs"], r["attrs"])} for r in rows])
        return
    shown = [{**r, "marks": ",".join(r["marks"]), "sig": r["signature"][:12]} for r in rows]
    tables.emit(shown, ("model", "name", "op", "shapes", "marks", "sig"), console=console, fmt=fmt,
                headers={"shapes": "inputs"})
    runs = "" if tests == len(rows) or show_excluded else f" ({tests} unique: the tests casedb run makes of them)"
    err_console.print(f"{len(rows)} cases{runs}", highlight=False)


def _cases_signature():
    from casedb.cli.run import option, spec_parameters
    from casedb.run.runspec import spec_fields
    from casedb.run.selection import SELECTION_FIELDS

    helps = {"limit": "Only the first N selected cases (unique cases, as casedb run counts them)."}
    skip = tuple(f.name for f, _ in spec_fields() if f.name not in SELECTION_FIELDS)
    return inspect.Signature([
        *spec_parameters(skip=skip, helps=helps),
        option("show_excluded", bool, False, "--show-excluded",
               help="Show the cases the marker expression (default: the RFC's) excludes."),
        option("fmt", Optional[Format], None, "--format", help="table, plain (tab-separated rows) or json; "
               "default: a table on a terminal, plain rows in a pipe."),
        option("as_json", bool, False, "--json", help="Machine-readable output; `layouts`: each tensor input's "
               "place, label and layout (contiguous, strided, transposed, offset, broadcast)."),
    ])


cases_cmd.__signature__ = _cases_signature()
app.command("cases")(cases_cmd)


@app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="Case name, model::name, or signature prefix (4 or more hex digits)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Show one case: what is executed and where each model uses it."""
    from casedb.cases.layout import input_layouts
    from casedb.store.lookup import one_case

    rows = from_store(lambda store: one_case(store, name))
    first = rows[0]
    detail = {k: first[k] for k in ("signature", "op", "inputs", "attrs", "dtype", "seed", "derived_marks", "shapes")}
    detail["layouts"] = input_layouts(first["inputs"], first["attrs"])
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
    s = from_store(lambda store: store.stats())
    if as_json:
        emit_json(s)
        return
    table = Table(show_header=False)
    for k, v in s.items():
        table.add_row(k, str(v))
    console.print(table)


def _their_dedupe_line(path: str, d: dict) -> str:
    lines = [f"{path}: {d['theirs']} unique by their runner's dedupe (op, repr(args), repr(kwargs), dtype), "
             f"{d['ours']} by casedb's signatures"]
    lines += [f"  {why}" for why in d["disagree"]]
    return "\n".join(lines)


@app.command("export")
def export_cmd(
    model: str = typer.Option(..., "--model", help="Model to export."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="File to write (default: stdout)."),
    format: str = typer.Option("yaml", "--format", help="yaml (RFC-0186 manifest), spyre-v2 (the RFC implementation's "
                                                        "v2 model-ops config) or oplog (operator_inp_logs)."),
):
    """Write a model's cases as an RFC YAML manifest (or a v2 model-ops config, or an operator_inp_logs file)."""
    from casedb.read import export, export_v2

    try:
        if format not in ("yaml", "oplog", "spyre-v2"):
            fail(f"--format must be yaml, spyre-v2 or oplog, not {format!r}")
        with open_db() as store:
            left_out: list = []
            writers = {"yaml": lambda f, p: export.write_yaml(store, model, f, p),
                       "spyre-v2": lambda f, p: export_v2.write(store, model, f, p, notes=left_out),
                       "oplog": lambda f, p: export.write_oplog(store, model, f, p, skipped=left_out)}
            if output:
                n = export.write_file(output, writers[format])
            else:
                with stdout() as f:
                    n = writers[format](f, None)
    except (CasedbError, ValueError) as e:
        fail(e)
    for s in left_out:
        if isinstance(s, str):  # spyre-v2: what the format cannot say exactly
            err_console.print(f"note: {s}", highlight=False, soft_wrap=True)
        else:
            err_console.print(f"not written (oplog cannot express it): {s['case']}: {s['reason']}", highlight=False)
    if output:
        err_console.print(f"wrote {n} cases to {output}")

