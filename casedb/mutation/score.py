"""``casedb mutants``: the mutation score of a model's cases — which known backend bugs they catch.

:func:`run_mutants` runs a model's cases (every mark) once on the control — the base backend
through the mutant wrapper with no bug (``casedb_mutant_none``) — and once per mutant of
:mod:`casedb.mutation.mutants`, all in one pytest session (:mod:`casedb.mutation.session`: one
start-up, no triage files), each backend's results a run recorded in the database like any
``casedb run`` (the run's selection gets ``mutation: {mutant, base, control_run}``).
:func:`score` then reads the runs back. Per mutant:

* **changed**: cases whose output (or written inputs) the bug changed — the mutant's own note
  (``results.metrics.notes.mutant.changed``), or a crash or timeout where the control passed;
* **caught**: changed cases with a failing outcome (failed, error, crashed, timeout; never
  ``not_exercised`` or ``ref_error``);
* **within precision**: changed cases that pass with the target's error against the
  high-precision reference at most ``numerics.ULP_FLOOR`` ULPs of the output dtype (measured by the
  ``ulp`` and ``both`` judges): the bug moved the output no further than a correct kernel may (a
  bf16 softmax over 101 elements rounded once more) and no sound judge can call it wrong — counted
  apart, not in the score (mutation testing's *equivalent mutants*);
* **score** = caught / changed (within precision left out), over the cases the control passed (a
  case the control does not pass cannot tell a bug from a false alarm);
* **survivors**: changed cases that still pass, with their op, inputs and errors.

Control failures are **false alarms**: the judge fails a correct backend.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Iterable

from casedb.store.database import open_store
from casedb.store.reads_run_results import judged_occurrences, results_with_cases
from casedb.store.run_listing import set_label
from casedb.store.run_rows import get_run, update_selection
from casedb.store.run_scope import MUTANT_LABEL
from casedb import outcomes
from casedb.judge.numerics import ULP_FLOOR
from casedb.errors import CasedbError
from casedb.serial import loads

FAILING = frozenset(o.name for o in outcomes.OUTCOMES if o.failing)   # crashed, timeout, error, failed
LOST = frozenset({"crashed", "timeout"})                               # no result, so no note
NO_TRIAGE = ("no triage files (neither ./triage/*.yaml nor the shipped triage): the control shows every "
             "false alarm")


def registry(imports: Iterable[str] = ()) -> dict:
    """The registered mutants (casedb.mutation.mutants, then the modules of ``imports``): name -> Mutant."""
    from casedb.mutation import harness, mutants  # noqa: F401 (mutants: imported to register the built-in bugs)
    from casedb.run.target import TargetError, import_module

    for name in imports:
        try:
            import_module(name)
        except TargetError as e:
            raise CasedbError(str(e)) from None
        except Exception as e:  # a user's module can fail in any way
            raise CasedbError(f"--import {name} failed: {type(e).__name__}: {e}") from None
    return dict(harness.MUTANTS)


def pick(names: Iterable[str] | None, imports: Iterable[str] = ()) -> list[str]:
    """The mutants to run: ``names`` (checked), else every registered one but the control."""
    from casedb.mutation.harness import CONTROL

    known = registry(imports)
    chosen = list(names or [n for n in known if n != CONTROL])
    unknown = [n for n in chosen if n not in known or n == CONTROL]
    if unknown:
        raise CasedbError(f"unknown mutant {', '.join(map(repr, unknown))}; known: "
                          f"{', '.join(n for n in known if n != CONTROL)} (add your own with --import, "
                          f"see casedb.mutation.mutants)")
    return list(dict.fromkeys(chosen))


@contextlib.contextmanager
def _base_env(base: str):
    from casedb.mutation.harness import BASE_ENV

    old = os.environ.get(BASE_ENV)
    os.environ[BASE_ENV] = base
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(BASE_ENV, None)
        else:
            os.environ[BASE_ENV] = old


def run_mutants(spec, *, mutants: Iterable[str] | None = None, base: str | None = None, db=None,
                progress: bool = True, console=None) -> dict:
    """Run the control and each mutant over ``spec``'s selection (a :class:`~casedb.run.runspec.RunSpec`
    whose backend and markexpr are set here); returns :func:`score`'s report."""
    from casedb.mutation import harness
    from casedb.mutation.session import run_backends
    from casedb.store.database import db_path

    if not spec.models:
        raise CasedbError("give --model: the mutation score is a model's")
    base = base or harness.DEFAULT_BASE
    if base not in ("eager", harness.TENSOR_BASE):
        import torch

        try:
            torch._dynamo.lookup_backend(base)
        except Exception:
            raise CasedbError(f"--backend {base!r}: not a registered dynamo backend (eager, aot_eager, inductor, "
                              f"or one registered by an --import module), nor {harness.TENSOR_BASE!r} (the mutants "
                              "around the op call, no dynamo: for an eager-only device)") from None
    names = pick(mutants, spec.imports)
    imports = ["casedb.mutation.mutants", *[i for i in spec.imports if i != "casedb.mutation.mutants"]]
    path = db_path(db)
    plan = [harness.CONTROL, *names]
    if console is not None and progress:
        console.print(f"one session: the control (no bug) and {len(names)} mutants over {base}, each case on "
                      f"every backend ({harness.PREFIX}<name>); {NO_TRIAGE}", markup=False, highlight=False)
    run_spec = replace(spec, imports=list(imports), markexpr="" if spec.markexpr is None else spec.markexpr)
    with _base_env(base):
        summaries = run_backends(run_spec, [harness.PREFIX + n for n in plan], db=path, progress=progress,
                                 console=console)
    run_ids = {name: summaries[harness.PREFIX + name]["run_id"] for name in plan}
    with open_store(path) as store:
        for name in plan:
            update_selection(store.conn, run_ids[name], mutation={
                "mutant": name, "base": base, "control_run": run_ids[harness.CONTROL]})
            set_label(store.conn, run_ids[name], MUTANT_LABEL + name)
    return score(path, run_ids[harness.CONTROL], {n: run_ids[n] for n in names})


# ------------------------------------------------------------------------------------ scoring

def within_precision(ulp_err: float | None) -> bool:
    """Whether a target error (ULPs against the high-precision reference; None: not measured) is
    no larger than a correct kernel's may be."""
    return ulp_err is not None and ulp_err <= ULP_FLOOR


def classify(control_outcome: str | None, outcome: str, note: dict | None, ulp_err: float | None = None) -> str:
    """What one case says about one mutant: ``ineligible`` (the control did not pass),
    ``caught``, ``survived`` (changed, still passes), ``within_precision`` (changed, passes, and
    the target's ``ulp_err`` against the high-precision reference is within ``ULP_FLOOR``),
    ``unchanged``, or ``failed_unchanged`` (it fails although the bug changed nothing: a flaky
    case, or a mutant that does not note)."""
    if control_outcome != "passed":
        return "ineligible"
    changed = bool((note or {}).get("changed")) or (not note and outcome in LOST)
    failing = outcome in FAILING
    if changed:
        if failing:
            return "caught"
        return "within_precision" if within_precision(ulp_err) else "survived"
    return "failed_unchanged" if failing else "unchanged"


def _results(conn, run_id: int) -> dict:
    """signature -> the run's result (with its case's op and inputs and the mutant's note)."""
    from casedb.store.database import shape_summary

    out = {}
    for d in results_with_cases(conn, run_id):
        metrics = loads(d.pop("metrics")) or {}
        d["note"] = (metrics.get("notes") or {}).get("mutant")
        d["inputs"] = shape_summary(loads(d["inputs"]) or [], loads(d.pop("attrs")) or {})
        out[d["signature"]] = d
    return out


def _names(conn, run_id: int) -> dict:
    """signature -> [(model, case name)] judged in the run."""
    out: dict[str, list] = {}
    for sig, model, name in judged_occurrences(conn, run_id):
        out.setdefault(sig, []).append((model, name))
    return out


def _case(r: dict, names: dict) -> dict:
    return {"op": r["op"], "inputs": r["inputs"], "signature": r["signature"],
            "cases": [f"{m}::{n}" for m, n in names.get(r["signature"], [])], "outcome": r["outcome"],
            "ulp_err": r["ulp_err"], "ref_ulp_err": r["ref_ulp_err"], "max_abs_err": r["max_abs_err"],
            "max_rel_err": r["max_rel_err"], "bias_toward": r["bias_toward"], "bias_count": r["bias_count"],
            "tolerance": r["tolerance"], "reason": r["reason"]}


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def score(db, control_run: int, mutant_runs: dict[str, int]) -> dict:
    """The mutation report of recorded runs: the control's false alarms and, per mutant, cases
    changed, caught, the score and the survivors (see the module docstring)."""
    from casedb.mutation import harness, mutants  # noqa: F401 (mutants: the built-ins' kind and doc)

    with open_store(db) as store:
        conn = store.conn
        ctrl_run = get_run(conn, control_run)
        control = _results(conn, control_run)
        names = _names(conn, control_run)
        base = ((ctrl_run["selection"] or {}).get("mutation") or {}).get("base")
        counts: dict[str, int] = {}
        for r in control.values():
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        alarms = [_case(r, names) for r in control.values() if r["outcome"] in FAILING]
        models = sorted({m for v in names.values() for m, _ in v})
        report = {"base": base, "device": ctrl_run["device"], "judge": (ctrl_run["summary"] or {}).get("judge"),
                  "models": models,
                  "control": {"run_id": control_run, "executed": len(control), "outcomes": counts,
                              "triage": (ctrl_run["selection"] or {}).get("options", {}).get("triage"),
                              "passed": counts.get("passed", 0), "false_alarms": len(alarms), "alarms": alarms},
                  "mutants": []}
        for name, run_id in mutant_runs.items():
            results = _results(conn, run_id)
            changed, caught, survivors, odd, within = [], [], [], [], []
            for sig, r in results.items():
                what = classify(control[sig]["outcome"] if sig in control else None, r["outcome"], r["note"],
                                r["ulp_err"])
                if what in ("caught", "survived"):
                    changed.append(sig)
                    (caught if what == "caught" else survivors).append(sig)
                elif what == "failed_unchanged":
                    odd.append(sig)
                elif what == "within_precision":
                    within.append(sig)
            per_model = {}
            for m in models:
                ch = [s for s in changed if any(mm == m for mm, _ in names.get(s, []))]
                ca = [s for s in caught if any(mm == m for mm, _ in names.get(s, []))]
                per_model[m] = {"changed": len(ch), "caught": len(ca), "score": _ratio(len(ca), len(ch))}
            m = harness.MUTANTS.get(name)
            report["mutants"].append({
                "name": name, "kind": m.kind if m else None, "doc": m.doc if m else None, "run_id": run_id,
                "executed": len(results), "changed": len(changed), "caught": len(caught),
                "score": _ratio(len(caught), len(changed)), "models": per_model,
                "survivors": [_case(results[s], names) for s in survivors],
                "within_precision": [_case(results[s], names) for s in within],
                "failed_unchanged": [_case(results[s], names) for s in odd]})
        return report


# ------------------------------------------------------------------------------------ the terminal

def _short_case(c: dict) -> str:
    name = c["cases"][0] if c["cases"] else c["signature"][:12]
    errs = ", ".join(f"{k} {c[k]:.3g}" for k in ("ulp_err", "ref_ulp_err", "max_abs_err") if c.get(k) is not None)
    return f"{name}: {c['op']}({c['inputs']}) {c['outcome']}" + (f" [{errs}]" if errs else "")


def print_report(report: dict, console, show: int = 5) -> None:
    """The report as a Rich table, then the false alarms and up to ``show`` survivors per mutant."""
    from rich.table import Table

    ctrl = report["control"]
    table = Table(title=f"mutation score: {', '.join(report['models'])} on {report['base']} ({report['device']}, "
                        f"judge {report['judge']}); control run {ctrl['run_id']}: {ctrl['passed']} of "
                        f"{ctrl['executed']} passed, {ctrl['false_alarms']} false alarms")
    for col in ("mutant", "run", "changed", "caught", "score", "within precision", "survivors"):
        table.add_column(col, justify="left" if col in ("mutant", "survivors") else "right", overflow="fold")
    for m in report["mutants"]:
        score = "-" if m["score"] is None else f"{100 * m['score']:.1f}%"
        table.add_row(m["name"], str(m["run_id"]), str(m["changed"]), str(m["caught"]), score,
                      str(len(m["within_precision"])),
                      ", ".join(c["cases"][0] if c["cases"] else c["op"] for c in m["survivors"][:3])
                      + (" …" if len(m["survivors"]) > 3 else ""))
    console.print(table)
    if ctrl.get("triage") == []:
        console.print(f"control run {ctrl['run_id']}: {NO_TRIAGE}", markup=False, highlight=False, soft_wrap=True)
    for c in ctrl["alarms"][:show]:
        console.print(f"false alarm: {_short_case(c)}: {c['reason']}", markup=False, highlight=False, soft_wrap=True)
    if len(ctrl["alarms"]) > show:
        console.print(f"... and {len(ctrl['alarms']) - show} more false alarms (--json lists all)", highlight=False)
    for m in report["mutants"]:
        for c in m["survivors"][:show]:
            console.print(f"{m['name']} survives: {_short_case(c)}", markup=False, highlight=False, soft_wrap=True)
        if len(m["survivors"]) > show:
            console.print(f"{m['name']}: ... and {len(m['survivors']) - show} more survivors", highlight=False)
        for c in m["failed_unchanged"][:show]:
            console.print(f"{m['name']} failed without changing anything: {_short_case(c)}: {c['reason']}",
                          markup=False, highlight=False, soft_wrap=True)
