"""The checks of triage files against the DB: entries that select no case (stale) and entries that
tie and disagree (:func:`check`), and the check every run makes first (:func:`require_clean`).

The check finds an entry's cases through its exact name, op or model, compares only entries of
one precedence through the cases they select, and stops with a ``limit`` problem past a bound on
what it may spend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from casedb.errors import InputError
from casedb.judge.selectors import CASE_KEYS, TARGET_KEYS, case_norms, normalize
from casedb.triage.entries import Entry, RuleSpec
from casedb.triage.files import Problem, did_you_mean, parse, shipped_paths
from casedb.triage.reading import occurrences


def check(paths, store=None) -> list[Problem]:
    """Every problem of these files: syntax, unknown keys, bad values and patterns, and with a
    DB (``store``: a Store, a database, a connection or a path), stale entries (selecting no case)
    and entries that tie and disagree. Empty when the files are fine. Reads the DB only. A file
    past a bound on what the check may spend (:data:`WILDCARD_MATCHES` ...) gets a ``limit``
    problem, and the check stops there."""
    paths = [Path(p) for p in paths]
    problems: list[Problem] = []
    parsed = parse(paths, problems)
    parsed.unlisted_value(problems)
    entries, specs = parsed.entries, parsed.specs
    occ = occurrences(store) if store is not None else None
    budget = _Budget()
    cases = _Cases(occ, budget) if occ else None
    try:
        _conflicts(entries, cases, budget, problems)
        if cases is not None:  # (after: the tie check has looked up what most entries select)
            _stale(entries, specs, cases, problems)
    except _Limit as stop:
        problems.append(stop.problem)
    return sorted(problems, key=_problem_order)


def require_clean(paths, store) -> None:
    """What every run that loads triage files does first: :func:`check` them, and stop with an
    InputError listing each problem (file:line) before any case runs."""
    if not paths:
        return
    shipped = {str(p.resolve()) for p in shipped_paths()}
    # the shipped triage names the shipped models: in a DB without them its entries select
    # nothing, which is no problem of the user's
    problems = [p for p in check(paths, store)
                if not (p.kind == "stale" and p.where.rpartition(":")[0] in shipped)]
    if problems:
        listed = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more (casedb triage check)" if len(problems) > 20 else ""
        raise InputError(f"{len(problems)} problem(s) in the triage files; fix them (casedb triage check lists "
                         f"them) and run again:\n{listed}{more}")


def _problem_order(p: Problem):
    path, _, line = p.where.rpartition(":")
    return (path, int(line)) if line.isdigit() else (p.where, 0)


# What one check may spend: wildcards matched against a key's distinct values (a regex each,
# about a microsecond), cases looked up for ties (a set operation in C, tens of nanoseconds),
# and target patterns among entries of one precedence (each compared in Python with those of
# every entry after it). A file past one is refused (a "limit" problem): they are far beyond
# what a hand-written or generated file needs (2,000 wildcards over 3,000 cases: 6 million
# matches), and far below minutes.
WILDCARD_MATCHES = 10_000_000
TIE_LOOKUPS = 200_000_000
TARGET_PATTERNS = 256


class _Limit(Exception):
    """The check stops: ``problem`` says at which entry and why."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


@dataclass
class _Budget:
    """What is left to spend of each bound; :meth:`spend` raises :class:`_Limit` past one."""

    matches: int = WILDCARD_MATCHES
    lookups: int = TIE_LOOKUPS

    def spend(self, what: str, n: int, e: Entry) -> None:
        left = getattr(self, what) - n
        setattr(self, what, left)
        if left < 0:
            raise _stop(e, f"its wildcards were matched more than {WILDCARD_MATCHES:,} times" if what == "matches"
                        else f"ties were looked up for more than {TIE_LOOKUPS:,} cases")


def _stop(e: Entry, why: str) -> _Limit:
    return _Limit(Problem(e.where, f"the check stops here: {why}",
                          "make the entries more specific (name the cases, scope them to targets) or fewer", "limit"))


class _Cases:
    """The DB's case occurrences as the checks look them up. The cases an entry selects come from
    an index of each key's values: an exact name, op or model is one lookup; a wildcard is
    matched against the key's distinct values (in C), not against every case. The answers for
    the last few hundred selections are kept (entries often repeat one)."""

    KEEP = 256
    KEYS = ("name", "op", "model", "dtype")

    def __init__(self, occ: list[dict], budget: _Budget):
        self.occ = occ
        self.budget = budget
        self.norms = [case_norms(o) for o in occ]
        self.index: dict = {k: {} for k in self.KEYS}
        for i, n in enumerate(self.norms):
            for k, by in self.index.items():
                by.setdefault(n[k], []).append(i)
        self.every = frozenset(range(len(occ)))
        self._kept: dict = {}
        self._selects: dict = {}   # case_key -> whether it selects any case (every answer: small)

    def _by_key(self, e: Entry) -> tuple[list | frozenset, bool]:
        """Cases the entry's most telling key selects, and whether that key is all it says."""
        pats = [(k, e.selector.patterns[k]) for k in self.KEYS if k in e.selector.patterns]
        pats.sort(key=lambda kp: not kp[1].exact)
        only = len(pats) == 1 and e.selector.signature is None and e.selector.marks is None
        if not pats:
            return self.every, False
        k, p = pats[0]
        by = self.index[k]
        if p.exact:
            return by.get(p.norm, []), only
        self.budget.spend("matches", len(by), e)
        return [i for v in filter(p.regex.match, by) for i in by[v]], only

    def selected(self, e: Entry) -> frozenset:
        """The positions (in ``occ``) of the cases ``e`` selects."""
        found = self._kept.get(e.case_key)
        if found is None:
            cand, only = self._by_key(e)
            found = frozenset(cand if only else (i for i in cand if e.selector.matches_case(self.norms[i])))
            if len(self._kept) >= self.KEEP:
                del self._kept[next(iter(self._kept))]
            self._kept[e.case_key] = found
            self._selects[e.case_key] = bool(found)
        return found

    def selects_any(self, e: Entry) -> bool:
        if e.case_key not in self._selects:
            cand, only = self._by_key(e)
            self._selects[e.case_key] = bool(cand) if only else any(
                e.selector.matches_case(self.norms[i]) for i in cand)
        return self._selects[e.case_key]


# Stale entries beyond these get no did-you-mean (each compares a name with every name in the DB).
_STALE_HINTS = 50


def _stale(entries: list[Entry], specs: list[RuleSpec], cases: _Cases, out: list[Problem]) -> None:
    occ = cases.occ
    hints = [_STALE_HINTS]
    models = sorted({o["model"] for o in occ})
    ops = sorted({o["op"] for o in occ})

    def hint(sel, patterns):
        hints[0] -= 1
        if hints[0] < 0:
            return "remove it, or fix its selectors (see `casedb cases`)"
        return _stale_hint(sel, patterns, occ, models, ops)

    for e in entries:
        if not e.case_key:
            continue
        if not cases.selects_any(e):
            out.append(Problem(e.where, f"stale: selects no case in the DB ({_selection(e.selectors)})",
                               hint(e.selectors, e.selector.patterns), "stale"))
    for s in specs:
        sel = {k: v for k, v in s.selectors.items() if k in ("model", "name", "op", "signature")}
        if not sel:
            continue
        probe = Entry(status="unspecified", where=s.rule.where, selectors=sel)
        if not cases.selects_any(probe):
            out.append(Problem(s.rule.where, f"stale: the tolerance rule selects no case in the DB ({_selection(sel)})",
                               hint(sel, probe.selector.patterns), "stale"))


def _selection(sel: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sel.items() if k in CASE_KEYS) or "every case"


def _stale_hint(sel, patterns, occ, models, ops) -> str:
    p = patterns.get("model")
    if p is not None and not any(p.matches(normalize("model", m)) for m in models):
        return did_you_mean(sel["model"], models) or f"models in the DB: {', '.join(models[:12])}"
    p = patterns.get("op")
    if p is not None and not any(p.matches(op.lower()) for op in ops):
        return did_you_mean(sel["op"], ops) or "no op matches: see `casedb cases`"
    p = patterns.get("name")
    if p is not None:
        pm = patterns.get("model")
        names = sorted({o["name"] for o in occ if pm is None or pm.matches(normalize("model", o["model"]))})
        if not any(p.matches(n.lower()) for n in names):
            return did_you_mean(sel["name"], names) or "no case of that name: see `casedb cases`"
    return "remove it, or fix its selectors (see `casedb cases`)"


def _overlap(a: Entry, b: Entry) -> bool:
    """Whether two entries can select a same case on a same target (patterns: assumed yes)."""
    for k in ("model", "name", "op", "dtype") + TARGET_KEYS:
        pa, pb = a.selector.patterns.get(k), b.selector.patterns.get(k)
        if pa is None or pb is None:
            continue
        if pa.exact and pb.exact and pa.norm != pb.norm:
            return False
        if pa.exact != pb.exact and not (pb if pa.exact else pa).matches((pa if pa.exact else pb).norm):
            return False
    sa, sb = a.selector.signature, b.selector.signature
    if sa and sb and not (sa.startswith(sb) or sb.startswith(sa)):
        return False
    return True


def _conflicts(entries: list[Entry], cases: _Cases | None, budget: _Budget, out: list[Problem]) -> None:
    """Entries that tie (equally specific: see the module docstring), can select a same case on
    a same target and disagree, each named once with an entry before it that it ties with; and
    duplicates. With a DB, "can select a same case" is whether they do; without, whether their
    patterns can. Entries are compared only within a precedence class, through the cases they
    select (sets): no pair of entries is compared one by one."""
    groups: dict = {}
    for e in entries:
        key = (e.selector.rank, tuple(e.selector.patterns[k].norm if k in e.selector.patterns and e.selector.patterns[k].exact else "*"
                               for k in ("name", "op", "model")), e.selector.signature or "")
        groups.setdefault(key, []).append(e)
    for group in groups.values():
        if len(group) > 1:
            _ties(group, cases, budget, out)


def _target_key(e: Entry) -> tuple:
    return tuple(e.selector.patterns[k].text.lower() if k in e.selector.patterns else None for k in ("dtype",) + TARGET_KEYS)


@dataclass(eq=False)
class _Seen:
    """The entries of one precedence class with one target pattern, so far: per case, the first
    entry that selects it and the first after it with other settings (enough to find, for any
    later entry, an earlier one that disagrees)."""

    entry: Entry                                       # the first (for _overlap)
    first: dict = field(default_factory=dict)          # case -> entry
    second: dict = field(default_factory=dict)         # case -> entry
    firsts: set = field(default_factory=set)           # their keys, as sets (set operations in C)
    seconds: set = field(default_factory=set)
    by_settings: dict = field(default_factory=dict)    # settings -> cases whose first entry has them
    # cases selected -> the first entries that selected exactly them (other settings each, two
    # at most): entries repeating a selection are answered without touching its cases
    by_selection: dict = field(default_factory=dict)

    def disagreeing(self, ids: frozenset, settings: tuple) -> Entry | None:
        a = next((a for a in self.by_selection.get(ids, ()) if a.settings() != settings), None)
        if a is not None:
            return a
        agree = self.by_settings.get(settings, frozenset())
        other = (ids & self.firsts) - agree
        if other:
            return self.first[min(other)]
        both = ids & agree & self.seconds
        return self.second[min(both)] if both else None

    def add(self, e: Entry, ids: frozenset, settings: tuple) -> None:
        same = self.by_selection.setdefault(ids, [])
        if len(same) == 2 or any(a.settings() == settings for a in same):
            return  # each of its cases has a first entry, and a second where one can differ
        same.append(e)
        new = ids - self.firsts
        self.first.update(dict.fromkeys(new, e))
        self.firsts |= new
        self.by_settings.setdefault(settings, set()).update(new)
        later = ids - new - self.by_settings[settings] - self.seconds
        self.second.update(dict.fromkeys(later, e))
        self.seconds |= later


def _ties(group: list[Entry], cases: _Cases | None, budget: _Budget, out: list[Problem]) -> None:
    seen: dict = {}        # target pattern -> _Seen
    settings_of: dict = {}  # target pattern -> the settings its entries have
    overlap: dict = {}
    written: dict = {}
    for b in group:
        ids = frozenset([-1]) if cases is None else (cases.selected(b) if b.case_key else cases.every)
        if not ids:
            continue
        tkb, sb = _target_key(b), b.settings()
        same = written.setdefault((b.case_key, tkb, sb, b.rtol, b.atol), b)
        if same is not b:
            out.append(Problem(b.where, f"duplicate of the entry at {same.where}", "remove one", "duplicate"))
        if tkb not in seen and len(seen) >= TARGET_PATTERNS:
            raise _stop(b, f"{len(group)} entries as specific as this one (from {group[0].where} on) have more "
                           f"than {TARGET_PATTERNS} device/backend/arch/dtype patterns")
        a = None
        for tk, other in seen.items():
            if len(settings_of[tk]) == 1 and sb in settings_of[tk]:
                continue  # every entry with these patterns agrees with b
            if (tk, tkb) not in overlap:
                overlap[tk, tkb] = _overlap(other.entry, b)
            if overlap[tk, tkb]:
                budget.spend("lookups", len(ids), b)
                a = other.disagreeing(ids, sb)
                if a is not None:
                    break
        if a is not None:
            what = [n for n, x, y in zip(("status", "stage", "reason", "timeout"), a.settings(), sb) if x != y]
            out.append(Problem(b.where, f"ties with the entry at {a.where} (equally specific, can select the same "
                                        f"cases) but disagrees on {', '.join(what)}",
                               "make one more specific (name the case, or scope it to a target) or remove one",
                               "conflict"))
        seen.setdefault(tkb, _Seen(b)).add(b, ids, sb)
        settings_of.setdefault(tkb, set()).add(sb)
