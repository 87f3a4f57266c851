"""``casedb triage update --group``: one known_failure entry per failure cause instead of one per
case. A cause is :func:`casedb.causes.cause` of the op: its stage and normalized first error line,
or a wrong result's pattern — what the run summary and ``casedb report`` group by.

Each group's entry is as wide as the run shows (:func:`group_entries`): the op, else the op and
one dtype, else the op with a layout mark every case of the group has (``marks: [noncontiguous]``:
what a stride bug fails on), else the op in one model, else the cases one by one — the first
whose every case it would govern on the run's target that ran failed with that cause.
"""

from __future__ import annotations

from casedb import causes, outcomes
from casedb.causes import first_error_line
from casedb.judge.selectors import SIGNATURE, literal, normalize
from casedb.triage.entries import Entry, Triage


def name_clashes(occ: list[dict]) -> set:
    """(model, name) keys that more than one case has (names match ignoring case)."""
    seen: set = set()
    clashes = set()
    for o in occ:
        key = (normalize("model", o["model"]), normalize("name", o["name"]))
        (clashes if key in seen else seen).add(key)
    return clashes


def case_selector(r: dict, clashes: set) -> dict:
    """Selectors of exactly the case of row ``r``: its model and name as literals, and its
    signature where another case of the model has the same name but for case."""
    sel = {"model": literal(r["model"]), "name": literal(r["name"])}
    sig = str(r.get("signature") or "")
    if (normalize("model", r["model"]), normalize("name", r["name"])) in clashes and SIGNATURE.fullmatch(sig):
        sel["signature"] = sig
    return sel


def row_cause(r: dict) -> str:
    """The cause of a failing row, as :func:`casedb.causes.cause` words it."""
    return causes.cause(r["outcome"], r["stage"], r["error_type"], r["error_message"], r["reason"], r.get("pattern"))


def groups(rows: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """``rows`` (failing cases) as (op, cause, rows), sorted by op then cause: the order new
    entries are written in."""
    by: dict[tuple, list] = {}
    for r in rows:
        by.setdefault((r["op"] or "", row_cause(r)), []).append(r)
    return [(op, why, by[(op, why)]) for op, why in sorted(by)]


def group_entries(rows: list[dict], current: Triage, run, order: int, notes: list | None = None
                  ) -> list[tuple[dict, str | None]]:
    """(entry mapping, comment) per group of failing ``rows`` (cases no entry covers),
    each scoped as ``run.scoped``; ``current``: the triage they join (later entries win ties:
    ``order`` is the last order used). ``run``: the update's :class:`casedb.triage.update._Run`.
    Cases the run did not run (another shard, another selection) do not hold an entry back: the
    comment counts them. ``notes`` gets why a group was not written as one op-wide entry."""
    by_op: dict[str, list] = {}
    for o, norms in zip(run.every, run.norms):
        by_op.setdefault(norms["op"], []).append((o, norms))
    out = []
    for op, why, members in groups(rows):
        ids = {r["model_case_id"] for r in members}
        pool = by_op.get(normalize("op", op), [])
        options = list(_candidates(op, members))
        chosen = next((pairs for pairs in options
                       if all(_only_these(s, current, run, pool, ids, order + 1) for s, _ in pairs)), None)
        if chosen is None:
            chosen = [(case_selector(r, run.clashes), [r]) for r in members]
        narrowed = None if chosen is options[0] else _held_back(op, current, run, pool, ids, order + 1)
        if narrowed and notes is not None:
            n = len(chosen)
            notes.append(f"{op}: {why}: {n} entr{'y' if n == 1 else 'ies'} narrower than the op: {narrowed}")
        for sel, sub in chosen:
            order += 1
            scoped = {**sel, **run.scoped}
            unrun = sum(1 for o in governed(sel, "known_failure", current, run, pool, order)
                        if o["model_case_id"] not in run.ran)
            current = Triage(current.entries + [Entry(status="known_failure", where="(new)", selectors=scoped,
                                                      order=order)], [], current.unlisted)
            entry = {**scoped, "status": "known_failure", **_settings(why, sub)}
            note = _note(sub, run.run_id, unrun, narrowed if sel is chosen[0][0] else None)
            found = getattr(run, "explained", {}).get(why)
            if found:  # what casedb explain found for this cause
                note = f"{note.rstrip('.') + '. ' if note else ''}casedb explain: {found}."
            out.append((entry, note))
    return out


def _candidates(op: str, members: list[dict]):
    """The (selectors, the members each governs) lists to try for a group, widest first (the cases
    one by one is the fallback)."""
    yield [({"op": literal(op)}, members)]
    dtypes = sorted({r["dtype"] for r in members if r["dtype"]})
    if len(dtypes) == 1 and all(r["dtype"] for r in members):
        yield [({"op": literal(op), "dtype": dtypes[0]}, members)]
    # a layout every member has (casedb.cases.layout): what a backend's stride bug fails on
    shared = set.intersection(*(set(r.get("marks") or ()) for r in members))
    for mark in ("noncontiguous", "transposed", "broadcast", "offset"):
        if mark in shared:
            yield [({"op": literal(op), "marks": [mark]}, members)]
    models = sorted({r["model"] for r in members})
    yield [({"model": literal(m), "op": literal(op)}, [r for r in members if r["model"] == m]) for m in models]


def _held_back(op: str, current: Triage, run, pool: list, ids: set, order: int) -> str | None:
    """Why an op-wide entry would be wrong: the cases of the op that ran and did not fail so."""
    others = [run.ran[o["model_case_id"]] for o in governed({"op": literal(op)}, "known_failure", current, run, pool,
                                                           order)
              if o["model_case_id"] not in ids and o["model_case_id"] in run.ran]
    if not others:
        return None
    passed = sum(1 for r in others if r["outcome"] in outcomes.PASSING)
    parts = ([f"{passed} other case(s) of it passed in run {run.run_id}"] if passed else []) + (
        [f"{len(others) - passed} failed otherwise"] if len(others) > passed else [])
    return ", ".join(parts)


def governed(sel: dict, status: str, current: Triage, run, pool, order: int):
    """The occurrences of ``pool`` ((occurrence, norms) pairs) that a new entry ``sel`` (scoped
    as the run, with ``status``) would govern on the run's target, were it added to ``current``."""
    c = Entry(status=status, where="(new)", selectors={**sel, **run.scoped}, order=order)
    trial = Triage(current.entries + [c], [], current.unlisted)
    return (o for o, norms in pool if c.selector.matches(norms, run.target) and trial.entry_for(o, run.target) is c)


def _only_these(sel: dict, current: Triage, run, pool: list, ids: set, order: int) -> bool:
    """Whether every case a known_failure entry ``sel`` would govern that ran is one of ``ids``."""
    return all(o["model_case_id"] in ids or o["model_case_id"] not in run.ran
               for o in governed(sel, "known_failure", current, run, pool, order))


def _settings(why: str, members: list[dict]) -> dict:
    """The stage and reason of an entry for ``members``: the error line they share (a single
    case's own), else what their cause says beyond its stage, else the worst case's line."""
    r = members[0]
    stage = r["stage"] or outcomes.failure_stage(r["outcome"])
    if stage not in outcomes.STAGES:
        stage = None
    lines = {first_error_line(m["error_type"], m["error_message"], m["reason"]) for m in members}
    head = r["stage"] or r["outcome"] or "?"
    if len(lines) == 1:
        reason = lines.pop()
    elif why.startswith(head + ": "):
        reason = why[len(head) + 2:]
    else:
        worst = max(members, key=lambda m: m["max_abs_err"] if m["max_abs_err"] is not None else -1.0)
        reason = (f"{first_error_line(worst['error_type'], worst['error_message'], worst['reason'])} "
                  f"(the largest error of {len(members)} cases)")
    return {"stage": stage, "reason": reason}


def _note(members: list[dict], run_id: int, unrun: int = 0, narrowed: str | None = None) -> str | None:
    """The comment above an entry: how many cases it stands for (when more than one) and how many
    more it covers that the run did not run; why the group is split (``narrowed``); for a wrong
    result its own error and tolerance (a group's: the range of its cases' errors). casedb never
    loosens a tolerance itself."""
    notes = []
    if len(members) > 1:
        shown = ", ".join(f"{m['model']}::{m['name']}" for m in members[:3])
        notes.append(f"{len(members)} cases failed so in run {run_id} ({shown}{', ...' if len(members) > 3 else ''}).")
    if unrun:
        notes.append(f"It covers {unrun} more case(s) that run {run_id} did not run (another shard or selection).")
    if narrowed:
        notes.append(f"Narrower than the op: {narrowed}.")
    wrong = [m for m in members if m["outcome"] == "failed" or m["stage"] == "incorrect result"]
    if wrong:
        errs = sorted(m["max_abs_err"] for m in wrong if m["max_abs_err"] is not None)
        err = ("outside tolerance" if not errs else f"max abs err {errs[0]:.3g}" if len(errs) == 1 or errs[0] == errs[-1]
               else f"max abs err {errs[0]:.3g} to {errs[-1]:.3g}")
        tol = _tolerance(wrong)
        notes.append(f"incorrect result: {err}{f' ({tol})' if tol else ''}. casedb does not loosen tolerances by itself: "
                     "if this error is acceptable, set rtol/atol on this entry after review")
    return " ".join(notes) or None


def _tolerance(rows: list[dict]) -> str | None:
    """The tolerance ``rows`` were judged with, when they share one."""
    tols = {(r["rtol"], r["atol"]) if r["rtol"] is not None and r["atol"] is not None else r["tolerance"] for r in rows}
    if len(tols) != 1:
        return None
    tol = tols.pop()
    return f"rtol {tol[0]:g}, atol {tol[1]:g}" if isinstance(tol, tuple) else tol
