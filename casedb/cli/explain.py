"""`casedb explain`: which condition breaks the backend, per failure cause of a run
(casedb.explain.diagnose)."""

from __future__ import annotations

from typing import List, Optional

import typer

from casedb.cli.common import app, emit_json, err_console, fail, state
from casedb.errors import CasedbError


@app.command("explain")
def explain_cmd(
    run: Optional[int] = typer.Option(None, "--run", help="The run to explain (default: the latest run)."),
    cause: Optional[str] = typer.Option(None, "--cause", help="Only this failure cause: its number in the list "
                                        "(1 = the first) or part of its text."),
    budget: int = typer.Option(64, "--budget", help="Variant runs per cause, at most (default 64)."),
    no_variants: bool = typer.Option(False, "--no-variants", help="Only the conditions observed over the run's "
                                     "cases: run no variant."),
    imports: Optional[List[str]] = typer.Option(None, "--import", help="The run's --import modules, given again "
                                                "(casedb never imports a module because a database names it)."),
    jobs: int = typer.Option(1, "-j", "--jobs", help="Worker processes running the variants (0: in this process, "
                             "no isolation)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds per variant before it counts as a "
                                            "timeout (default 300)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Say each round of variants on stderr."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Explain a red run: per failure cause, the condition that separates failing from passing cases,
    confirmed by variants run on the same target; the layer at fault; the smallest failing case."""
    from casedb.explain import diagnose, report

    say = (lambda line: err_console.print(line, markup=False, highlight=False)) if progress else None
    try:
        out = diagnose.explain(state.db, run_id=run, cause=cause, budget=budget, variants=not no_variants,
                               imports=tuple(imports or ()), jobs=jobs, timeout=timeout, progress=say)
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(out)
    else:
        typer.echo(report.text(out))
