"""`casedb coverage`: which of the selected cases a target can run, before running any — each
case traced (:mod:`casedb.coverage.trace`), its operators checked against the target's kernels
(:mod:`casedb.coverage.kernels`), and the whole summed up per model (:mod:`casedb.coverage.summary`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from casedb.errors import InputError
from casedb.run import selection as run_selection
from casedb.run.runspec import RunSpec


@dataclass
class Selection:
    """The cases measured: casedb run's selection options, as far as coverage takes them."""

    models: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    markexpr: str | None = None
    shard: str | None = None
    limit: int | None = None


def select(store, sel: Selection) -> list:
    """The plan items ``sel`` selects: what `casedb run` with the same options would run
    (casedb.run.selection, one rule for both), one per unique case with every model's occurrences."""
    spec = RunSpec(models=list(sel.models), op=list(sel.ops), markexpr=sel.markexpr or "", shard=sel.shard,
                   limit=sel.limit)
    return run_selection.select(store, spec)


def prepare(device: str, backend: str, imports: list) -> dict:
    """Import the --import modules and describe the target: its dispatch key, whether the key has
    a backend fallback, and what the compile backend cannot do there (None: nothing known)."""
    import torch

    from casedb.coverage import kernels
    from casedb.run import backend as backend_mod
    from casedb.run.target import TargetError, import_module

    for name in imports:
        try:
            import_module(name)
        except TargetError:
            raise
        except Exception as e:  # an import can fail in any way
            raise InputError(f"--import {name} failed: {type(e).__name__}: {e}") from None
    try:
        key = kernels.dispatch_key(device)
    except (RuntimeError, ValueError) as e:
        raise InputError(f"--device {device}: {e} (give cpu, cuda, or a backend's device after --import of "
                         "its module)") from None
    if backend != "eager":
        try:
            backend_mod.check_backend(backend)
        except ValueError as e:
            raise InputError(str(e)) from None
    problem = None
    if backend != "eager" and torch.device(device).type not in ("cpu", "cuda", "meta"):
        problem = backend_mod.compile_support(device, backend)
    return {"device": device, "dispatch_key": key, "backend": backend, "fallback": kernels.has_fallback(key),
            "target_problem": problem}


def case_coverage(item, target: dict, load_blob) -> dict:
    """One case: the aten operators it sends, whether the target runs them all, the missing ones."""
    from casedb.cases.ops import UnknownOpError, op_info
    from casedb.coverage import kernels
    from casedb.coverage.trace import trace_case

    row = {"signature": item.signature, "op": item.op, "models": item.models, "names": item.names,
           "shapes": item.shapes}
    try:
        info = op_info(item.op)
    except UnknownOpError as e:
        return {**row, "enabled": None, "missing": [], "aten_ops": [], "traced_on": None, "error": str(e)}
    trace = trace_case(item.case, info.fn, target["dispatch_key"], load_blob)
    if trace.error is not None:
        return {**row, "enabled": None, "missing": [], "aten_ops": trace.ops, "traced_on": trace.on,
                "error": trace.error}
    lacking = kernels.missing_for(trace, target["dispatch_key"], target["backend"])
    return {**row, "enabled": not lacking, "missing": lacking, "aten_ops": trace.ops, "traced_on": trace.on,
            "error": None}


def measure(db, *, device: str, backend: str = "eager", imports: list | None = None,
            selection: Selection | None = None, against: int | None = None, save: bool = False,
            progress=None) -> dict:
    """The coverage report of ``selection`` on ``device``/``backend`` (see the module docstring);
    ``against``: a run of the same cases to check the prediction with (casedb.coverage.agreement);
    ``save``: store it (casedb.store.coverage), its id in ``coverage_id``."""
    from dataclasses import asdict

    from casedb.coverage import agreement, summary
    from casedb.ingest.seed import open_seeded
    from casedb.run import software
    from casedb.store import coverage as stored

    target = prepare(device, backend, list(imports or []))
    sel = selection or Selection()
    with open_seeded(db) as store:
        items = select(store, sel)
        cases = []
        for i, it in enumerate(items):
            cases.append(case_coverage(it, target, store.load_blob))
            if progress is not None:
                progress(i + 1, len(items))
        checked = None if against is None else agreement.against_run(store.db.conn, against, cases)
        report = {**target, **summary.summarize(cases), "against": checked, "cases": cases}
        report["coverage_id"] = stored.save(store.db.conn, report, selection=asdict(sel),
                                            software=software.describe(list(imports or []), device)) if save else None
    return report
