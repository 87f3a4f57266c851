"""`casedb coverage`: which cases and ops a target can run, before running any (casedb.coverage)."""

from __future__ import annotations

from typing import List, Optional

import typer

from casedb.cli.common import app, console, emit_json, fail, state
from casedb.errors import CasedbError


@app.command("coverage")
def coverage_cmd(
    device: str = typer.Option(..., "--device", help="Target device (cpu, cuda, or a backend's device after --import)."),
    backend: str = typer.Option("eager", "--backend", help="eager (the device's kernels) or a compile backend "
                                "(inductor: a lowering or a decomposition, else the device's kernel)."),
    imports: Optional[List[str]] = typer.Option(None, "--import", metavar="MODULE",
                                                help="Module or .py file registering the device (repeatable)."),
    model: Optional[List[str]] = typer.Option(None, "--model", help="Only these models (repeatable; default: all)."),
    op: Optional[List[str]] = typer.Option(None, "--op", help="Only cases of this op (exact or substring; repeatable)."),
    markexpr: Optional[str] = typer.Option(None, "-m", help="Marker expression (default: every case)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="I/N", help="Only slice I/N (as casedb run)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N selected cases."),
    against: Optional[int] = typer.Option(None, "--against", metavar="RUN",
                                          help="Check the prediction against a run of the same cases."),
    save: bool = typer.Option(True, "--save/--no-save", help="Store the result (default): `casedb report` and "
                              "`casedb serve` show the newest coverage of a run's device and backend beside its "
                              "pass rates."),
    top: int = typer.Option(20, "--top", help="Missing kernels listed (--json has all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable report: models, totals, missing, cases."),
):
    """Which cases and ops the target can run, before running any: each case's aten operators traced on
    fake CPU tensors, checked against the device's kernels (% of enabled OpFuncs; missing kernels ranked)."""
    from casedb.coverage import measure, text

    sel = measure.Selection(models=model or [], ops=op or [], markexpr=markexpr, shard=shard, limit=limit)
    try:
        report = measure.measure(state.db, device=device, backend=backend, imports=imports or [], selection=sel,
                                 against=against, save=save)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(report)
    else:
        text.print_report(report, console, limit=top)
