"""``casedb triage update --group``: one known_failure entry per failure cause instead of one per
case. A cause is :func:`casedb.causes.cause` of the op: its stage and normalized first error line,
or a wrong result's pattern — what the run summary and ``casedb report`` group by.

Each group's entry is as wide as the run shows (:func:`group_entries`): the op, else the op and
one dtype, else the op in one model, else the cases one by one — the first whose every case it
would govern on the run's target ran in the run and failed with that cause.
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


def group_entries(rows: list[dict], current: Triage, run, order: int) -> list[tuple[dict, str | None]]:
    """(entry mapping, comment) per group of failing ``rows`` (cases no entry covers),
    each scoped as ``run.scoped``; ``current``: the triage they join (later entries win ties:
    ``order`` is the last order used). ``run``: the update's :class:`casedb.triage.update._Run`."""
    by_op: dict[str, list] = {}
    for o, norms in zip(run.every, run.norms):
        by_op.setdefault(norms["op"], []).append((o, norms))
    out = []
    for op, why, members in groups(rows):
        ids = {r["model_case_id"] for r in members}
        pool = by_op.get(normalize("op", op), [])
        chosen = next((sels for sels in _candidates(op, members)
                       if all(_only_these(s, current, run, pool, ids, order + 1) for s in sels)), None)
        if chosen is None:
            chosen = [case_selector(r, run.clashes) for r in members]
        for sel in chosen:
            order += 1
            scoped = {**sel, **run.scoped}
            current = Triage(current.entries + [Entry(status="known_failure", where="(new)", selectors=scoped,
                                                      order=order)], [], current.unlisted)
            entry = {**scoped, "status": "known_failure", **_settings(why, members)}
            note = _note(members, run.run_id, len(chosen) > 1)
            found = getattr(run, "explained", {}).get(why)
            if found:  # what casedb explain found for this cause
                note = f"{note.rstrip('.') + '. ' if note else ''}casedb explain: {found}."
            out.append((entry, note))
    return out


def _candidates(op: str, members: list[dict]):
    """The selector lists to try for a group, widest first (the cases one by one is the fallback)."""
    yield [{"op": literal(op)}]
    dtypes = sorted({r["dtype"] for r in members if r["dtype"]})
    if len(dtypes) == 1 and all(r["dtype"] for r in members):
        yield [{"op": literal(op), "dtype": dtypes[0]}]
    yield [{"model": literal(m), "op": literal(op)} for m in sorted({r["model"] for r in members})]


def governed(sel: dict, status: str, current: Triage, run, pool, order: int):
    """The occurrences of ``pool`` ((occurrence, norms) pairs) that a new entry ``sel`` (scoped
    as the run, with ``status``) would govern on the run's target, were it added to ``current``."""
    c = Entry(status=status, where="(new)", selectors={**sel, **run.scoped}, order=order)
    trial = Triage(current.entries + [c], [], current.unlisted)
    return (o for o, norms in pool if c.selector.matches(norms, run.target) and trial.entry_for(o, run.target) is c)


def _only_these(sel: dict, current: Triage, run, pool: list, ids: set, order: int) -> bool:
    """Whether every case a known_failure entry ``sel`` would govern is one of ``ids``."""
    return all(o["model_case_id"] in ids for o in governed(sel, "known_failure", current, run, pool, order))


def _settings(why: str, members: list[dict]) -> dict:
    """The stage and reason of a group's entry: the error line its cases share, else the cause."""
    r = members[0]
    stage = r["stage"] or outcomes.failure_stage(r["outcome"])
    if stage not in outcomes.STAGES:
        stage = None
    lines = {first_error_line(m["error_type"], m["error_message"], m["reason"]) for m in members}
    if len(lines) == 1:
        reason = lines.pop()
    else:
        head = r["stage"] or r["outcome"] or "?"
        reason = why[len(head) + 2:] if why.startswith(head + ": ") else why
    return {"stage": stage, "reason": reason}


def _note(members: list[dict], run_id: int, split: bool) -> str | None:
    """The comment above a group's entry: how many cases it stands for (when more than one), and
    for a wrong result the largest error (casedb never loosens a tolerance itself)."""
    notes = []
    if len(members) > 1 and not split:
        shown = ", ".join(f"{m['model']}::{m['name']}" for m in members[:3])
        notes.append(f"{len(members)} cases failed so in run {run_id} ({shown}{', ...' if len(members) > 3 else ''}).")
    wrong = [m for m in members if m["outcome"] == "failed" or m["stage"] == "incorrect result"]
    if wrong:
        errs = [m["max_abs_err"] for m in wrong if m["max_abs_err"] is not None]
        err = f"max abs err {max(errs):.3g}" if errs else "outside tolerance"
        notes.append(f"incorrect result: {err}. casedb does not loosen tolerances by itself: if this error is "
                     "acceptable, set rtol/atol on this entry after review")
    return " ".join(notes) or None
