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
case-insensitively (model names as everywhere: ``gpt_oss`` = ``gpt-oss``). A value that starts
with ``=`` is a literal: exactly the name after it, whatever it holds (``name: "=*"`` selects
the case named ``*``; ``"=x[0]|{a}"``, ``"= lead"``, ``"="`` the empty name); ``triage update``
writes names, ops and targets so when they need it. It sets ``status`` (required): ``expected_pass``,
``known_failure``, ``not_supported``, ``exclude`` or ``unspecified`` (as if no entry selected
the case), and optionally ``reason`` (free text, an issue link), ``stage`` (one of
:data:`casedb.outcomes.STAGES`), ``rtol``/``atol`` and ``timeout`` (seconds, at most a week).

**Which entry applies.** Of the entries that select a case on a target, the most specific wins,
whole (its status, reason, stage and timeout). Specificity compares, in this order:

1. what the entry says about the case: ``signature``, then ``name``, then ``op``, then ``model``
   (as :meth:`casedb.judge.numerics.Rule.specificity`); for each, an exact value beats a wildcard,
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

**Checks** (:func:`check`, ``casedb triage check``, every run that loads a file): unknown keys
(with a did-you-mean), bad values and patterns, entries that select no case in the DB (stale),
and entries that tie and disagree — each with file:line. Nothing in a file is executed: it is
read as data, within the manifest loader's bounds (importers.yaml_manifest), at most
:data:`MAX_FILE_BYTES` and :data:`MAX_ITEMS` entries a file. The check finds an entry's cases
through its exact name, op or model, compares only entries of one precedence through the cases
they select, and stops with a ``limit`` problem past a bound on what it may spend.

**Promotion** (:func:`update_from_run`, ``casedb triage update --from-run N``) edits the file
as text, leaving every other byte as it was: see :func:`propose`.

**Import** (:func:`import_rfc`, ``casedb triage import``): the RFC implementation's
``skip_files.yaml`` and its test-suite config, as documented there.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable


from casedb.cases import dtypes, marks as marks_mod
from casedb.judge import numerics
from casedb import names, outcomes
from casedb.store import schema_check
from casedb.escape import yaml_comment as emit_comment, yaml_scalar as scalar
from casedb.errors import InputError, NotFound
from casedb.run.runspec import MAX_TIMEOUT

VERSION = 1
STATUSES = ("expected_pass", "known_failure", "not_supported", "exclude", "unspecified")
UNLISTED = ("unspecified", "expected_pass")
CASE_KEYS = ("model", "name", "op", "signature", "dtype", "marks")
TARGET_KEYS = ("device", "backend", "arch")
SETTING_KEYS = ("status", "reason", "stage", "rtol", "atol", "timeout")
ENTRY_KEYS = CASE_KEYS + TARGET_KEYS + SETTING_KEYS
TOP_KEYS = ("version", "defaults", "tolerances", "cases")
DEFAULT_KEYS = ("unlisted",)
RULE_KEYS = numerics.RULE_KEYS + ("arch",)
FAILING = frozenset({"failed", "error", "crashed", "timeout"})
PASSING = frozenset({"passed", "xpassed"})
# Spellings from tt-xla and the RFC implementation, offered as the suggestion (still an error).
_STATUS_HINTS = {"expected_passing": "expected_pass", "known_failure_xfail": "known_failure", "xfail": "known_failure",
                 "xfail_strict": "known_failure", "not_supported_skip": "not_supported", "skip": "not_supported",
                 "exclude_model": "exclude", "mandatory_success": "expected_pass", "pass": "expected_pass"}
_STAGE_HINTS = {"failed_fe_compilation": "compile: dynamo trace", "failed_ttmlir_compilation": "compile: backend compiler",
                "failed_runtime": "runtime", "incorrect_result": "incorrect result", "compile": "compile: backend compiler",
                "lowering": "compile: lowering", "dynamo": "compile: dynamo trace"}
# The stage of a failing outcome recorded without one.
_OUTCOME_STAGE = {"failed": "incorrect result", "crashed": "crash", "timeout": "timeout", "error": "runtime"}
# A file's bounds: 20,000 entries are about 2 MB and read in a few seconds; past these, reading
# it (every run does, in every worker) would take minutes and gigabytes.
MAX_FILE_BYTES = 8 << 20
MAX_ITEMS = 50_000


@dataclass(frozen=True)
class Problem:
    """Something wrong in a triage file, at ``where`` (file:line)."""

    where: str
    message: str
    suggestion: str | None = None
    kind: str = "value"       # syntax, unknown_key, value, stale, conflict, duplicate, limit

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" + (f" ({self.suggestion})" if self.suggestion else "")

    def to_dict(self) -> dict:
        return {"where": self.where, "kind": self.kind, "message": self.message, "suggestion": self.suggestion}


def _did_you_mean(word, choices) -> str | None:
    return names.did_you_mean(word, choices, ignore_case=True) or None


# ------------------------------------------------------------------------------------- patterns

_WILD = re.compile(r"[*?[]")
LITERAL = "="  # a selector value starting with it is the exact value that follows, wildcards and all


def literal(value) -> str:
    """The selector value that selects exactly ``value`` (a name, op, model or target from a DB):
    ``value`` itself when it holds nothing a pattern reads or the check questions, else
    ``=`` + ``value`` (``*`` -> ``=*``)."""
    text = str(value)
    plain = (text and text == text.strip() and not text.startswith(LITERAL) and not _REGEX_TELL.search(text)
             and not _WILD.search(text) and "]" not in text)
    return text if plain else LITERAL + text


class _Pattern:
    """One selector value: exact (compared normalized; ``=`` + a value is exact whatever it holds)
    or a wildcard (fnmatch, case-insensitive)."""

    __slots__ = ("text", "norm", "exact", "regex")

    def __init__(self, text: str, normalize=str.lower):
        self.text = text
        is_literal = text.startswith(LITERAL)
        self.norm = normalize(text[len(LITERAL):] if is_literal else text)
        self.exact = is_literal or not _WILD.search(text)
        self.regex = None if self.exact else re.compile(fnmatch.translate(self.norm))

    def matches(self, norm_value: str) -> bool:
        return norm_value == self.norm if self.exact else self.regex.match(norm_value) is not None

    @property
    def weight(self) -> int:
        """2 exact, 1 wildcard, 0 for '*' (as numerics._exactness)."""
        return 0 if self.text == "*" else (2 if self.exact else 1)


@functools.lru_cache(maxsize=4096)
def _model_norm(text: str) -> str:
    return names.model_key(text)


_NORMALIZE = {"model": _model_norm}


def _norm(key: str, value) -> str:
    return _NORMALIZE.get(key, str.lower)("" if value is None else str(value))


def _case_norms(case: dict) -> dict:
    """What entries compare of a case, normalized once: per selector key, and its marks."""
    out = {k: _norm(k, case.get(k)) for k in ("model", "name", "op", "dtype", "signature")}
    out["marks"] = frozenset(case.get("marks") or ())
    return out


# --------------------------------------------------------------------------------------- entries

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
        self._patterns = {k: _Pattern(str(v), _NORMALIZE.get(k, str.lower)) for k, v in self.selectors.items()
                          if k not in ("marks", "signature")}
        sig = self.selectors.get("signature")
        self._signature = str(sig).lower() if sig is not None else None
        m = self.selectors.get("marks")
        self._marks = None
        if isinstance(m, list):
            self._marks = set(m)
        elif m is not None:
            self._marks = marks_mod.MarkExpression(str(m))
        self._rank = self.rank()
        self._case_patterns = [(k, p) for k, p in self._patterns.items() if k in CASE_KEYS]
        # what the entry selects of a case: entries that say the same select the same cases
        self.case_key = tuple(sorted((k, tuple(v) if isinstance(v, list) else str(v))
                                     for k, v in self.selectors.items() if k in CASE_KEYS))

    @property
    def runs(self) -> bool:
        """False when the case is not run at all (exclude, not_supported)."""
        return self.status not in ("exclude", "not_supported")

    def matches_case(self, case: dict, norms: dict | None = None) -> bool:
        """Whether the entry selects ``case``; ``norms``: its :func:`_case_norms`, where the caller
        has them."""
        norms = norms or _case_norms(case)
        for k, p in self._case_patterns:
            if not p.matches(norms[k]):
                return False
        if self._signature is not None and not norms["signature"].startswith(self._signature):
            return False
        if self._marks is not None:
            if isinstance(self._marks, set):
                return self._marks <= norms["marks"]
            return self._marks.matches(norms["marks"])
        return True

    def matches_target(self, target: dict) -> bool:
        return all(p.matches(_norm(k, target.get(k))) for k, p in self._patterns.items() if k in TARGET_KEYS)

    def matches(self, case: dict, target: dict, norms: dict | None = None) -> bool:
        return self.matches_target(target) and self.matches_case(case, norms)

    def weight(self, key: str) -> int:
        if key == "signature":
            return 2 if self._signature else 0
        if key == "marks":
            return 0 if self._marks is None else (len(self._marks) if isinstance(self._marks, set) else 1)
        p = self._patterns.get(key)
        return p.weight if p else 0

    def specificity(self) -> tuple:
        """See the module docstring; ``order`` breaks ties (the later entry wins)."""
        return self._rank + (self.order,)

    def rank(self) -> tuple:
        case = tuple(self.weight(k) for k in ("signature", "name", "op", "model"))
        target = (self.weight("arch"), self.weight("device") + self.weight("backend"))
        return (case, target, (self.weight("dtype"), self.weight("marks")))

    def settings(self) -> tuple:
        return (self.status, self.stage, self.reason, self.timeout)

    def describe(self) -> str:
        sel = ", ".join(f"{k}={v}" for k, v in self.selectors.items()) or "every case"
        return f"{self.status} ({sel}) at {self.where}"

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, "stage": self.stage, "rtol": self.rtol,
                "atol": self.atol, "timeout": self.timeout, "where": self.where, **{k: v for k, v in self.selectors.items()}}


@dataclass(eq=False)
class _RuleSpec:
    rule: numerics.Rule
    arch: _Pattern | None
    selectors: dict


class Triage:
    """The entries and tolerance rules of one or more triage files (see the module docstring)."""

    def __init__(self, entries: list[Entry], rule_specs: list[_RuleSpec], unlisted: str = "unspecified",
                 paths: Iterable = ()):
        self.entries = entries
        self.rule_specs = rule_specs
        self.unlisted = unlisted
        self.paths = [Path(p) for p in paths]
        self._by: dict[str, dict[str, list[Entry]]] = {"name": {}, "op": {}, "model": {}}
        self._generic: list[Entry] = []
        for e in entries:  # each entry in one bucket: candidates for a case are a few lists
            for k in ("name", "op", "model"):
                p = e._patterns.get(k)
                if p is not None and p.exact:
                    self._by[k].setdefault(p.norm, []).append(e)
                    break
            else:
                self._generic.append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def candidates(self, case: dict, norms: dict | None = None) -> list[Entry]:
        norms = norms or _case_norms(case)
        out = list(self._generic)
        for k in ("name", "op", "model"):
            out += self._by[k].get(norms[k], ())
        return out

    def entry_for(self, case: dict, target: dict) -> Entry | None:
        """The entry that applies to ``case`` (model, name, op, signature, dtype, marks) on
        ``target`` (device, backend, arch), or None."""
        best = None
        norms = _case_norms(case)
        for e in self.candidates(case, norms):
            if e.matches(case, target, norms) and (best is None or e.specificity() > best.specificity()):
                best = e
        return best

    def verdict(self, case: dict, target: dict, outcome: str | None, *, stage: str | None = None) -> dict:
        return verdict(self.entry_for(case, target), outcome, stage=stage, unlisted=self.unlisted)

    def rules(self, arch: str | None = None) -> list[numerics.Rule]:
        """Tolerance rules, in the order written (files in the order given): the ``tolerances:``
        lists and the ``rtol``/``atol`` of case entries. Rules scoped to an ``arch`` are kept
        only when it matches ``arch``."""
        return [s.rule for s in self.rule_specs if s.arch is None or s.arch.matches(_norm("arch", arch))]


def verdict(entry: Entry | None, outcome: str | None, *, stage: str | None = None,
            unlisted: str = "unspecified") -> dict:
    """The triaged reading of a raw ``outcome`` (a casedb.outcomes name) under ``entry`` (None:
    no entry). Returns ``outcome`` (None: not selected), ``triage`` (excluded, not_supported,
    known, expected, regression, new, unspecified), ``status``, ``reason``, ``hint`` and
    ``where`` (the entry's file:line). ``outcome`` may be None for an entry that decides without
    running (``entry.runs`` is False). ``stage``: where the case failed, compared with the
    entry's. See the table in the module docstring."""
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
    fails, passes = outcome in FAILING, outcome in PASSING
    if status == "known_failure":
        if fails:
            hint = None
            if stage and entry.stage and stage != entry.stage:
                hint = f"fails at {stage!r} now; the entry at {where} says {entry.stage!r}: update its stage"
            return {**out, "outcome": "xfailed", "triage": "known", "hint": hint,
                    "reason": entry.reason or f"known failure ({where})"}
        if passes:
            return {**out, "outcome": "xpassed", "triage": "known",
                    "hint": f"passes now: remove the known_failure entry at {where} "
                            "(`casedb triage update --from-run RUN` does)"}
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


# --------------------------------------------------------------------------------------- parsing

def default_paths(root: Path = Path(".")) -> list[Path]:
    """``triage/*.yaml`` (and ``*.yml``) under ``root``, sorted: what a run loads by default."""
    folder = Path(root) / "triage"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def shipped_paths() -> list[Path]:
    """The triage files shipped beside casedb's manifests (``manifests/triage/*.yaml``)."""
    from casedb.store.database import SHIPPED_MANIFESTS

    return default_paths(SHIPPED_MANIFESTS)


def run_paths(given, *, cwd: Path = Path("."), shipped: bool = True) -> list[str]:
    """The triage files a run loads, by absolute path: ``given`` (else ``triage/*.yaml`` under
    ``cwd``), then the shipped ones unless ``shipped`` is off (their entries name the shipped
    models and the backend they fail on, so they apply to nothing else)."""
    paths = [Path(p) for p in given] if given else default_paths(cwd)
    if shipped:
        paths += shipped_paths()
    out: list[str] = []
    for p in paths:
        resolved = str(Path(p).resolve())
        if resolved not in out:
            out.append(resolved)
    return out


class _File:
    """One file's text and document, with the line of each key (for problems and edits)."""

    def __init__(self, path: Path):
        from importers import files, yaml_manifest

        self.path = Path(path)
        try:
            self.text = files.read_text(self.path, MAX_FILE_BYTES)
            self.doc = yaml_manifest.load(self.path, MAX_FILE_BYTES)
        except InputError as e:  # (in the words of a triage file, not of an import)
            message = e.message.replace("; fix the file and import again", "; fix the file").replace(
                "; if it is genuine, raise the limit with casedb import --max-input-mb N", ": split it into several files")
            raise InputError(message, where=e.where) from None
        self.lines = self.text.splitlines()

    def where(self, line: int | None) -> str:
        return f"{self.path}:{line}" if line else str(self.path)

    def key_line(self, start: int | None, key: str, stop: int | None = None) -> int | None:
        """The line (1-based) of ``key:`` in the mapping starting at ``start`` (before ``stop``)."""
        if not start:
            return None
        pat = _key_pattern(str(key))
        end = min(len(self.lines), (stop - 1) if stop else start + 400)
        for i in range(start - 1, end):
            if pat.search(self.lines[i]):
                return i + 1
        return start

    def top_line(self, key: str) -> int | None:
        pat = re.compile(rf"^['\"]?{re.escape(key)}['\"]?\s*:")
        return next((i + 1 for i, line in enumerate(self.lines) if pat.match(line)), None)


@functools.lru_cache(maxsize=64)
def _key_pattern(key: str) -> re.Pattern:
    return re.compile(rf"(?:^|[\s{{,\-])['\"]?{re.escape(key)}['\"]?\s*:(?:\s|$)")


_REGEX_TELL = re.compile(r"[\^$|\\{}]|\(\?")
_SIGNATURE = re.compile(r"[0-9a-f]{4,64}")


def _check_pattern(key: str, value, where: str, problems: list) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        problems.append(Problem(where, f"{key}: takes a name or a wildcard pattern, not {value!r}",
                                "write it in quotes" if isinstance(value, bool) else None))
        return None
    text = str(value)
    if text.startswith(LITERAL):  # the exact value: nothing in it is a pattern
        return text
    exact = f"or write {LITERAL!r} before an exact name that has them"
    if not text.strip():
        problems.append(Problem(where, f"{key}: is empty", "remove the key to select every value"))
        return None
    if text != text.strip():
        problems.append(Problem(where, f"{key}: {text!r} has leading or trailing spaces", f"remove them, {exact}"))
        return None
    if _REGEX_TELL.search(text):
        problems.append(Problem(where, f"{key}: {text!r} looks like a regular expression",
                                f"patterns are shell-style wildcards: * ? [abc]; {exact.removeprefix('or ')}"))
        return None
    if not _brackets_close(text):
        problems.append(Problem(where, f"{key}: {text!r} has an unbalanced [ ]",
                                f"close the bracket, or write [[] for a [ and []] for a ], {exact}"))
        return None
    return text


def _brackets_close(text: str) -> bool:
    """Whether every [ opens a set that a ] closes, as fnmatch reads them ([]] and [!]] hold a ]),
    and no ] stands alone."""
    if "[" not in text and "]" not in text:
        return True
    i = 0
    while i < len(text):
        if text[i] == "]":
            return False
        if text[i] == "[":
            j = i + 1 + (text[i + 1:i + 2] == "!")
            j += text[j:j + 1] == "]"
            j = text.find("]", j)
            if j < 0:
                return False
            i = j
        i += 1
    return True


def _number(key: str, value, where: str, problems: list, *, positive: bool = False,
            most: float = math.inf) -> float | None:
    # YAML 1.1 reads 1e-3 (no dot) as text: accept text that is a number
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0 or (positive and x == 0) or x > most:
        bound = f" and at most {most:g}" if math.isfinite(most) else ""
        problems.append(Problem(where, f"{key}: takes a number {'> 0' if positive else '>= 0'}{bound}, not {value!r}"))
        return None
    return x


def _selectors(m: dict, f: _File, line: int, stop, problems: list, keys) -> dict:
    out = {}
    for k in keys:
        if k not in m or m[k] is None:
            continue
        where = f.where(f.key_line(line, k, stop))
        v = m[k]
        if k == "signature":
            text = str(v).strip().lower() if isinstance(v, str) else ""
            if not _SIGNATURE.fullmatch(text):
                problems.append(Problem(where, f"signature: takes a hex prefix of a case signature (4 to 64 "
                                               f"characters, no wildcards), not {v!r}", "see `casedb cases`"))
                continue
            out[k] = text
        elif k == "marks":
            if isinstance(v, list):
                bad = [x for x in v if not isinstance(x, str) or not marks_mod.is_mark_name(x)]
                if bad or not v:
                    problems.append(Problem(where, f"marks: takes mark names or a marker expression, not {v!r}"))
                    continue
                out[k] = list(v)
            elif isinstance(v, str) and v.strip():
                try:
                    marks_mod.MarkExpression(v)
                except ValueError as e:
                    problems.append(Problem(where, f"marks: {e}"))
                    continue
                out[k] = v.strip()
            else:
                problems.append(Problem(where, f"marks: takes mark names or a marker expression, not {v!r}"))
        elif k == "dtype":
            text = _check_pattern(k, v, where, problems)
            if text is None:
                continue
            if not _WILD.search(text):
                try:
                    text = dtypes.canonical(text)
                except dtypes.UnknownDtype:
                    problems.append(Problem(where, f"dtype: unknown dtype {text!r}",
                                            _did_you_mean(text, dtypes.CANONICAL) or f"one of {', '.join(dtypes.CANONICAL)}"))
                    continue
            out[k] = text
        else:
            text = _check_pattern(k, v, where, problems)
            if text is not None:
                out[k] = text
    return out


def _unknown_keys(m: dict, allowed, f: _File, line, stop, problems: list, what: str) -> None:
    for k in m:
        if k not in allowed:
            problems.append(Problem(f.where(f.key_line(line, k, stop)), f"unknown key {k!r} in {what}",
                                    _did_you_mean(k, allowed) or f"allowed: {', '.join(allowed)}", "unknown_key"))


def _parse(paths, problems: list) -> tuple[list[Entry], list[_RuleSpec], str, list[_File]]:
    entries: list[Entry] = []
    specs: list[_RuleSpec] = []
    unlisted: dict[str, str] = {}
    parsed: list[_File] = []
    order = 0
    for path in paths:
        try:
            f = _File(path)
        except InputError as e:
            problems.append(Problem(e.where or str(path), e.message, None, "syntax"))
            continue
        parsed.append(f)
        doc = f.doc
        if doc is None:
            continue
        if not isinstance(doc, dict):
            problems.append(Problem(f.where(1), "a triage file is a mapping (version, defaults, tolerances, cases)"))
            continue
        _unknown_keys(doc, TOP_KEYS, f, 1, None, problems, "the file")
        if "version" in doc and doc["version"] != VERSION:
            problems.append(Problem(f.where(f.top_line("version")), f"version: {doc['version']!r} is not a triage "
                                                                   f"format this casedb reads", f"write version: {VERSION}"))
        d = doc.get("defaults")
        if d is not None:
            line = f.top_line("defaults")
            if not isinstance(d, dict):
                problems.append(Problem(f.where(line), "defaults: takes a mapping (unlisted: ...)"))
            else:
                _unknown_keys(d, DEFAULT_KEYS, f, line, None, problems, "defaults")
                if "unlisted" in d:
                    if d["unlisted"] not in UNLISTED:
                        problems.append(Problem(f.where(f.key_line(line, "unlisted")),
                                                f"defaults: unlisted: takes {' or '.join(UNLISTED)}, not {d['unlisted']!r}",
                                                _did_you_mean(d["unlisted"], UNLISTED)))
                    else:
                        unlisted[f.where(f.key_line(line, "unlisted"))] = d["unlisted"]
        for section in sorted(("tolerances", "cases"), key=lambda k: f.top_line(k) or 0):  # as written
            items = doc.get(section)
            if items is None:
                continue
            if not isinstance(items, list):
                problems.append(Problem(f.where(f.top_line(section)), f"{section}: takes a list of mappings"))
                continue
            if len(items) > MAX_ITEMS:
                problems.append(Problem(f.where(f.top_line(section)), f"{section}: has {len(items):,} items; a triage "
                                        f"file holds at most {MAX_ITEMS:,}", "split it into several files", "limit"))
                continue
            lines = _item_lines(f, items, f.top_line(section))
            stops = _next_lines(lines)
            for i, m in enumerate(items):
                line = lines[i] or f.top_line(section)
                stop = stops[i]
                if not isinstance(m, dict):
                    problems.append(Problem(f.where(line), f"each item of {section}: is a mapping, not {m!r}"))
                    continue
                order += 1
                if section == "tolerances":
                    spec = _parse_rule(m, f, line, stop, order, problems)
                    if spec is not None:
                        specs.append(spec)
                    continue
                entry = _parse_entry(m, f, line, stop, order, problems)
                if entry is None:
                    continue
                entries.append(entry)
                if entry.rtol is not None or entry.atol is not None:
                    kw = {k: v for k, v in entry.selectors.items() if k in numerics.RULE_KEYS}
                    specs.append(_RuleSpec(numerics.Rule(rtol=entry.rtol, atol=entry.atol, **kw, where=entry.where,
                                                         order=order),
                                           _Pattern(entry.selectors["arch"]) if "arch" in entry.selectors else None,
                                           entry.selectors))
    values = set(unlisted.values())
    if len(values) > 1:
        problems.append(Problem(", ".join(unlisted), f"files disagree on defaults: unlisted ({', '.join(sorted(values))})",
                                "give it in one file", "conflict"))
    return entries, specs, (values.pop() if len(values) == 1 else "unspecified"), parsed


def _item_lines(f: _File, items: list, start: int | None) -> list:
    """The line of each list item: a mapping's own; a scalar's, found after the item before it
    (within 400 lines: a file of unmatched scalars is not searched to its end per item)."""
    out, at = [], start or 1
    for m in items:
        line = getattr(m, "line", None)
        if line is None and not isinstance(m, (dict, list)):
            pat = re.compile(rf"^\s*-\s*['\"]?{re.escape(str(m))}")
            line = next((i + 1 for i in range(at, min(len(f.lines), at + 400)) if pat.match(f.lines[i])), None)
        out.append(line)
        at = line or at
    return out


def _next_lines(lines: list) -> list:
    """For each item, the first known line of an item after it (None: none)."""
    out, after = [None] * len(lines), None
    for i in range(len(lines) - 1, -1, -1):
        out[i] = after
        after = lines[i] or after
    return out


def _parse_rule(m: dict, f: _File, line, stop, order: int, problems: list) -> _RuleSpec | None:
    before = len(problems)
    _unknown_keys(m, RULE_KEYS, f, line, stop, problems, "a tolerance rule")
    sel = _selectors(m, f, line, stop, problems, [k for k in RULE_KEYS if k not in ("rtol", "atol")])
    values = {}
    for k in ("rtol", "atol"):
        if m.get(k) is not None:
            values[k] = _number(k, m[k], f.where(f.key_line(line, k, stop)), problems)
    if not values:
        problems.append(Problem(f.where(line), "a tolerance rule sets rtol, atol or both"))
    if len(problems) > before:
        return None
    kw = {k: v for k, v in sel.items() if k != "arch"}
    return _RuleSpec(numerics.Rule(**values, **kw, where=f.where(line), order=order),
                     _Pattern(sel["arch"]) if "arch" in sel else None, sel)


def _parse_entry(m: dict, f: _File, line, stop, order: int, problems: list) -> Entry | None:
    before = len(problems)
    where = f.where(line)
    _unknown_keys(m, ENTRY_KEYS, f, line, stop, problems, "a case entry")
    sel = _selectors(m, f, line, stop, problems, CASE_KEYS + TARGET_KEYS)
    status = m.get("status")
    misspelt = any(_did_you_mean(k, ENTRY_KEYS) == "did you mean 'status'?" for k in m if k not in ENTRY_KEYS)
    if status is None and not misspelt:  # (a misspelt status is reported as such)
        problems.append(Problem(where, "an entry needs a status", f"one of {', '.join(STATUSES)}; tolerances alone "
                                                                  "go under tolerances:"))
    elif status is not None and status not in STATUSES:
        hint = _STATUS_HINTS.get(str(status).lower())
        problems.append(Problem(f.where(f.key_line(line, "status", stop)), f"status: unknown status {status!r}",
                                f"did you mean {hint!r}?" if hint else
                                (_did_you_mean(status, STATUSES) or f"one of {', '.join(STATUSES)}")))
    stage = m.get("stage")
    if stage is not None and stage not in outcomes.STAGES:
        hint = _STAGE_HINTS.get(str(stage).lower())
        problems.append(Problem(f.where(f.key_line(line, "stage", stop)), f"stage: unknown stage {stage!r}",
                                f"did you mean {hint!r}?" if hint else
                                (_did_you_mean(stage, outcomes.STAGES) or f"one of {', '.join(outcomes.STAGES)}")))
    reason = m.get("reason")
    if reason is not None and not isinstance(reason, str):
        problems.append(Problem(f.where(f.key_line(line, "reason", stop)), "reason: takes text", "write it in quotes"))
    nums = {}
    for k in ("rtol", "atol", "timeout"):
        if m.get(k) is not None:
            nums[k] = _number(k, m[k], f.where(f.key_line(line, k, stop)), problems, positive=k == "timeout",
                              most=MAX_TIMEOUT if k == "timeout" else math.inf)
    if ("rtol" in nums or "atol" in nums) and "marks" in sel:
        problems.append(Problem(where, "rtol/atol on an entry that selects by marks cannot be applied",
                                "select the cases by op, name, model, signature or dtype for a tolerance"))
    if len(problems) > before:
        return None
    return Entry(status=status, where=where, reason=reason, stage=stage, rtol=nums.get("rtol"), atol=nums.get("atol"),
                 timeout=nums.get("timeout"), selectors=sel, order=order, path=str(f.path), line=line or 0,
                 written=dict(m))


def load(paths) -> Triage:
    """The triage of these files (in this order); InputError at the first problem, naming its
    file:line (``casedb triage check`` lists them all). Stale entries and conflicts need the DB:
    :func:`check`."""
    paths = [Path(p) for p in paths]
    problems: list[Problem] = []
    entries, specs, unlisted, _ = _parse(paths, problems)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more: run `casedb triage check`)" if len(problems) > 1 else ""
        raise InputError(first.message + (f" — {first.suggestion}" if first.suggestion else "") + more,
                         where=first.where)
    return Triage(entries, specs, unlisted, paths)


# ---------------------------------------------------------------------------------------- the DB

class _Reading:
    """``with _Reading(store) as db``: something with ``execute`` for a Store, a sqlite-utils
    Database, a connection, or a path (opened here, closed after; never created)."""

    def __init__(self, store):
        self.store, self.conn = store, None

    def __enter__(self):
        store = self.store
        if hasattr(store, "db") and hasattr(store.db, "execute"):
            return store.db
        if hasattr(store, "execute"):
            return store
        path = Path(store)
        if not path.is_file():
            raise NotFound(f"no database at {path}")
        # read-write but only read: a read-only connection leaves a WAL database's -wal/-shm behind
        self.conn = sqlite3.connect(path.resolve().as_uri() + "?mode=rw", uri=True)
        try:
            schema_check.check(self.conn, str(path))  # its views and triggers may be anyone's
        except BaseException:
            self.conn.close()
            raise
        return self.conn

    def __exit__(self, *exc):
        if self.conn is not None:
            self.conn.close()


def _marks(*texts) -> list[str]:
    import json

    out: set = set()
    for t in texts:
        out |= set(json.loads(t) if t else ())
    return sorted(out)


_OCC_SQL = """SELECT mc.id, mc.model, mc.name, c.op, mc.signature, c.dtype, c.marks, mc.marks
              FROM model_cases mc JOIN cases c ON c.signature = mc.signature
              WHERE mc.retired_at IS NULL ORDER BY mc.model, mc.position, mc.id"""


def occurrences(store) -> list[dict]:
    """Every case occurrence the DB plans (not retired), as triage matches them."""
    with _Reading(store) as db:
        rows = db.execute(_OCC_SQL).fetchall()
    return [{"model_case_id": i, "model": m, "name": n, "op": op, "signature": s, "dtype": d, "marks": _marks(cm, om)}
            for i, m, n, op, s, d, cm, om in rows]


# ---------------------------------------------------------------------------------------- checks

def check(paths, store=None) -> list[Problem]:
    """Every problem of these files: syntax, unknown keys, bad values and patterns, and with a
    DB (``store``: a Store, a database, a connection or a path), stale entries (selecting no case)
    and entries that tie and disagree. Empty when the files are fine. Reads the DB only. A file
    past a bound on what the check may spend (:data:`WILDCARD_MATCHES` ...) gets a ``limit``
    problem, and the check stops there."""
    paths = [Path(p) for p in paths]
    problems: list[Problem] = []
    entries, specs, _, _ = _parse(paths, problems)
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
        self.norms = [_case_norms(o) for o in occ]
        self.index: dict = {k: {} for k in self.KEYS}
        for i, n in enumerate(self.norms):
            for k, by in self.index.items():
                by.setdefault(n[k], []).append(i)
        self.every = frozenset(range(len(occ)))
        self._kept: dict = {}
        self._selects: dict = {}   # case_key -> whether it selects any case (every answer: small)

    def _by_key(self, e: Entry) -> tuple[list | frozenset, bool]:
        """Cases the entry's most telling key selects, and whether that key is all it says."""
        pats = [(k, e._patterns[k]) for k in self.KEYS if k in e._patterns]
        pats.sort(key=lambda kp: not kp[1].exact)
        only = len(pats) == 1 and e._signature is None and e._marks is None
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
            found = frozenset(cand if only else (i for i in cand if e.matches_case(self.occ[i], self.norms[i])))
            if len(self._kept) >= self.KEEP:
                del self._kept[next(iter(self._kept))]
            self._kept[e.case_key] = found
            self._selects[e.case_key] = bool(found)
        return found

    def selects_any(self, e: Entry) -> bool:
        if e.case_key not in self._selects:
            cand, only = self._by_key(e)
            self._selects[e.case_key] = bool(cand) if only else any(
                e.matches_case(self.occ[i], self.norms[i]) for i in cand)
        return self._selects[e.case_key]


# Stale entries beyond these get no did-you-mean (each compares a name with every name in the DB).
_STALE_HINTS = 50


def _stale(entries: list[Entry], specs: list[_RuleSpec], cases: _Cases, out: list[Problem]) -> None:
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
                               hint(e.selectors, e._patterns), "stale"))
    for s in specs:
        sel = {k: v for k, v in s.selectors.items() if k in ("model", "name", "op", "signature")}
        if not sel:
            continue
        probe = Entry(status="unspecified", where=s.rule.where, selectors=sel)
        if not cases.selects_any(probe):
            out.append(Problem(s.rule.where, f"stale: the tolerance rule selects no case in the DB ({_selection(sel)})",
                               hint(sel, probe._patterns), "stale"))


def _selection(sel: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sel.items() if k in CASE_KEYS) or "every case"


def _stale_hint(sel, patterns, occ, models, ops) -> str:
    p = patterns.get("model")
    if p is not None and not any(p.matches(_norm("model", m)) for m in models):
        return _did_you_mean(sel["model"], models) or f"models in the DB: {', '.join(models[:12])}"
    p = patterns.get("op")
    if p is not None and not any(p.matches(op.lower()) for op in ops):
        return _did_you_mean(sel["op"], ops) or "no op matches: see `casedb cases`"
    p = patterns.get("name")
    if p is not None:
        pm = patterns.get("model")
        names = sorted({o["name"] for o in occ if pm is None or pm.matches(_norm("model", o["model"]))})
        if not any(p.matches(n.lower()) for n in names):
            return _did_you_mean(sel["name"], names) or "no case of that name: see `casedb cases`"
    return "remove it, or fix its selectors (see `casedb cases`)"


def _overlap(a: Entry, b: Entry) -> bool:
    """Whether two entries can select a same case on a same target (patterns: assumed yes)."""
    for k in ("model", "name", "op", "dtype") + TARGET_KEYS:
        pa, pb = a._patterns.get(k), b._patterns.get(k)
        if pa is None or pb is None:
            continue
        if pa.exact and pb.exact and pa.norm != pb.norm:
            return False
        if pa.exact != pb.exact and not (pb if pa.exact else pa).matches((pa if pa.exact else pb).norm):
            return False
    sa, sb = a._signature, b._signature
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
        key = (e.rank(), tuple(e._patterns[k].norm if k in e._patterns and e._patterns[k].exact else "*"
                               for k in ("name", "op", "model")), e._signature or "")
        groups.setdefault(key, []).append(e)
    for group in groups.values():
        if len(group) > 1:
            _ties(group, cases, budget, out)


def _target_key(e: Entry) -> tuple:
    return tuple(e._patterns[k].text.lower() if k in e._patterns else None for k in ("dtype",) + TARGET_KEYS)


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


# -------------------------------------------------------------------------------------- promotion

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

    def to_dict(self) -> dict:
        return {"path": str(self.path), "run_id": self.run_id, "target": self.target, "added": self.added,
                "promoted": self.promoted, "removed": self.removed, "rewritten": self.rewritten,
                "kept": [{"where": w, "why": y} for w, y in self.kept],
                "regressions": [{"case": c, "where": w} for c, w in self.regressions]}

    @property
    def changed(self) -> bool:
        return bool(self.added or self.promoted or self.removed or self.rewritten)


_RUN_ROWS = """SELECT j.model_case_id, j.model, mc.name, c.op, j.signature, c.dtype, c.marks, mc.marks, j.outcome,
                      coalesce(j.stage, r.stage), r.error_type, r.error_message, j.reason, r.max_abs_err, j.rtol, j.atol,
                      r.tolerance
               FROM judgements j LEFT JOIN results r ON r.id = j.result_id
               LEFT JOIN model_cases mc ON mc.id = j.model_case_id LEFT JOIN cases c ON c.signature = j.signature
               WHERE j.run_id = ? ORDER BY j.model, mc.name"""
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failure|Failed|Interrupt|Exit)\b\s*:")
_ADDRESS = re.compile(r" (object )?at 0x[0-9a-f]+")


def first_error_line(error_type: str | None, message: str | None, reason: str | None) -> str:
    """The line of an error that says what went wrong (a triage entry's reason, a report's table row)."""
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].endswith(" raised:"):
        line = lines[1]  # dynamo's "backend='inductor' raised:" says nothing; the next line does
    else:
        line = next((ln for ln in lines if _ERROR_LINE.match(ln)), None)
    if line is None and lines:
        short = (error_type or "").rsplit(".", 1)[-1]
        line = f"{short}: {lines[0]}" if short and not lines[0].startswith(short) else lines[0]
    if line is None:
        line = next((ln.strip() for ln in (reason or "").split(" | ") if ln.strip()), "") or "failed"
    line = _ADDRESS.sub("", line)
    return line if len(line) <= 160 else line[:157] + "..."


def _run_target(db, run_id: int) -> dict:
    import json

    row = db.execute("SELECT device, backend, selection FROM runs WHERE id = ?", [run_id]).fetchone()
    if row is None:
        last = db.execute("SELECT max(id) FROM runs").fetchone()[0]
        raise NotFound(f"no run {run_id}" + (f" (the last run is {last})" if last else " (no runs recorded yet)"))
    selection = json.loads(row[2]) if row[2] else {}
    options = selection.get("options") or {}
    return {"device": row[0], "backend": row[1], "arch": options.get("arch") or selection.get("arch")}


def propose(store, run_id: int, path, *, others=(), scope=("device",)) -> Proposal:
    """The edit of triage file ``path`` that run ``run_id`` calls for (``others``: further triage
    files whose entries count but are not edited). Reads the DB only.

    * A case with no entry (or ``unspecified``) that failed (failed, error, crashed, timeout) gets
      a ``known_failure`` entry naming it (``model`` + ``name``), with the run's ``stage`` and the
      first line of its error as ``reason``, scoped to the run's target keys in ``scope``
      (default: the device; ``()``: every target). An incorrect result gets a comment with its
      error and tolerance: casedb never loosens a tolerance itself.
    * A known_failure entry of ``path`` whose every case (in the DB, on this target) ran in this
      run and passed is removed — or, when it carries rtol/atol/timeout, becomes expected_pass,
      keeping them (dropping it could fail the case).
    * Cases then unspecified that passed are promoted to expected_pass: one entry per op when
      every case that entry would govern ran in this run and passed, else one per model and op,
      else one per case. (An entry with ``status: unspecified`` keeps its cases out of updates.)
    * An expected_pass case that failed is a regression: listed, never edited.

    The file is edited as text: entries not changed, comments and order stay byte for byte;
    new entries are appended to ``cases:`` under a comment naming the run.
    """
    with _Reading(store) as db:
        target = _run_target(db, run_id)
        found = db.execute(_RUN_ROWS, [run_id]).fetchall()
        every = occurrences(db)
    path = Path(path)
    files = ([path] if path.exists() else []) + [Path(p) for p in others if Path(p) != path]
    triage = load(files)
    mine = [e for e in triage.entries if Path(e.path) == path]
    # every value written is a literal selector: a name `*` selects that case, not every case
    scoped = {k: literal(target[k]) for k in scope if target.get(k)}
    clashes = _name_clashes(every)
    rows = []
    for (mcid, model, name, op, sig, dtype, cmarks, omarks, outcome, stage, etype, emsg, reason, err, rtol, atol,
         tol) in found:
        if name is None:
            continue
        rows.append({"model_case_id": mcid, "model": model, "name": name, "op": op, "signature": sig, "dtype": dtype,
                     "marks": _marks(cmarks, omarks), "outcome": outcome, "stage": stage, "error_type": etype,
                     "error_message": emsg, "reason": reason, "max_abs_err": err, "rtol": rtol, "atol": atol,
                     "tolerance": tol})
    ran = {r["model_case_id"]: r for r in rows}
    prop = Proposal(path=path, run_id=run_id, target=target, text="")
    governs = {}
    for o in every:
        e = triage.entry_for(o, target)
        if e is not None:
            governs.setdefault(e, []).append(o)
    # 1. known failures that pass
    drop, rewrite = set(), set()
    for e in mine:
        cases = governs.get(e, [])
        if e.status != "known_failure" or not cases:
            continue
        judged = [ran[o["model_case_id"]] for o in cases if o["model_case_id"] in ran]
        passing = [r for r in judged if r["outcome"] in PASSING]
        if not passing:
            continue
        if len(passing) < len(cases):
            why = (f"{len(passing)} of its {len(cases)} cases pass in run {run_id}"
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
    remaining = [e for e in triage.entries if e not in drop and e not in rewrite]
    # 2. new failures (and regressions, reported only)
    order = max((e.order for e in triage.entries), default=0)
    new_entries: list[tuple[dict, str | None]] = []
    current = Triage(remaining + [_as_expected(e) for e in rewrite], [], triage.unlisted)
    for r in rows:
        e = current.entry_for(r, target)
        status = e.status if e is not None else ("expected_pass" if triage.unlisted == "expected_pass" else "unspecified")
        if r["outcome"] not in FAILING:
            continue
        if status == "expected_pass":
            prop.regressions.append((f"{r['model']}::{r['name']}", e.where if e else "defaults: unlisted"))
            continue
        if status != "unspecified" or e is not None:  # an explicit `unspecified` keeps its cases out
            continue
        entry, note = _failure_entry(r, scoped, clashes)
        new_entries.append((entry, note))
        prop.added.append(entry)
    # 3. promotions: cases unspecified after 1 and 2 that passed
    added = [Entry(status="known_failure", where="(new)", selectors={k: v for k, v in d.items() if k in ENTRY_KEYS
                                                                     and k not in SETTING_KEYS}, order=order + 1 + i)
             for i, (d, _) in enumerate(new_entries)]
    current = Triage(current.entries + added, [], triage.unlisted)
    promote: dict[str, list[dict]] = {}
    for r in rows:
        if r["outcome"] not in PASSING:  # (xpassed: a run with triage stores a known failure's pass so)
            continue
        e = current.entry_for(r, target)
        if e is None and triage.unlisted == "unspecified":
            promote.setdefault(r["op"], []).append(r)
    next_order = order + len(added) + 1
    for op in sorted(promote):
        chosen = []
        for candidate in ([{"op": literal(op)}],
                          [{"model": literal(m), "op": literal(op)} for m in sorted({r["model"] for r in promote[op]})]):
            ok = True
            for sel in candidate:
                c = Entry(status="expected_pass", where="(new)", selectors={**sel, **scoped}, order=next_order)
                trial = Triage(current.entries + [c], [], triage.unlisted)
                for o in every:
                    if c.matches(o, target) and trial.entry_for(o, target) is c:
                        r = ran.get(o["model_case_id"])
                        if r is None or r["outcome"] not in PASSING:
                            ok = False
                            break
                if not ok:
                    break
            if ok:
                chosen = candidate
                break
        if not chosen:
            chosen = [_case_selector(r, clashes) for r in promote[op]]
        for sel in chosen:
            c = Entry(status="expected_pass", where="(new)", selectors={**sel, **scoped}, order=next_order)
            next_order += 1
            current = Triage(current.entries + [c], [], triage.unlisted)
            d = {**sel, **scoped, "status": "expected_pass"}
            new_entries.append((d, None))
            prop.promoted.append(d)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    prop.text = _edit(text, mine, drop, rewrite, new_entries, run_id, target)
    return prop


def _name_clashes(occ: list[dict]) -> set:
    """(model, name) keys that more than one case has (names match ignoring case)."""
    seen: set = set()
    clashes = set()
    for o in occ:
        key = (_norm("model", o["model"]), _norm("name", o["name"]))
        (clashes if key in seen else seen).add(key)
    return clashes


def _case_selector(r: dict, clashes: set) -> dict:
    """Selectors of exactly the case of row ``r``: its model and name as literals, and its
    signature where another case of the model has the same name but for case."""
    sel = {"model": literal(r["model"]), "name": literal(r["name"])}
    sig = str(r.get("signature") or "")
    if (_norm("model", r["model"]), _norm("name", r["name"])) in clashes and _SIGNATURE.fullmatch(sig):
        sel["signature"] = sig
    return sel


def _failure_entry(r: dict, scoped: dict, clashes: set) -> tuple[dict, str | None]:
    """The known_failure entry for row ``r`` (a case that failed and no entry covers) and the
    comment above it: the run's stage where casedb knows it, the error's first line as reason."""
    stage = r["stage"] or _OUTCOME_STAGE.get(r["outcome"])
    notes = []
    if stage not in outcomes.STAGES:
        notes.append(f"the run recorded the stage {stage!r}, which casedb does not know: left out.")
        stage = None
    entry = {**_case_selector(r, clashes), **scoped, "status": "known_failure", "stage": stage,
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


def update_from_run(store_or_conn, run_id: int, path, output=None, *, others=(), scope=("device",)) -> str:
    """The text of triage file ``path`` updated from run ``run_id`` (see :func:`propose`); written
    to ``output`` when given (``path`` itself to edit it in place)."""
    prop = propose(store_or_conn, run_id, path, others=others, scope=scope)
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(prop.text, encoding="utf-8")
    return prop.text


# ------------------------------------------------------------------------------- editing as text

_ENTRY_ORDER = CASE_KEYS + TARGET_KEYS + ("status", "stage", "reason", "rtol", "atol", "timeout")


def emit_entry(entry: dict, indent: int) -> list[str]:
    """Block-style lines of one list item, its dash at column ``indent``."""
    pad = " " * indent
    keys = [k for k in _ENTRY_ORDER if entry.get(k) is not None] + [k for k in entry if k not in _ENTRY_ORDER]
    out = []
    for i, k in enumerate(keys):
        v = entry[k]
        text = ("[" + ", ".join(scalar(x) for x in v) + "]") if isinstance(v, list) else scalar(v)
        out.append(f"{pad}{'- ' if i == 0 else '  '}{k}: {text}\n")
    return out


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _blank(line: str) -> bool:
    return not line.strip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _blocks(lines: list[str], entries: list[Entry]) -> tuple[dict, int | None, int]:
    """Per entry: (first line of its leading comments, its dash line, its last line), 0-based;
    the line after which new entries go; their dash column."""
    starts = []
    for e in sorted(entries, key=lambda e: e.line):
        i = e.line - 1
        while i > 0 and not lines[i].lstrip().startswith("-"):
            i -= 1
        starts.append((e, i, lines[i].index("-")))
    blocks = {}
    for n, (e, dash, col) in enumerate(starts):
        if n + 1 < len(starts):
            end = starts[n + 1][1] - 1
        else:
            end = dash
            for j in range(dash + 1, len(lines)):
                ln = lines[j]
                if _blank(ln) or _is_comment(ln):
                    continue
                if _indent(ln) < col or (_indent(ln) == col and not ln.lstrip().startswith("-")):
                    break
                end = j
            else:
                end = len(lines) - 1
        while end > dash and (_blank(lines[end]) or (_is_comment(lines[end]) and _indent(lines[end]) <= col)):
            end -= 1
        lead = dash
        while lead > 0 and _is_comment(lines[lead - 1]) and _indent(lines[lead - 1]) <= col:
            lead -= 1
        blocks[e] = (lead, dash, end)
    if not starts:
        return blocks, None, 2
    last = max(blocks.values(), key=lambda b: b[1])
    return blocks, last[2], starts[-1][2]


def _edit(text: str, mine: list[Entry], drop: set, rewrite: set, new_entries: list, run_id: int,
          target: dict) -> str:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    head = next((ln for ln in lines if re.match(r"cases\s*:", ln)), "")
    if head.partition(":")[2].split("#")[0].strip() not in ("", "[]"):
        raise InputError("triage update edits a block list of cases (`  - op: ...` items); write `cases:` as one",
                         where=f"{mine[0].path if mine else 'the file'}:{lines.index(head) + 1}")
    blocks, after, col = _blocks(lines, mine)
    inserts: list[str] = []
    if new_entries:
        failures = sum(1 for d, _ in new_entries if d["status"] == "known_failure")
        head = (f"casedb triage update --from-run {run_id} ({target['device']}/{target['backend']}"
                f"{', arch ' + target['arch'] if target.get('arch') else ''}): {failures} new failure(s), "
                f"{len(new_entries) - failures} promoted to expected_pass")
        inserts += emit_comment(head, col)
        for d, note in new_entries:
            if note:
                inserts += emit_comment(note, col)
            inserts += emit_entry(d, col)
    if inserts:
        if after is None:
            at = next((i for i, ln in enumerate(lines) if re.match(r"cases\s*:", ln)), None)
            if at is None:
                if not lines:
                    lines = [f"version: {VERSION}\n"]
                lines.append("cases:\n")
                after = len(lines) - 1
            else:
                lines[at] = "cases:\n"  # `cases:` or `cases: []`
                after = at
        lines[after + 1:after + 1] = inserts
    for e in sorted(drop | rewrite, key=lambda e: -blocks[e][1]):
        lead, dash, end = blocks[e]
        if e in rewrite:
            new = {k: v for k, v in e.written.items() if k not in ("reason", "stage")}
            new.update(status="expected_pass", **{k: getattr(e, k) for k in ("rtol", "atol", "timeout")
                                                  if getattr(e, k) is not None})
            was = f"was known_failure{': ' + e.reason if e.reason else ''}"
            lines[dash:end + 1] = emit_comment(f"passes on run {run_id} ({was}); its tolerance and timeout are kept",
                                               _indent(lines[dash])) + emit_entry(new, lines[dash].index("-"))
        else:
            del lines[lead:end + 1]
            # the blank line that separated it goes too (one, where two would now meet)
            if lead < len(lines) and _blank(lines[lead]) and (
                    lead == 0 or _blank(lines[lead - 1]) or lines[lead - 1].rstrip().endswith(":")):
                del lines[lead]
    return "".join(lines)


# -------------------------------------------------------------------------------- the RFC's files

_SKIP_PATH = re.compile(r"^(?:.*/)?models/(?P<model>[^/]+)(?:/(?:test_(?P<case>.+?)\.py)?)?/?$")
_MODES = {"mandatory_success": "expected_pass", "xfail": "known_failure", "xfail_strict": "known_failure",
          "skip": "not_supported"}


def import_rfc(paths, *, scope: dict | None = None) -> str:
    """Triage YAML (text, with comments naming each source line) from the RFC implementation's
    files. ``scope``: target keys (device, backend, arch) put on every entry and rule.

    * ``skip_files.yaml``: ``skip:`` and ``xfail:``, each a list of test files or a mapping of
      reason (the category) to a list of test files. A file ``models/<model>/test_<case>.py``
      (wildcards allowed) becomes ``{model, name: <case>}``; ``models/<model>/`` the whole model.
      skip → not_supported, xfail → known_failure, the category as reason.
    * the test-suite config (``test_suite_config:``): a test with ``model__<model>`` tags becomes
      ``{model}`` with its ``mode`` (mandatory_success → expected_pass, xfail/xfail_strict →
      known_failure, skip → not_supported); its ``edits.ops.exclude`` (cases by ``name``/``op``
      or ops by name) and ``edits.dtypes.exclude`` → exclude; a file's ``unlisted_test_mode`` →
      ``defaults: unlisted: expected_pass`` (mandatory_success) or an entry for every case
      (xfail → known_failure, skip → not_supported); ``global.supported_dtypes[].precision`` and
      ``global.supported_ops[].dtypes[].precision`` → tolerance rules (per dtype, per op and
      dtype); ``supported_ops[].force_xfail`` → known_failure for the op. Tests without a model
      tag (upstream PyTorch tests) are listed as not imported. Op names without a dot are
      ``torch.<name>``.

    Every value is checked before it is written: a section that is not the mapping or list it
    should be, a name or mode that is not text or holds a control character, a precision that is
    not a number >= 0 is refused (InputError naming file:line); file paths in comments are written
    with their control characters escaped.
    """
    scope = {k: v for k, v in (scope or {}).items() if v}
    cases: list[tuple[dict, str]] = []
    rules: list[tuple[dict, str]] = []
    notes: list[str] = []
    unlisted = None
    sources = []
    for path in paths:
        path = Path(path)
        sources.append(str(path))
        f = _File(path)
        doc = f.doc
        if isinstance(doc, dict) and "test_suite_config" in doc:
            unlisted = _import_config(doc["test_suite_config"], f, cases, rules, notes, unlisted)
        elif isinstance(doc, dict) and set(doc) & {"skip", "xfail"} and set(doc) <= {"skip", "xfail"}:
            _import_skip_files(doc, f, cases, notes)
        else:
            raise InputError("not a file of the RFC implementation: expected skip_files.yaml (skip:, xfail:) or a "
                             "test-suite config (test_suite_config:)", where=str(path))
    out = _comment(f"Imported by `casedb triage import` from {', '.join(sources)}.", 0) + [
        "# Review it (`casedb triage check`) before committing: see casedb/triage/entries.py for the mapping.\n",
        f"version: {VERSION}\n"]
    if unlisted and unlisted[0] == "expected_pass":
        out += _comment(unlisted[1], 0) + ["defaults:\n", "  unlisted: expected_pass\n"]
    if rules:
        out.append("tolerances:\n")
        for d, src in rules:
            out += _comment(src, 2) + emit_entry({**d, **scope}, 2)
    out.append("cases:\n" if cases or (unlisted and unlisted[0] != "expected_pass") else "cases: []\n")
    if unlisted and unlisted[0] != "expected_pass":
        out += _comment(unlisted[1], 2) + emit_entry({**scope, "status": unlisted[0], "reason": unlisted[1]}, 2)
    seen = set()
    for d, src in cases:
        key = tuple(sorted((k, str(v)) for k, v in d.items()))
        if key in seen:
            continue
        seen.add(key)
        sel = {k: v for k, v in d.items() if k not in SETTING_KEYS}
        out += _comment(src, 2) + emit_entry({**sel, **scope, **{k: v for k, v in d.items() if k in SETTING_KEYS}}, 2)
    if notes:
        out.append("# Not imported:\n")
        out += _comment("\n".join(notes), 0)
    return "".join(out)


def _comment(text: str, indent: int) -> list[str]:
    """Comment lines of text that names files and values from elsewhere (control characters
    escaped: YAML refuses them even in a comment)."""
    from casedb.run.console import clean

    return emit_comment(clean(text), indent)


def _line(obj, parent=None) -> int | None:
    return getattr(obj, "line", None) or getattr(parent, "line", None)


def _rfc(value, kind: type, what: str, f: _File, line: int | None):
    """``value`` checked to be a ``kind`` (dict, list or str: text without control characters);
    None is an empty one (no text). InputError naming file:line otherwise."""
    if value is None and kind is not str:
        return kind()
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, kind):
        shown = {dict: "a mapping", list: "a list", str: "text"}[kind]
        raise InputError(f"{what}: takes {shown}, not {str(value)[:60]!r}", where=f.where(line))
    if kind is str:
        from casedb.run.console import clean

        if clean(value) != value or any(c in value for c in "\n\u2028\u2029"):
            raise InputError(f"{what}: {clean(value)[:80]!r} holds a control character or line break; a name is "
                             "one line of text", where=f.where(line))
    return value


def _import_skip_files(doc: dict, f: _File, cases: list, notes: list) -> None:
    for kind in ("skip", "xfail"):
        section = doc.get(kind)
        if section is None:
            continue
        status = "not_supported" if kind == "skip" else "known_failure"
        if isinstance(section, list):
            groups = [(f"listed under {kind} in {f.path.name}", section, f.top_line(kind))]
        elif isinstance(section, dict):
            groups = [(_rfc(reason, str, f"{kind}: a reason", f, f.top_line(kind)), paths,
                       f.key_line(f.top_line(kind), reason)) for reason, paths in section.items()]
        else:
            raise InputError(f"{kind}: takes a list of test files or a mapping of reason to test files",
                             where=f.where(f.top_line(kind)))
        for reason, paths, line in groups:
            for p in _rfc(paths, list, f"{kind}: {reason}: the test files", f, line):
                p = _rfc(p, str, f"{kind}: {reason}: a test file", f, line)
                m = _SKIP_PATH.match(p.strip())
                if not m:
                    notes.append(f"{f.where(line)}: {p} (not models/<model>/test_<case>.py)")
                    continue
                sel = {"model": m["model"]}
                if m["case"]:
                    sel["name"] = m["case"]
                cases.append(({**sel, "status": status, "reason": reason}, f"{f.where(line)}: {kind}: {p}"))


def _op_name(name: str) -> str:
    return name if "." in name else f"torch.{name}"


def _import_config(cfg, f: _File, cases: list, rules: list, notes: list, unlisted):
    cfg = _rfc(cfg, dict, "test_suite_config", f, _line(cfg))
    glob = _rfc(cfg.get("global"), dict, "global", f, _line(cfg.get("global"), cfg))
    _import_global(glob, f, cases, rules, notes)
    for entry in _rfc(cfg.get("files"), list, "files", f, _line(cfg.get("files"), cfg)):
        entry = _rfc(entry, dict, "files: an entry", f, _line(entry, cfg))
        mode = _rfc(entry.get("unlisted_test_mode", "skip"), str, "unlisted_test_mode", f, _line(entry))
        if mode not in _MODES:
            raise InputError(f"unlisted_test_mode: unknown mode {mode!r}", where=f.where(entry.line))
        src = f"unlisted_test_mode: {mode} ({f.where(f.key_line(entry.line, 'unlisted_test_mode'))})"
        if unlisted is None:
            unlisted = (_MODES[mode], src)
        elif unlisted[0] != _MODES[mode]:
            notes.append(f"{src}: differs from the first file's ({unlisted[1]})")
        for test in _rfc(entry.get("tests"), list, "tests", f, _line(entry.get("tests"), entry)):
            _import_test(_rfc(test, dict, "tests: an entry", f, _line(test, entry)), f, cases, notes)
    return unlisted


def _import_global(glob: dict, f: _File, cases: list, rules: list, notes: list) -> None:
    for d in _rfc(glob.get("supported_dtypes"), list, "supported_dtypes", f, _line(glob)):
        d = _rfc(d, dict, "supported_dtypes: an entry", f, _line(d, glob))
        if d.get("precision"):
            _rule(rules, notes, f, d, {"dtype": d.get("name")}, d["precision"], "global.supported_dtypes")
    for op in _rfc(glob.get("supported_ops"), list, "supported_ops", f, _line(glob)):
        op = _rfc(op, dict, "supported_ops: an entry", f, _line(op, glob))
        name = _op_name(_rfc(op.get("name"), str, "supported_ops: name", f, _line(op)))
        for d in _rfc(op.get("dtypes"), list, f"supported_ops: {name}: dtypes", f, _line(op)):
            d = _rfc(d, dict, f"supported_ops: {name}: a dtype", f, _line(d, op))
            if d.get("precision"):
                _rule(rules, notes, f, d, {"op": name, "dtype": d.get("name")}, d["precision"], "global.supported_ops")
        if op.get("force_xfail"):
            cases.append(({"op": name, "status": "known_failure", "reason": f"force_xfail in {f.path.name}"},
                          f"{f.where(op.line)}: supported_ops: force_xfail"))


def _import_test(test: dict, f: _File, cases: list, notes: list) -> None:
    """One test of a file's ``tests:``: an entry per ``model__`` tag, and its edits."""
    tags = [_rfc(t, str, "tags: a tag", f, test.line) for t in _rfc(test.get("tags"), list, "tags", f, test.line)]
    models = [t[len("model__"):] for t in tags if t.startswith("model__")]
    names = ", ".join(_rfc(n, str, "names: a name", f, test.line)
                      for n in _rfc(test.get("names"), list, "names", f, test.line))
    if not models:
        notes.append(f"{f.where(test.line)}: {names} (an upstream test: no model__ tag)")
        return
    mode = _rfc(test.get("mode", "mandatory_success"), str, "mode", f, test.line)
    if mode not in _MODES:
        raise InputError(f"mode: unknown mode {mode!r}", where=f.where(test.line))
    edits = _rfc(test.get("edits"), dict, "edits", f, test.line)
    ops = _rfc(_rfc(edits.get("ops"), dict, "edits: ops", f, test.line).get("exclude"), list, "ops: exclude", f,
               test.line)
    dts = _rfc(_rfc(edits.get("dtypes"), dict, "edits: dtypes", f, test.line).get("exclude"), list,
               "dtypes: exclude", f, test.line)
    for model in models:
        cases.append(({"model": model, "status": _MODES[mode], "reason": f"mode: {mode} ({names})"},
                      f"{f.where(test.line)}: {names}: mode {mode}"))
        for item in ops:
            item = _rfc(item, dict, "ops: exclude: an entry", f, _line(item, test))
            name = _rfc(item.get("name"), str, "ops: exclude: name", f, _line(item, test))
            sel = {"model": model, "name": name} if item.get("op") else {"model": model, "op": _op_name(name)}
            cases.append(({**sel, "status": "exclude", "reason": _reason(item, "edits.ops.exclude", f, test)},
                          f"{f.where(_line(item, test))}: edits.ops.exclude"))
        for item in dts:
            name = _rfc(item, dict, "dtypes: exclude: an entry", f, _line(item, test)).get("name")
            try:
                dt = dtypes.canonical(name)
            except (dtypes.UnknownDtype, TypeError):
                notes.append(f"{f.where(_line(item, test))}: dtype {name!r} (unknown to casedb)")
                continue
            cases.append(({"model": model, "dtype": dt, "status": "exclude",
                           "reason": _reason(item, "edits.dtypes.exclude", f, test)},
                          f"{f.where(_line(item, test))}: edits.dtypes.exclude"))


def _reason(item: dict, default: str, f: _File, parent) -> str:
    text = item.get("description")
    return default if text is None else _rfc(text, str, "description", f, _line(item, parent))


def _rule(rules: list, notes: list, f: _File, d, sel: dict, prec, what: str) -> None:
    where = f.where(_line(d))
    try:
        sel["dtype"] = dtypes.canonical(sel["dtype"])
    except (dtypes.UnknownDtype, TypeError):
        notes.append(f"{where}: {what}: dtype {sel['dtype']!r} (unknown to casedb)")
        return
    prec = _rfc(prec, dict, "precision", f, _line(d))
    values, problems = {}, []
    for k in ("rtol", "atol"):
        if prec.get(k) is not None:
            values[k] = _number(f"precision: {k}", prec[k], where, problems)
    if problems:
        raise InputError(problems[0].message, where=where)
    if values:
        rules.append(({**sel, **values}, f"{where}: {what}"))
