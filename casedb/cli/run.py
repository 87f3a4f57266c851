"""`casedb` commands that run things: scan, run, repro, merge (run's options come from RunSpec).

Each command imports the library module it calls (see casedb.cli.common)."""

from __future__ import annotations

import enum
import inspect
from pathlib import Path
from typing import List, Optional

import typer

from casedb.cli.common import app, console, emit_json, err_console, fail, open_db, state
from casedb.errors import CasedbError, InputError
from casedb.run.runspec import SAME, field_default, negative, spec_fields

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
    compare: Optional[Path] = typer.Option(None, "--compare", help="Another tracer's ops for the same model (a v2 "
                                           "or v1 YAML, an op list, or a Kineto / Execution Trace JSON): the ops "
                                           "each side lacks, and coverage %."),
    device: str = typer.Option("meta", "--device", help="meta (full size, no data) or cpu (depth-shrunk, real "
                                                        "seeded weights: for model code that reads values)."),
    shipped: bool = typer.Option(False, "--shipped", help="With --compare: compare the model's shipped manifests "
                                                          "(its manifest and version manifests) instead of a scan."),
    new_cases: Optional[Path] = typer.Option(None, "--new-cases", help="Write the scan's cases that no shipped "
                                             "manifest of the model holds to this manifest (a version manifest)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable summary."),
):
    """Build a model from its config on the meta device and record every operator call, along
    every path of its recipe's matrix (cache, attention, experts, batch, sequence length)."""
    from contextlib import nullcontext

    from casedb.scan.scanner import PHASES, scan_command

    if shipped:
        return _compare_shipped(model, compare, as_json)
    try:
        with (open_db() if do_import else nullcontext()) as store:
            summary = scan_command(model, output=output, level=level, phases=phase or PHASES, arch=arch, store=store,
                                   path=path, report=report, compare=compare, device=device, new_cases=new_cases)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(summary)
        return
    if report:
        from casedb.scan.report import markdown

        console.print(markdown(summary["report"]), markup=False, highlight=False, soft_wrap=True)
    if compare is not None:
        from casedb.scan.compare import markdown as compare_markdown

        console.print(compare_markdown(summary["model"], str(compare), summary["compare"]), markup=False,
                      highlight=False, soft_wrap=True)
    for p in summary.get("paths", []):
        err_console.print(f"  {p['path']}: {p['unique_calls']} unique calls of {p['ops']} ops in {p['seconds']} s",
                          highlight=False)
    err_console.print(f"{summary['model']}: {summary['unique_calls']} unique calls of {summary['ops']} ops "
                      f"({summary['calls']} calls, {summary['skipped']} skipped) in {summary['seconds']} s "
                      f"-> {summary['output']}", highlight=False)
    _print_written(summary)


def _print_written(summary: dict) -> None:
    """What ``casedb scan`` wrote besides the scan: the import, the version manifest."""
    if "import" in summary:
        t = summary["import"]
        err_console.print(f"imported: {t['new_cases']} new cases, {t['duplicates']} duplicates", highlight=False)
    if "new_cases" in summary:
        n = summary["new_cases"]
        err_console.print(f"new cases: {n['new']} of {n['scanned']} ({n['already_shipped']} already shipped) -> "
                          f"{n['file']}", highlight=False)


def _compare_shipped(model: str, compare: Optional[Path], as_json: bool) -> None:
    """``casedb scan MODEL --compare FILE --shipped``: their ops against the model's shipped cases."""
    from casedb.scan.compare import markdown
    from casedb.scan.versions import shipped_command

    if compare is None:
        fail(InputError("--shipped compares the shipped manifests with their ops: give --compare FILE"))
    try:
        summary = shipped_command(model, compare)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(summary)
        return
    console.print(markdown(summary["model"], str(compare), summary["compare"]), markup=False, highlight=False,
                  soft_wrap=True)
    brought = ", ".join(summary["compare"]["from_version_manifests"]) or "none"
    err_console.print(f"{summary['model']}: {summary['cases']} shipped cases in {', '.join(summary['shipped'])}; "
                      f"ops only version manifests bring: {brought}", highlight=False)


# ------------------------------------------------------------------------------- run / repro

def spec_parameters(*, skip: tuple = (), helps: dict | None = None) -> list[inspect.Parameter]:
    """`casedb run`'s options, one per RunSpec field that has `casedb run` flags (but ``skip``;
    ``helps`` rewords a field's help where another command gives it another meaning)."""
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


def option(name: str, annotation, default, *decls, help: str) -> inspect.Parameter:
    """A command's own option (beside the RunSpec ones), for a signature built at import."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, *decls, help=help))


def run_cmd(**options):
    """Run cases on the device against the CPU reference; record the run in the DB."""
    from casedb.run import console as run_console
    from casedb.run import runner
    from casedb.run.runspec import RunSpec

    resume, as_json, no_progress = options.pop("resume"), options.pop("as_json"), options.pop("no_progress")
    label, explain = options.pop("label"), options.pop("explain")
    options = {k: v.value if isinstance(v, enum.Enum) else v for k, v in options.items()}
    try:
        spec = RunSpec(**options)
        if label is not None:
            from casedb.cli.runs import label_run
            from casedb.store.run_listing import check_label

            check_label(label)  # before the run: a bad label must not cost one
        summary = runner.run(spec, db=state.db, resume=resume, progress=not (no_progress or as_json), console=err_console)
        if label is not None:
            label_run(summary["run_id"], label)
        if explain and summary.get("failed", 0) + summary.get("errors", 0) + summary.get("crashed", 0) > 0:
            from casedb.explain import diagnose

            summary["explanations"] = diagnose.explain(state.db, run_id=summary["run_id"], imports=tuple(spec.imports),
                                                       jobs=spec.jobs, timeout=spec.timeout)["causes"]
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(run_console.summary_json(summary))
    else:
        table, line = run_console.summary_tables(summary)
        console.print(table)
        # in a pipe a line stays one line (a terminal wraps it at words)
        console.print(line, soft_wrap=not console.is_terminal)
        for note in run_console.summary_notes(summary):
            err_console.print(run_console.text(note), soft_wrap=not err_console.is_terminal)
    raise typer.Exit(1 if summary["unexpected"] or summary["status"] != "finished" else 0)


run_cmd.__signature__ = inspect.Signature([
    *spec_parameters(),
    inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int], default=typer.Option(
        None, "--resume", metavar="RUN_ID",
        help="Finish run RUN_ID (its selection and target; give its --import modules again).")),
    option("label", Optional[str], None, "--label", help="Label the run (as `casedb runs label` does: "
                                                       "`casedb runs --label` finds it)."),
    option("explain", bool, False, "--explain", help="When cases fail, explain the run (casedb explain: the "
                                                     "condition that breaks the backend, per failure cause)."),
    option("as_json", bool, False, "--json", help="Print the summary as JSON."),
    option("no_progress", bool, False, "--no-progress", help="No progress bar."),
])
app.command("run")(run_cmd)


@app.command("repro")
def repro_cmd(
    name: str = typer.Argument(..., help="Signature prefix, case name, or model::name."),
    device: Optional[str] = typer.Option(None, "--device", help="Target device written into the script (default: cuda when available, else cpu)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Dynamo backend, or eager (default: env TEST_COMPILE_BACKEND, else inductor)."),
    imports: Optional[List[str]] = typer.Option(None, "--import", help="Module (or .py file) imported here and by the "
                                                "script first (repeatable); with --run, the run's are only named."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Tolerance (default: the case's)."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Tolerance (default: the case's)."),
    no_device_replace: bool = typer.Option(False, "--no-device-replace", help="Keep device strings recorded in the case."),
    model: Optional[str] = typer.Option(None, "--model", help="Use this model's tolerances (when models share the case)."),
    run: Optional[int] = typer.Option(None, "--run", help="Reproduce the case as this run ran and judged it: its target, "
                                      "judge, values and tolerances (options given here win; its --import modules "
                                      "are named, never imported: give them with --import)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the script here (default: stdout)."),
):
    """Print a standalone Python script (torch only) that reproduces one case."""
    from casedb.read import repro

    notes: list[str] = []
    try:
        with open_db() as store:
            script = repro.script(store, name, device=device, backend=backend, imports=list(imports or []),
                                  rtol=rtol, atol=atol, replace_device=not no_device_replace, model=model,
                                  run=run, notes=notes)
    except CasedbError as e:
        fail(e)
    for note in notes:
        err_console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
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
    for part in report["sources"]:
        for c in part.get("conflicting", []):
            err_console.print(f"conflict: {c['case'] or c['signature'][:16]}: {c['outcomes'][0]} in an earlier shard, "
                              f"{c['outcomes'][1]} in {c['source']}; kept {c['kept']}", markup=False, highlight=False,
                              soft_wrap=True)
    if report["conflicts"]:
        err_console.print(f"{report['conflicts']} conflict(s): the same case or occurrence recorded otherwise by "
                          "another source (the worse outcome kept; a case named with another signature: the "
                          "target's kept)", markup=False, highlight=False, soft_wrap=True)

