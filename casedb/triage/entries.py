"""Triage files: what a target is expected to do with each case, reviewed in git.

A triage file (YAML, ``triage/*.yaml`` by default, ``casedb run --triage PATH`` repeatable,
pytest ``--casedb-triage``) says, per case and target, whether a failure is known, which cases
the target does not support, and which tolerances and timeouts apply::

    version: 1
    defaults:
      unlisted: unspecified          # or expected_pass: a case no entry selects must pass
    tolerances:                      # casedb.judge.numerics rules (the gpt.rs list)
      - {backend: inductor, dtype: bfloat16, rtol: 2.0e-2}
    cases:
      - op: torch.rsqrt
        device: spyre
        status: known_failure
        stage: "compile: lowering"
        reason: rsqrt is not lowered yet - https://github.com/org/repo/issues/12
      - {model: granite4h, name: "mul_*", status: expected_pass, atol: 1.0e-3}
      - {model: gpt-oss, marks: largedimtensor, status: exclude}

An entry selects cases by ``model``, ``name`` (the case's name in its model), ``op``,
``signature`` (a prefix), ``dtype`` and ``marks`` (a list of marks the case has, or a marker
expression), and targets by ``device``, ``backend`` and ``arch``. Names and targets are
shell-style wildcards (``*``, ``?``, ``[abc]``; ``[[]`` and ``[]]`` for a bracket), matched
(by :mod:`casedb.judge.selectors`, as tolerance rules are) case-insensitively (model names as everywhere: ``gpt_oss`` = ``gpt-oss``). A value that starts
with ``=`` is a literal: exactly the name after it, whatever it holds (``name: "=*"`` selects
the case named ``*``; ``"=x[0]|{a}"``, ``"= lead"``, ``"="`` the empty name); ``triage update``
writes names, ops and targets so when they need it. It sets ``status`` (required): ``expected_pass``,
``known_failure``, ``not_supported``, ``exclude`` or ``unspecified`` (as if no entry selected
the case), and optionally ``reason`` (free text, an issue link), ``stage`` (one of
:data:`casedb.outcomes.STAGES`), ``rtol``/``atol`` and ``timeout`` (seconds, at most a week).

**Which entry applies.** Of the entries that select a case on a target, the most specific wins,
whole (its status, reason, stage and timeout). Specificity compares, in this order:

1. what the entry says about the case: ``signature``, then ``name``, then ``op``, then ``model``
   (as :meth:`casedb.judge.numerics.Rule.specificity`: :mod:`casedb.judge.selectors`); for each, an exact value beats a wildcard,
   which beats nothing (``*`` counts as nothing);
2. the target: ``arch``, then ``device`` and ``backend`` together (exact over wildcard) — so
   among entries that select the same cases, a target-scoped one beats a general one;
3. ``dtype``, then ``marks``;
4. the later entry (files in the order given, then lines). Two entries that tie on 1–3, can
   select the same case and disagree are a problem :func:`check` reports.

For example, on ``device: spyre``, with the entries
``A {op: torch.rsqrt, status: expected_pass}``,
``B {op: torch.rsqrt, device: spyre, status: known_failure}``,
``C {model: granite4h, name: rsqrt_7, status: expected_pass}`` and
``D {op: "torch.nn.functional.*", device: spyre, status: known_failure}``:
rsqrt cases get B (A's selection, scoped to the target), except ``granite4h::rsqrt_7``, which
gets C (it names the case); ``torch.nn.functional.silu`` gets D, unless an entry names that op
exactly (``{op: torch.nn.functional.silu}`` beats D everywhere, spyre included: to say
something of silu on spyre, scope that entry to spyre too).

Tolerances are :class:`casedb.judge.numerics.Rule` objects, resolved per key by
:class:`casedb.judge.numerics.Policy`: the ``tolerances:`` list and the ``rtol``/``atol`` of case
entries (an entry with ``rtol``/``atol`` sets them whatever its status; selecting by ``marks``
cannot carry a tolerance). A rule's ``dtype`` is the compared tensor's dtype.

**Verdicts** (:func:`verdict`): how a raw outcome reads under the entry that applies.

=================  ==========================  ===============  ============  =====================
status             raw outcome                 outcome          ``triage``    hint / reason
=================  ==========================  ===============  ============  =====================
exclude            (not run)                   None             excluded      not selected
not_supported      (not run)                   skipped          not_supported the entry's reason
known_failure      failed/error/crashed/t-o    xfailed          known         reason; stage moved
known_failure      passed/xpassed              xpassed          known         remove the entry
expected_pass      failed/error/crashed/t-o    (unchanged)      regression    expected to pass
expected_pass      passed/xpassed              (unchanged)      expected
unspecified/none   failed/error/crashed/t-o    (unchanged)      new           triage update adds it
unspecified/none   passed/xpassed              (unchanged)      unspecified
any                xfailed (manifest's xfail)  xfailed          known
any                skipped/ref_error/n.e.      (unchanged)      (as status)
=================  ==========================  ===============  ============  =====================

(No entry means ``expected_pass`` when ``defaults: unlisted: expected_pass``.)

**Checks** (:func:`casedb.triage.checks.check`, ``casedb triage check``, every run that loads a file): unknown keys
(with a did-you-mean), bad values and patterns, entries that select no case in the DB (stale),
and entries that tie and disagree — each with file:line. Nothing in a file is executed: it is
read as data (:mod:`casedb.triage.files`), within the manifest loader's bounds
(importers.yaml_manifest), at most :data:`MAX_FILE_BYTES` and :data:`MAX_ITEMS` entries a file.
The check (:mod:`casedb.triage.checks`) finds an entry's cases through its exact name, op or
model, compares only entries of one precedence through the cases they select, and stops with a
``limit`` problem past a bound on what it may spend.

**Promotion** (:func:`casedb.triage.update.update_from_run`, ``casedb triage update --from-run N``)
edits the file as text (:mod:`casedb.triage.editor`), leaving every other byte as it was: see
:func:`casedb.triage.update.propose`. New entries name the run's device and backend (``--scope``);
with ``--group`` there is one per failure cause (:mod:`casedb.triage.grouping`).

**Import** (:func:`casedb.triage.rfc.import_rfc`, ``casedb triage import``): the RFC implementation's
``skip_files.yaml`` and its test-suite config, as documented there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, TypedDict

from casedb import outcomes
from casedb.judge import numerics
from casedb.judge.selectors import CASE_KEYS, TARGET_KEYS, Pattern, Selector, case_norms, normalize

VERSION = 1
STATUSES = ("expected_pass", "known_failure", "not_supported", "exclude", "unspecified")
UNLISTED = ("unspecified", "expected_pass")
SETTING_KEYS = ("status", "reason", "stage", "rtol", "atol", "timeout")
ENTRY_KEYS = CASE_KEYS + TARGET_KEYS + SETTING_KEYS
TOP_KEYS = ("version", "defaults", "tolerances", "cases")
DEFAULT_KEYS = ("unlisted",)
RULE_KEYS = numerics.RULE_KEYS + ("arch",)
# A file's bounds: 20,000 entries are about 2 MB and read in a few seconds; past these, reading
# it (every run does, in every worker) would take minutes and gigabytes.
MAX_FILE_BYTES = 8 << 20
MAX_ITEMS = 50_000


@dataclass(eq=False)
class Entry:
    """One ``cases:`` entry of a triage file (selectors normalized, settings checked)."""

    status: str
    where: str
    reason: str | None = None
    stage: str | None = None
    rtol: float | None = None
    atol: float | None = None
    timeout: float | None = None
    selectors: dict = field(default_factory=dict)   # key -> the text written (marks: list or expression)
    order: int = 0
    path: str = ""
    line: int = 0
    written: dict = field(default_factory=dict)     # the mapping as written (for rewriting it)

    def __post_init__(self):
        self.selector = Selector(self.selectors)
        self.case_key = self.selector.case_key

    @property
    def runs(self) -> bool:
        """False when the case is not run at all (exclude, not_supported)."""
        return self.status not in ("exclude", "not_supported")

    def specificity(self) -> tuple:
        """See the module docstring; ``order`` breaks ties (the later entry wins)."""
        return self.selector.rank + (self.order,)

    def settings(self) -> tuple:
        return (self.status, self.stage, self.reason, self.timeout)

    def describe(self) -> str:
        sel = ", ".join(f"{k}={v}" for k, v in self.selectors.items()) or "every case"
        return f"{self.status} ({sel}) at {self.where}"

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, "stage": self.stage, "rtol": self.rtol,
                "atol": self.atol, "timeout": self.timeout, "where": self.where, **{k: v for k, v in self.selectors.items()}}


@dataclass(eq=False)
class RuleSpec:
    """A tolerance rule of a triage file, with the ``arch`` it is scoped to and its selectors."""

    rule: numerics.Rule
    arch: Pattern | None
    selectors: dict


class Triage:
    """The entries and tolerance rules of one or more triage files (see the module docstring)."""

    def __init__(self, entries: list[Entry], rule_specs: list[RuleSpec], unlisted: str = "unspecified",
                 paths: Iterable = ()):
        self.entries = entries
        self.rule_specs = rule_specs
        self.unlisted = unlisted
        self.paths = [Path(p) for p in paths]
        self._by: dict[str, dict[str, list[Entry]]] = {"name": {}, "op": {}, "model": {}}
        self._generic: list[Entry] = []
        for e in entries:  # each entry in one bucket: candidates for a case are a few lists
            for k in ("name", "op", "model"):
                p = e.selector.patterns.get(k)
                if p is not None and p.exact:
                    self._by[k].setdefault(p.norm, []).append(e)
                    break
            else:
                self._generic.append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def candidates(self, norms: dict) -> list[Entry]:
        """The entries that may select the case of these :func:`~casedb.judge.selectors.case_norms`."""
        out = list(self._generic)
        for k in ("name", "op", "model"):
            out += self._by[k].get(norms[k], ())
        return out

    def entry_for(self, case: dict, target: dict) -> Entry | None:
        """The entry that applies to ``case`` (model, name, op, signature, dtype, marks) on
        ``target`` (device, backend, arch), or None."""
        best = None
        norms = case_norms(case)
        for e in self.candidates(norms):
            if e.selector.matches(norms, target) and (best is None or e.specificity() > best.specificity()):
                best = e
        return best

    def verdict(self, case: dict, target: dict, outcome: str | None, *, stage: str | None = None) -> Reading:
        return verdict(self.entry_for(case, target), outcome, stage=stage, unlisted=self.unlisted)

    def rules(self, arch: str | None = None) -> list[numerics.Rule]:
        """Tolerance rules, in the order written (files in the order given): the ``tolerances:``
        lists and the ``rtol``/``atol`` of case entries. Rules scoped to an ``arch`` are kept
        only when it matches ``arch``."""
        return [s.rule for s in self.rule_specs if s.arch is None or s.arch.matches(normalize("arch", arch))]


class Reading(TypedDict):
    """What :func:`verdict` says of an outcome: the record triage hands the run (casedb.run.decide)."""

    outcome: Optional[str]   # the outcome under the entry (None: not selected, excluded)
    triage: Optional[str]    # excluded, not_supported, known, expected, regression, new, unspecified
    status: str              # the entry's status (unlisted: the files' default)
    reason: Optional[str]
    hint: Optional[str]      # what to do about it (update the entry's stage, remove it ...)
    where: Optional[str]     # the entry's file:line


def verdict(entry: Entry | None, outcome: str | None, *, stage: str | None = None,
            unlisted: str = "unspecified", target: dict | None = None) -> Reading:
    """The triaged reading of a raw ``outcome`` (a casedb.outcomes name) under ``entry`` (None:
    no entry). Returns ``outcome`` (None: not selected), ``triage`` (excluded, not_supported,
    known, expected, regression, new, unspecified), ``status``, ``reason``, ``hint`` and
    ``where`` (the entry's file:line). ``outcome`` may be None for an entry that decides without
    running (``entry.runs`` is False). ``stage``: where the case failed, compared with the
    entry's; ``target`` (device, backend): what the case ran on, which a hint names. See the table
    in the module docstring."""
    if entry is None:
        status = "expected_pass" if unlisted == "expected_pass" else "unspecified"
    else:
        status = entry.status
    where = entry.where if entry is not None else None
    out = {"outcome": outcome, "triage": None, "status": status, "reason": entry.reason if entry else None,
           "hint": None, "where": where}
    if status == "exclude":
        return {**out, "outcome": None, "triage": "excluded", "reason": entry.reason or f"excluded by {where}"}
    if status == "not_supported":
        return {**out, "outcome": "skipped", "triage": "not_supported",
                "reason": entry.reason or f"not supported on this target ({where})"}
    if outcome is None or outcome not in outcomes.BY_NAME:
        raise ValueError(f"verdict needs the outcome the case had (one of {', '.join(outcomes.NAMES)}), not {outcome!r}")
    if outcome == "xfailed":  # the manifest's own xfail mark
        return {**out, "triage": "known", "reason": out["reason"] or "marked xfail in its manifest"}
    fails, passes = outcome in outcomes.FAILING, outcome in outcomes.PASSING
    if status == "known_failure":
        if fails:
            hint = None
            if stage and entry.stage and stage != entry.stage:
                hint = f"fails at {stage!r} now; the entry at {where} says {entry.stage!r}: update its stage"
            return {**out, "outcome": "xfailed", "triage": "known", "hint": hint,
                    "reason": entry.reason or f"known failure ({where})"}
        if passes:
            return {**out, "outcome": "xpassed", "triage": "known", "hint": _xpass_hint(entry, target)}
        return {**out, "triage": "known"}
    if status == "expected_pass":
        if fails:
            said = f"the entry at {where}" if where else "defaults: unlisted: expected_pass"
            return {**out, "triage": "regression", "hint": f"expected to pass ({said})"}
        return {**out, "triage": "expected"}
    if fails:
        return {**out, "triage": "new",
                "hint": "not in a triage file: `casedb triage update --from-run RUN` adds it as a known_failure"}
    return {**out, "triage": "unspecified"}


def _xpass_hint(entry: Entry, target: dict | None) -> str:
    """What to do when a known failure passes: named with the target it passed on, and a caution
    where the entry names no backend (it may have been written for another backend: an entry
    scoped to another target never applies, so never gets here)."""
    if not target:
        return (f"passes now: remove the known_failure entry at {entry.where} "
                "(`casedb triage update --from-run RUN` does)")
    on = f"{target.get('device')}/{target.get('backend')}"
    hint = (f"passes now on {on}: remove the known_failure entry at {entry.where} "
            "(`casedb triage update --from-run RUN` does)")
    if "backend" not in entry.selectors:
        hint += (f"; it names no backend: if it was written for a backend other than {target.get('backend')}, "
                 "scope it (backend: NAME) instead")
    return hint
