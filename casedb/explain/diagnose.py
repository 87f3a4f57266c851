"""`casedb explain`: for each failure cause of a run (and across all its failing cases), the
simplest condition separating failing from passing cases (:mod:`casedb.explain.conditions`),
confirmed by variants run on the run's own target (:mod:`casedb.explain.confirm`), the layer at
fault (:mod:`casedb.explain.layer`), the error's growth (:mod:`casedb.explain.growth`) and the
smallest failing case (:mod:`casedb.explain.minimal`), stored as a derived case; the result is
kept in the DB (:mod:`casedb.store.explanations`) and shaped by :mod:`casedb.explain.report`.
"""

from __future__ import annotations

import os
from dataclasses import replace

from casedb.errors import CasedbError, InputError
from casedb.explain import confirm, growth, layer, minimal, report
from casedb.explain.conditions import separating
from casedb.explain.features import of_case as features_of
from casedb.explain.rounds import ANY, Rounds
from casedb.explain.schedule import Task, drive
from casedb.ingest.seed import open_seeded
from casedb.run.runspec import RunSpec
from casedb.run.target import check_import
from casedb.store import explanations as stored
from casedb.store.database import open_store
from casedb.store.run_rows import get_run

DEFAULT_BUDGET = 64
EXAMPLES = 2        # failing cases per cause whose variants confirm a condition
CONDITIONS = 3      # conditions per cause confirmed by experiment (the simplest first)
ALL = "(all failing cases)"


def explain(db: str | os.PathLike | None = None, *, run_id: int | None = None, cause: str | None = None,
            budget: int = DEFAULT_BUDGET, variants: bool = True, imports: tuple = (), jobs: int = 1,
            timeout: float | None = None, progress=None) -> dict:
    """Explain run ``run_id`` (default: the latest run of `casedb run`); returns
    {"run_id", "causes": [...], "variants_run", "seconds"} (see casedb.explain.report)."""
    if budget < 0:
        raise InputError(f"--budget takes a number of variant runs per cause, 0 or more, not {budget}")
    with open_seeded(db) as store:
        db_path = store.path.resolve()
        conn = store.conn
        run_id = run_id if run_id is not None else stored.latest_run(conn)
        if run_id is None:
            raise CasedbError("no run to explain: run the cases first (casedb run)")
        run = get_run(conn, run_id, "--run")
        rows = stored.run_cases(conn, run_id)
        groups = _groups(rows, cause)
        for g in groups:
            for r in g["rows"]:
                r.update(stored.tolerances(conn, r["signature"]))
    passing = [features_of(r, r["values"]) for r in rows if r["outcome"] == "passed"]
    for g in groups:
        g["conditions"] = separating([features_of(r, r["values"]) for r in g["rows"]], passing)
    rounds = None
    if variants and groups and budget:
        rounds = Rounds(db_path, _variant_spec(run, imports, jobs, timeout), progress=progress)
        _experiment(rounds, groups, budget, run["backend"])
    out = report.assemble(run_id, groups, len(passing), rounds)
    _keep(db_path, run, groups, out)
    return out


def _groups(rows: list[dict], wanted: str | None) -> list[dict]:
    """The run's failing cases by cause, biggest first, and all of them together when there are
    several causes; ``wanted``: only the cause numbered so (1 = the first) or containing the text."""
    by: dict = {}
    for r in rows:
        if r["failing"]:
            by.setdefault(r["cause"], []).append(r)
    groups = [{"cause": c, "key": c, "rows": rs} for c, rs in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    if len(groups) > 1:
        groups.append({"cause": ALL, "key": ANY, "rows": [r for r in rows if r["failing"]]})
    if wanted is None:
        return groups
    if str(wanted).isdigit() and 1 <= int(wanted) <= len(groups):
        return [groups[int(wanted) - 1]]
    picked = [g for g in groups if str(wanted).lower() in g["cause"].lower()]
    if not picked:
        listed = "; ".join(f"{i}: {g['cause']}" for i, g in enumerate(groups, 1)) or "none: the run has no failures"
        raise InputError(f"--cause {wanted!r} names no failure cause of this run; give a number or part of one: "
                         f"{listed}")
    return picked


def _variant_spec(run: dict, imports: tuple, jobs: int, timeout: float | None) -> RunSpec:
    """The explained run's target, to run variants on: its stored selection, and its --import
    modules only as given again (casedb never imports a module because a database names it)."""
    options = (run["selection"] or {}).get("options")
    if options is None:
        raise CasedbError(f"run {run['id']} has no recorded target to run variants on; "
                          "give --no-variants to explain it from its cases alone")
    spec = RunSpec.from_selection(options, jobs=jobs, timeout=300.0 if timeout is None else timeout)
    given = [check_import(n) for n in imports]
    missing = [n for n in options.get("imports") or [] if n not in given]
    if missing:
        again = " ".join(f"--import {n}" for n in options["imports"])
        raise CasedbError(f"run {run['id']} was recorded with --import {', '.join(missing)}; casedb never imports a "
                          f"module because a database names it: review it and give it again to run variants "
                          f"({again}), or give --no-variants")
    return replace(spec, imports=given).validate()


def _experiment(rounds: Rounds, groups: list[dict], budget: int, backend: str | None) -> None:
    """Run every cause's chains together; their results land in each group's ``found``."""
    first, later = [], []
    for ci, g in enumerate(groups):
        cases = sorted((_case(r) for r in g["rows"]), key=minimal.elements)
        examples = [cases[0], cases[-1]][:EXAMPLES] if len(cases) > 1 else cases
        key = g["key"]
        if g["conditions"]:
            first.append(Task((ci, "confirm"), confirm.first_confirmed(g["conditions"][:CONDITIONS], examples, key)))
        if key == ANY:
            continue
        later.append(Task((ci, "layer"), layer.chain(examples[:1], backend)))
        later.append(Task((ci, "minimal"), minimal.chain(cases[-1], key)))
        if any(r["outcome"] == "failed" for r in g["rows"]):
            later.append(Task((ci, "growth"), growth.chain(cases[-1])))
    tasks = first + later
    left = {ci: budget for ci in range(len(groups))}
    drive(rounds, tasks, left)
    for ci, g in enumerate(groups):
        g["found"] = {t.key[1:]: t.result for t in tasks if t.key[0] == ci}
        g["cut"] = any(t.cut for t in tasks if t.key[0] == ci)
        g["variants_run"] = budget - left[ci]
        g["parent"] = max((_case(r) for r in g["rows"]), key=minimal.elements)


def _case(r: dict) -> dict:
    return {k: r.get(k) for k in ("op", "inputs", "attrs", "dtype", "seed", "rtol", "atol", "signature")}


def _keep(db_path, run: dict, groups: list[dict], out: dict) -> None:
    """Store the smallest failing cases as derived cases, then the explanations."""
    from casedb.explain import derived

    run_id = run["id"]
    for g, body in zip(groups, out["causes"]):
        small = (g.get("found") or {}).get(("minimal",))
        if small:
            body["minimal"] = derived.store(db_path, run, g["cause"], g["parent"], small)
    with open_store(db_path) as store:
        kept = _merged(stored.load(store.conn, run_id) or [], out["causes"])
        if kept:
            stored.save(store.conn, run_id, kept)
        else:
            stored.mark_explained(store.conn, run_id)


def _merged(old: list[dict], new: list[dict]) -> list[dict]:
    """The run's stored explanations with ``new`` in: a cause explained with variants replaces
    its old entry; one explained without (--no-variants) only fills a cause not explained yet."""
    out = list(old)
    where = {e["cause"]: i for i, e in enumerate(out)}
    for e in new:
        i = where.get(e["cause"])
        if i is None:
            where[e["cause"]] = len(out)
            out.append(e)
        elif e["variants_run"] or not out[i].get("variants_run"):
            out[i] = e
    return out
