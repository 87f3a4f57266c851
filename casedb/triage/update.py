"""``casedb triage update``: the edit of a triage file that a run calls for (:func:`propose`), and
which file that is (:func:`file_to_edit`). Reads the DB only; the text is edited by
:mod:`casedb.triage.editor`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from casedb import outcomes
from casedb.causes import first_error_line
from casedb.errors import InputError
from casedb.store import explanations
from casedb.judge.selectors import TARGET_KEYS, case_norms, literal
from casedb.triage.editor import edit
from casedb.triage.entries import ENTRY_KEYS, SETTING_KEYS, Entry, Triage
from casedb.triage.files import default_paths, load
from casedb.triage.grouping import case_selector, governed, group_entries, name_clashes
from casedb.store.reads_triage import Reading
from casedb.triage.reading import occurrences, run_rows, run_target


@dataclass
class Proposal:
    """What :func:`propose` would change in a triage file, and the new text."""

    path: Path
    run_id: int
    target: dict
    text: str
    added: list = field(default_factory=list)        # new known_failure entries (dicts)
    promoted: list = field(default_factory=list)     # new expected_pass entries (dicts)
    removed: list = field(default_factory=list)      # where of known_failure entries removed
    rewritten: list = field(default_factory=list)    # where of entries made expected_pass (tolerance kept)
    kept: list = field(default_factory=list)         # (where, why) of known_failure entries that pass in part
    regressions: list = field(default_factory=list)  # (model::name, where) of expected passes that fail
    notes: list = field(default_factory=list)        # why a --group cause got more than one entry

    def to_dict(self) -> dict:
        return {"path": str(self.path), "run_id": self.run_id, "target": self.target, "added": self.added,
                "promoted": self.promoted, "removed": self.removed, "rewritten": self.rewritten,
                "kept": [{"where": w, "why": y} for w, y in self.kept],
                "regressions": [{"case": c, "where": w} for c, w in self.regressions], "notes": self.notes}

    @property
    def changed(self) -> bool:
        return bool(self.added or self.promoted or self.removed or self.rewritten)


def file_to_edit(file: Path | None, output: Path | None, root: Path = Path(".")) -> tuple[Path, list[Path]]:
    """The triage file ``triage update`` edits and the others whose entries count: ``file``, else
    the one ``triage/*.yaml`` under ``root``, else (the first triage file) the one ``output``
    names, else ``triage/triage.yaml``. InputError when triage/ has several and none is named."""
    found = default_paths(root)
    if file is None:
        if not found:
            file = output if output is not None and str(output) != "-" else Path(root) / "triage" / "triage.yaml"
        elif len(found) == 1:
            file = found[0]
        else:
            raise InputError(f"give the triage FILE to edit (triage/ has {len(found)})")
    return file, [p for p in found if p.resolve() != file.resolve()]


def scope_keys(scope: str) -> tuple[str, ...]:
    """The target keys of ``--scope`` (device, backend, arch comma-separated, or none)."""
    keys = [] if scope.strip() == "none" else [k.strip() for k in scope.split(",") if k.strip()]
    bad = [k for k in keys if k not in TARGET_KEYS]
    if bad:
        raise InputError(f"--scope takes device, backend, arch (comma-separated) or none, not {', '.join(bad)}")
    return tuple(keys)


@dataclass
class _Run:
    """What a proposal reads of run ``run_id``: its target, its rows (by occurrence in ``ran``),
    every occurrence the DB plans (and their selector norms), and how new entries are written."""

    run_id: int
    target: dict
    rows: list
    every: list
    scoped: dict                                    # the target keys new entries are scoped to
    clashes: set                                    # (model, name) keys more than one case has
    explained: dict = field(default_factory=dict)   # cause -> what casedb explain found (its condition)
    ran: dict = field(init=False)
    norms: list = field(init=False)

    def __post_init__(self):
        self.ran = {r["model_case_id"]: r for r in self.rows}
        self.norms = [case_norms(o) for o in self.every]


DEFAULT_SCOPE = ("device", "backend")


def propose(store, run_id: int, path, *, others=(), scope=DEFAULT_SCOPE, group: bool = False,
            with_passing: bool = False) -> Proposal:
    """The edit of triage file ``path`` that run ``run_id`` calls for (``others``: further triage
    files whose entries count but are not edited). Reads the DB only.

    * A case with no entry (or ``unspecified``) that failed (failed, error, crashed, timeout) gets
      a ``known_failure`` entry naming it (``model`` + ``name``), with the run's ``stage`` and the
      first line of its error as ``reason``, scoped to the run's target keys in ``scope``
      (default: the device and the backend, so another backend's run on the device reads
      nothing of it; ``()``: every target). An incorrect result gets a comment with its
      error and tolerance: casedb never loosens a tolerance itself. With ``group``: one entry
      per failure cause (op x stage x error line, or a wrong result's pattern) with op-level
      selectors, as wide as the run shows (:mod:`casedb.triage.grouping`; cases the run did not
      run, e.g. on a shard, do not narrow it), each with its own reason and figures.
    * A known_failure entry of ``path`` whose every case (in the DB, on this target) ran in this
      run and passed is removed — or, when it carries rtol/atol/timeout, becomes expected_pass,
      keeping them (dropping it could fail the case).
    * With ``with_passing``: cases then unspecified that passed are promoted to expected_pass (a
      triage file holds what fails unless asked): one entry per op when
      every case that entry would govern ran in this run and passed, else one per model and op,
      else one per case. (An entry with ``status: unspecified`` keeps its cases out of updates.)
    * An expected_pass case that failed is a regression: listed, never edited.

    The file is edited as text (:func:`casedb.triage.editor.edit`): entries not changed, comments
    and order stay byte for byte — existing entries are never moved, so a removal's diff is the
    removed entries' lines. New entries are appended to ``cases:`` as one block under a comment
    naming the run, in a stable order: known failures first (by op and cause with ``group``, else
    by model and name), then expected_pass promotions by op.
    """
    with Reading(store) as db:
        target = run_target(db, run_id)
        rows = run_rows(db, run_id)
        every = occurrences(db)
        explained = {e["cause"]: (e.get("condition") or {}).get("text") for e in explanations.load(db, run_id) or []}
    path = Path(path)
    files = ([path] if path.exists() else []) + [Path(p) for p in others if Path(p) != path]
    triage = load(files)
    mine = [e for e in triage.entries if Path(e.path) == path]
    # every value written is a literal selector: a name `*` selects that case, not every case
    scoped = {k: literal(target[k]) for k in scope if target.get(k)}
    run = _Run(run_id, target, rows, every, scoped, name_clashes(every), explained)
    prop = Proposal(path=path, run_id=run_id, target=target, text="")
    drop, rewrite = _passing_known_failures(triage, mine, run, prop)
    current, new_entries = _new_failures(triage, drop, rewrite, run, prop, group=group)
    if with_passing:
        new_entries += _promotions(triage, current, new_entries, run, prop)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    prop.text = edit(text, mine, drop, rewrite, new_entries, run_id, target)
    return prop


def _passing_known_failures(triage: Triage, mine: list[Entry], run: _Run, prop: Proposal) -> tuple[set, set]:
    """Step 1: the known_failure entries of the file whose every case passed in the run: those
    to drop, and those to make expected_pass (they carry a tolerance or timeout)."""
    governs: dict = {}
    for o in run.every:
        e = triage.entry_for(o, run.target)
        if e is not None:
            governs.setdefault(e, []).append(o)
    drop, rewrite = set(), set()
    for e in mine:
        cases = governs.get(e, [])
        if e.status != "known_failure" or not cases:
            continue
        judged = [run.ran[o["model_case_id"]] for o in cases if o["model_case_id"] in run.ran]
        passing = [r for r in judged if r["outcome"] in outcomes.PASSING]
        if not passing:
            continue
        if len(passing) < len(cases):
            why = (f"{len(passing)} of its {len(cases)} cases pass in run {run.run_id}"
                   + (f", {len(cases) - len(judged)} did not run" if len(judged) < len(cases) else "")
                   + ": narrow it to the failing ones")
            prop.kept.append((e.where, why))
            continue
        if e.rtol is not None or e.atol is not None or e.timeout is not None:
            rewrite.add(e)
            prop.rewritten.append(e.where)
        else:
            drop.add(e)
            prop.removed.append(e.where)
    return drop, rewrite


def _new_failures(triage: Triage, drop: set, rewrite: set, run: _Run, prop: Proposal, *,
                  group: bool = False) -> tuple[Triage, list]:
    """Step 2: a known_failure entry for each case no entry covers that failed, or with ``group``
    one per cause (regressions are listed, not edited). Returns the triage after step 1, and the
    new (entry, comment) pairs."""
    remaining = [e for e in triage.entries if e not in drop and e not in rewrite]
    new_rows: list[dict] = []
    current = Triage(remaining + [_as_expected(e) for e in rewrite], [], triage.unlisted)
    for r in run.rows:
        e = current.entry_for(r, run.target)
        status = e.status if e is not None else ("expected_pass" if triage.unlisted == "expected_pass" else "unspecified")
        if r["outcome"] not in outcomes.FAILING:
            continue
        if status == "expected_pass":
            prop.regressions.append((f"{r['model']}::{r['name']}", e.where if e else "defaults: unlisted"))
            continue
        if status != "unspecified" or e is not None:  # an explicit `unspecified` keeps its cases out
            continue
        new_rows.append(r)
    if group:
        new_entries = group_entries(new_rows, current, run, max((e.order for e in triage.entries), default=0),
                                    prop.notes)
    else:
        new_entries = [_failure_entry(r, run.scoped, run.clashes) for r in new_rows]
    prop.added.extend(entry for entry, _ in new_entries)
    return current, new_entries


def _promotions(triage: Triage, current: Triage, failures: list, run: _Run, prop: Proposal) -> list:
    """Step 3: expected_pass entries for the cases unspecified after steps 1 and 2 that passed,
    as wide as the run shows (see :func:`propose`). Returns the new (entry, None) pairs."""
    order = max((e.order for e in triage.entries), default=0)
    added = [Entry(status="known_failure", where="(new)", selectors={k: v for k, v in d.items() if k in ENTRY_KEYS
                                                                     and k not in SETTING_KEYS}, order=order + 1 + i)
             for i, (d, _) in enumerate(failures)]
    current = Triage(current.entries + added, [], triage.unlisted)
    promote: dict[str, list[dict]] = {}
    for r in run.rows:
        if r["outcome"] not in outcomes.PASSING:  # (xpassed: a run with triage stores a known failure's pass so)
            continue
        e = current.entry_for(r, run.target)
        if e is None and triage.unlisted == "unspecified":
            promote.setdefault(r["op"], []).append(r)
    next_order = order + len(added) + 1
    new_entries = []
    for op in sorted(promote):
        chosen = _widest(op, promote[op], current, run, next_order)
        for sel in chosen:
            c = Entry(status="expected_pass", where="(new)", selectors={**sel, **run.scoped}, order=next_order)
            next_order += 1
            current = Triage(current.entries + [c], [], triage.unlisted)
            d = {**sel, **run.scoped, "status": "expected_pass"}
            new_entries.append((d, None))
            prop.promoted.append(d)
    return new_entries


def _widest(op: str, passed: list[dict], current: Triage, run: _Run, order: int) -> list[dict]:
    """The selectors promoting the cases of ``op`` that ``passed``: the op, else one per model and
    op, else one per case — the first whose every case it would govern ran and passed."""
    for candidate in ([{"op": literal(op)}],
                      [{"model": literal(m), "op": literal(op)} for m in sorted({r["model"] for r in passed})]):
        if all(_all_pass(sel, current, run, order) for sel in candidate):
            return candidate
    return [case_selector(r, run.clashes) for r in passed]


def _all_pass(sel: dict, current: Triage, run: _Run, order: int) -> bool:
    """Whether every case an expected_pass entry ``sel`` would govern ran in the run and passed."""
    for o in governed(sel, "expected_pass", current, run, zip(run.every, run.norms), order):
        r = run.ran.get(o["model_case_id"])
        if r is None or r["outcome"] not in outcomes.PASSING:
            return False
    return True


def _failure_entry(r: dict, scoped: dict, clashes: set) -> tuple[dict, str | None]:
    """The known_failure entry for row ``r`` (a case that failed and no entry covers) and the
    comment above it: the run's stage where casedb knows it, the error's first line as reason."""
    stage = r["stage"] or outcomes.failure_stage(r["outcome"])
    notes = []
    if stage not in outcomes.STAGES:
        notes.append(f"the run recorded the stage {stage!r}, which casedb does not know: left out.")
        stage = None
    entry = {**case_selector(r, clashes), **scoped, "status": "known_failure", "stage": stage,
             "reason": first_error_line(r["error_type"], r["error_message"], r["reason"])}
    if r["outcome"] == "failed" or stage == "incorrect result":
        err = f"max abs err {r['max_abs_err']:.3g}" if r["max_abs_err"] is not None else "outside tolerance"
        tol = f"rtol {r['rtol']:g}, atol {r['atol']:g}" if r["rtol"] is not None and r["atol"] is not None else \
            (r["tolerance"] or "its tolerance")
        notes.append(f"incorrect result: {err} ({tol}). casedb does not loosen tolerances by itself: if this "
                     "error is acceptable, set rtol/atol on this entry after review")
    return entry, " ".join(notes) or None


def _as_expected(e: Entry) -> Entry:
    return Entry(status="expected_pass", where=e.where, rtol=e.rtol, atol=e.atol, timeout=e.timeout,
                 selectors=e.selectors, order=e.order, path=e.path, line=e.line, written=e.written)


def update_from_run(store_or_conn, run_id: int, path, output=None, *, others=(), scope=DEFAULT_SCOPE,
                    group: bool = False, with_passing: bool = False) -> str:
    """The text of triage file ``path`` updated from run ``run_id`` (see :func:`propose`); written
    to ``output`` when given (``path`` itself to edit it in place)."""
    prop = propose(store_or_conn, run_id, path, others=others, scope=scope, group=group, with_passing=with_passing)
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(prop.text, encoding="utf-8")
    return prop.text
