"""`casedb mutants`: the mutation score (casedb.mutation) with casedb run's selection and target options."""

from __future__ import annotations

import enum
import inspect
from typing import List, Optional

import typer

from casedb.cli.common import app, console, emit_json, err_console, fail, state
from casedb.cli.run import option, spec_parameters
from casedb.errors import CasedbError

MUTANT_BASE_HELP = ("The real backend the mutants wrap (default eager: dynamo's, the captured graph run by PyTorch; "
                    "aot_eager, inductor, or one registered by an --import module; tensor: no dynamo, each mutant "
                    "wraps the op call, for a device dynamo cannot trace).")


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
    *spec_parameters(helps={"backend": MUTANT_BASE_HELP}),
    option("mutant", Optional[List[str]], None, "--mutant", help="Only this mutant (repeatable; default: all)."),
    option("show", int, 5, "--show", help="Survivors and false alarms listed per mutant (--json has all)."),
    option("list_only", bool, False, "--list", help="List the registered mutants (with --import's) and exit."),
    option("as_json", bool, False, "--json", help="Machine-readable report."),
    option("no_progress", bool, False, "--no-progress", help="No progress output."),
])
app.command("mutants")(mutants_cmd)
