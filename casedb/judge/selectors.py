"""Selectors: which cases and targets a tolerance rule or a triage entry applies to, and how
specific it is. The one engine behind :class:`casedb.judge.numerics.Rule` and
:class:`casedb.triage.entries.Entry`.

A selector is a mapping of keys to values. Case keys: ``model``, ``name`` (the case's name in its
model), ``op``, ``signature`` (a hex prefix), ``dtype`` and ``marks`` (a list of marks the case
has, or a marker expression); target keys: ``device``, ``backend``, ``arch``. Every value but
``signature`` and ``marks`` is a shell-style wildcard (``*``, ``?``, ``[abc]``; ``[[]`` and
``[]]`` for a bracket), matched case-insensitively (model names as everywhere: ``gpt_oss`` =
``gpt-oss``). A value that starts with ``=`` is a literal: exactly the name after it, whatever
it holds (``"=*"`` selects the name ``*``; ``"="`` the empty name).

**Specificity** (:attr:`Selector.rank`; the caller adds its own tie-break, the later one wins):

1. what it says about the case: ``signature``, then ``name``, then ``op``, then ``model``; for
   each, an exact value beats a wildcard, which beats nothing (``*`` counts as nothing);
2. the target: ``arch``, then ``device`` and ``backend`` together;
3. ``dtype``, then ``marks`` (the number of marks listed; an expression counts one).
"""

from __future__ import annotations

import fnmatch
import functools
import re

from casedb import names
from casedb.cases import marks as marks_mod

IN_REPRO = False  # not copied into repro scripts (casedb.read.repro reads every judge module's)

LITERAL = "="  # a value starting with it is the exact value that follows, wildcards and all
WILD = re.compile(r"[*?[]")
# What makes a value look like a regular expression (refused by the triage check; written as a literal)
REGEX_TELL = re.compile(r"[\^$|\\{}]|\(\?")
SIGNATURE = re.compile(r"[0-9a-f]{4,64}")  # a signature selector: a hex prefix of a case signature
CASE_KEYS = ("model", "name", "op", "signature", "dtype", "marks")
TARGET_KEYS = ("device", "backend", "arch")
# The case keys in the order they count for specificity.
RANKED_CASE_KEYS = ("signature", "name", "op", "model")
_PATTERN_KEYS = ("model", "name", "op", "dtype") + TARGET_KEYS


def literal(value) -> str:
    """The selector value that selects exactly ``value`` (a name, op, model or target from a DB):
    ``value`` itself when it holds nothing a pattern reads or the check questions, else
    ``=`` + ``value`` (``*`` -> ``=*``)."""
    text = str(value)
    plain = (text and text == text.strip() and not text.startswith(LITERAL) and not REGEX_TELL.search(text)
             and not WILD.search(text) and "]" not in text)
    return text if plain else LITERAL + text


def brackets_close(text: str) -> bool:
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


@functools.lru_cache(maxsize=4096)
def _model_norm(text: str) -> str:
    return names.model_key(text)


def normalize(key: str, value) -> str:
    """A case's or target's value as selectors compare it (None: the empty name)."""
    text = "" if value is None else str(value)
    return _model_norm(text) if key == "model" else text.lower()


def case_norms(case: dict) -> dict:
    """What selectors compare of a case, normalized once: per key, and its marks."""
    out = {k: normalize(k, case.get(k)) for k in ("model", "name", "op", "dtype", "signature")}
    out["marks"] = frozenset(case.get("marks") or ())
    return out


class Pattern:
    """One selector value: exact (compared normalized; ``=`` + a value is exact whatever it holds)
    or a wildcard (fnmatch, case-insensitive)."""

    __slots__ = ("text", "norm", "exact", "regex")

    def __init__(self, text: str, key: str = ""):
        self.text = text
        is_literal = text.startswith(LITERAL)
        self.norm = normalize(key, text[len(LITERAL):] if is_literal else text)
        self.exact = is_literal or not WILD.search(text)
        self.regex = None if self.exact else re.compile(fnmatch.translate(self.norm))

    def matches(self, norm_value: str) -> bool:
        return norm_value == self.norm if self.exact else self.regex.match(norm_value) is not None

    @property
    def weight(self) -> int:
        """2 exact, 1 wildcard, 0 for '*'."""
        return 0 if self.text == "*" else (2 if self.exact else 1)


class Selector:
    """The cases and targets one mapping of selector values (key -> the text written; marks: a
    list or an expression) selects."""

    __slots__ = ("values", "patterns", "signature", "marks", "case_patterns", "target_patterns", "rank", "case_key")

    def __init__(self, values: dict):
        self.values = values
        self.patterns = {k: Pattern(str(v), k) for k, v in values.items() if k in _PATTERN_KEYS}
        sig = values.get("signature")
        self.signature = str(sig).lower() if sig is not None else None
        m = values.get("marks")
        self.marks = set(m) if isinstance(m, list) else (None if m is None else marks_mod.MarkExpression(str(m)))
        self.case_patterns = [(k, p) for k, p in self.patterns.items() if k in CASE_KEYS]
        self.target_patterns = [(k, p) for k, p in self.patterns.items() if k in TARGET_KEYS]
        self.rank = self._rank()
        # what it selects of a case: selectors that say the same select the same cases
        self.case_key = tuple(sorted((k, tuple(v) if isinstance(v, list) else str(v))
                                     for k, v in values.items() if k in CASE_KEYS))

    def matches_case(self, norms: dict) -> bool:
        """Whether it selects the case whose :func:`case_norms` are ``norms``."""
        for k, p in self.case_patterns:
            if not p.matches(norms[k]):
                return False
        if self.signature is not None and not norms["signature"].startswith(self.signature):
            return False
        if self.marks is not None:
            if isinstance(self.marks, set):
                return self.marks <= norms["marks"]
            return self.marks.matches(norms["marks"])
        return True

    def matches_target(self, target: dict) -> bool:
        """Whether it selects ``target`` (device, backend, arch; a key missing is the empty name)."""
        return all(p.matches(normalize(k, target.get(k))) for k, p in self.target_patterns)

    def matches(self, norms: dict, target: dict) -> bool:
        return self.matches_target(target) and self.matches_case(norms)

    def weight(self, key: str) -> int:
        if key == "signature":
            return 2 if self.signature else 0
        if key == "marks":
            return 0 if self.marks is None else (len(self.marks) if isinstance(self.marks, set) else 1)
        p = self.patterns.get(key)
        return p.weight if p else 0

    def _rank(self) -> tuple:
        case = tuple(self.weight(k) for k in RANKED_CASE_KEYS)
        target = (self.weight("arch"), self.weight("device") + self.weight("backend"))
        return (case, target, (self.weight("dtype"), self.weight("marks")))
