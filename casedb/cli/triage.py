"""`casedb triage` commands: check, update, import (see casedb.triage)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from casedb.cli.common import app, emit_json, err_console, fail, open_db
from casedb.errors import CasedbError

triage_app = typer.Typer(
    help="Triage files: the expected status of each case per target (known failures, not supported, "
         "tolerances); see casedb.triage.entries.",
    no_args_is_help=True,
)
app.add_typer(triage_app, name="triage")


def _triage_files(files) -> list[Path]:
    from casedb import triage

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
    from casedb import triage

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
    scope: str = typer.Option("device,backend", "--scope",
                              help="Target keys new entries are scoped to: device, backend, arch (comma-separated), "
                                   "or none (every target). The default names the run's device and backend, so a "
                                   "run of another backend reads nothing of them."),
    group: bool = typer.Option(False, "--group", help="One known_failure entry per failure cause (op x stage x first "
                                                      "error line, or a wrong result's pattern) with op-level "
                                                      "selectors where the run shows they hold, not one per case "
                                                      "(cases the run did not run, e.g. on a shard, do not narrow "
                                                      "them; where a cause gets several entries, it says why)."),
    with_passing: bool = typer.Option(False, "--with-passing", help="Also promote unspecified cases that passed to "
                                                                    "expected_pass entries (by default the file "
                                                                    "holds what fails)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout: the changes, 'written' "
                                                       "(the file written, or null) and, with -o -, 'text' (the "
                                                       "new file's text, then not printed on its own)."),
):
    """Propose triage changes from a run, as a minimal edit of FILE: new failures become known_failure
    (stage, first error line), known failures that pass are removed, and with --with-passing unspecified
    cases that pass are promoted to expected_pass. Tolerances are never loosened. The DB is only read.

    Existing entries are never moved or reformatted: a removal's diff is the removed entries' lines.
    New entries are appended as one block under a comment naming the run: known failures first (by
    model and name; with --group by op and cause), then expected_pass promotions by op."""
    from casedb import triage

    try:
        keys = triage.scope_keys(scope)
        file, others = triage.file_to_edit(file, output)
        with open_db() as store:
            prop = triage.propose(store, from_run, file, others=others, scope=keys, group=group,
                                  with_passing=with_passing)
    except CasedbError as e:
        fail(e)
    to_stdout = output is not None and str(output) == "-"
    written = None
    if to_stdout and not as_json:
        typer.echo(prop.text, nl=False)
    elif not to_stdout and (prop.changed or output is not None):
        written = output or file
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(prop.text, encoding="utf-8")
    if as_json:
        emit_json({**prop.to_dict(), "written": str(written) if written else None,
                   **({"text": prop.text} if to_stdout else {})})
        return
    _print_changes(prop, written, output)


def _print_changes(prop, written, output) -> None:
    """What ``triage update`` changed, one line each, on stderr."""
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
    for note in prop.notes:
        err_console.print(f"grouped narrower: {note}", highlight=False, soft_wrap=True)
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
    from casedb import triage

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

