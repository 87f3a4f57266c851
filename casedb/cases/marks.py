"""Derived marks (the RFC's pytest.ini markers) and matching ``-m`` / ``-k`` expressions.

Derived marks are computed from what a case executes, so every model that contains the case
gets the same marks. Exact rules, over every tensor argument (positional, keyword, and each
element of a tensor list):

* ``largedimtensor`` — a tensor with 4 or more dimensions (the RFC: 4D and 5D tensors).
* ``fp32operation`` / ``bf16operation`` — the case computes in float32 / bfloat16: the
  floating dtypes of its tensors promote (torch's rules) to that dtype; a case with no floating
  tensor computes in the dtype named by a ``dtype``/``torch.<dtype>`` argument, if any.
* ``constant`` — a positional argument is a non-tensor literal that is a number, a bool, a list
  or a tuple (``value:`` or ``py:``); ``None``, strings, ``Ellipsis`` and keyword arguments
  (``attrs``) do not count.
* ``paddedtensor`` — a tensor whose last dimension is not a multiple of 64 (the Spyre stick
  size, so the backend must pad it). 0-d tensors are not padded.
* ``noncontiguous`` / ``transposed`` / ``broadcast`` / ``offset`` — a tensor's layout
  (:func:`casedb.cases.layout.tensor_layout`): ``noncontiguous`` for a strided, transposed or
  broadcast one (what ``Tensor.is_contiguous()`` says no to), and the word itself for the last three.

Hand-written marks from a manifest are kept beside these (on the model occurrence).
"""

from __future__ import annotations

import itertools
import re

from casedb.cases import dtypes
from casedb.cases.layout import tensor_layout

DERIVED = {
    "paddedtensor": "tensors whose last dimension is not a multiple of 64 (need padding)",
    "largedimtensor": "tests for 4D and 5D tensors",
    "fp32operation": "tests for fp32 operations",
    "bf16operation": "tests for bfloat16 operations",
    "constant": "tests for operations with constants",
    "noncontiguous": "a tensor input that is not contiguous: strided, transposed or broadcast",
    "transposed": "a tensor input stored with its dimensions permuted (dense, not row-major)",
    "broadcast": "a tensor input expanded along a dimension (stride 0)",
    "offset": "a tensor input that starts past the beginning of its storage",
}
# The derived marks an input's layout gives (casedb.cases.layout): offset views are contiguous.
LAYOUT_MARKS = {"strided": ("noncontiguous",), "transposed": ("noncontiguous", "transposed"),
                "broadcast": ("noncontiguous", "broadcast"), "offset": ("offset",), "contiguous": ()}
# The RFC's pytest.ini addopts: what model-op tests exclude unless -m says otherwise.
DEFAULT_EXCLUDE = "not largedimtensor and not fp32operation and not bf16operation and not constant"
STICK = 64

_MARK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_mark_name(name: str) -> bool:
    return bool(_MARK_NAME.match(name))


def iter_tensors(inputs: list, attrs: dict):
    for spec in list(inputs) + [v for v in attrs.values() if isinstance(v, dict)]:
        if "tensor" in spec:
            yield spec["tensor"]
        elif "file" in spec:
            yield spec["file"]
        elif "tensor_list" in spec:
            yield from spec["tensor_list"]


def derive(inputs: list, attrs: dict) -> list[str]:
    marks = set()
    tensors = list(iter_tensors(inputs, attrs))
    for t in tensors:
        shape = t["shape"]
        if len(shape) >= 4:
            marks.add("largedimtensor")
        if shape and shape[-1] % STICK != 0:
            marks.add("paddedtensor")
        marks.update(LAYOUT_MARKS[tensor_layout(t)])
    computes = dtypes.promote_floating(t["dtype"] for t in tensors)
    if computes is None:
        for v in list(attrs.values()) + [s.get("value") for s in inputs if "value" in s]:
            if isinstance(v, str) and v.startswith("torch."):
                try:
                    computes = dtypes.canonical(v)
                except dtypes.UnknownDtype:
                    continue
                break
    if computes == "float32":
        marks.add("fp32operation")
    elif computes == "bfloat16":
        marks.add("bf16operation")
    for spec in inputs:
        if "value" in spec and isinstance(spec["value"], (int, float, list)):
            marks.add("constant")
        elif "py" in spec and (spec["py"].startswith(("(", "[")) or _is_number(spec["py"])):
            marks.add("constant")
    return sorted(marks)


def _is_number(text: str) -> bool:
    return text in ("True", "False", "inf", "-inf", "nan") or bool(re.fullmatch(r"-?[0-9.e+-]+", text))


def absent_derived(markexpr: str, marks_per_case) -> str | None:
    """What to say when ``markexpr`` matches none of the cases (each an iterable of marks) and
    names derived marks that none of them carries (None: it matches some, or names none)."""
    try:
        expr = MarkExpression(markexpr)
    except ValueError:  # a syntax error: the expression's own check says so
        return None
    present = set()
    for marks in marks_per_case:
        if expr.matches(marks):
            return None
        present.update(marks)
    absent = sorted((expr.idents() & set(DERIVED)) - present)
    if not absent:
        return None
    what = "; ".join(f"{name!r} ({DERIVED[name]})" for name in absent)
    return (f"-m {markexpr!r} selects no case: no case here has the derived mark {what}. "
            "casedb cases -m '' lists the cases with their marks")


# What an expression may hold: pytest's parser recurses per `not` and parenthesis (10^5 of them:
# RecursionError or MemoryError, which killed workers); real expressions are a few dozen characters
# and a few levels deep.
MAX_EXPRESSION_CHARS = 4096
MAX_EXPRESSION_DEPTH = 64


class MarkExpression:
    """A ``-m`` expression (names, and/or/not, parentheses) matched against marks, parsed by
    pytest's own parser (``_pytest.mark.expression``: one grammar for casedb and pytest); at most
    :data:`MAX_EXPRESSION_CHARS` characters and :data:`MAX_EXPRESSION_DEPTH` levels."""

    what = "marker expression"
    names = "mark names"

    def __init__(self, text: str):
        self.text = text.strip()
        self._expr = None
        if self.text:
            if len(self.text) > MAX_EXPRESSION_CHARS:
                raise ValueError(f"{self.what} {_shown(self.text)} is {len(self.text)} characters long; "
                                 f"at most {MAX_EXPRESSION_CHARS}")
            try:
                idents, depth = _scan(self.text)
                if depth <= MAX_EXPRESSION_DEPTH:
                    self._expr = _pytest_expression().Expression.compile(self.text)
            except SyntaxError:  # (pytest's own words name tokens, not what to write)
                raise ValueError(f"bad {self.what} {text!r}: only {self.names}, and, or, not and "
                                 "parentheses") from None
            if self._expr is None:
                raise ValueError(f"{self.what} {_shown(self.text)} nests more than {MAX_EXPRESSION_DEPTH} "
                                 "levels of not, and, or and parentheses; write it flatter")
            self._idents = idents

    def idents(self) -> set[str]:
        """The names the expression mentions."""
        return set(self._idents) if self._expr is not None else set()

    def matches(self, marks) -> bool:
        if self._expr is None:
            return True
        found = set(marks)
        return self._expr.evaluate(lambda name, /, **kwargs: not kwargs and name in found)


class KeywordExpression(MarkExpression):
    """A ``-k`` expression matched as pytest matches one: a name matches when it is a substring
    of one of the words, ignoring case."""

    what = "keyword expression"
    names = "names"

    def matches(self, words) -> bool:
        if self._expr is None:
            return True
        lowered = [str(w).lower() for w in words]
        return self._expr.evaluate(lambda name, /, **kwargs: not kwargs and any(name.lower() in w for w in lowered))


def _scan(text: str) -> tuple[set[str], int]:
    """(the names, how deep ``not`` and parentheses nest) by pytest's lexer, which does not
    recurse; raises SyntaxError as pytest's parser would for a bad token."""
    pe = _pytest_expression()
    kinds = pe.TokenType
    scanner = pe.Scanner(text)
    names: set[str] = set()
    deepest = level = 0
    opened: list[int] = []  # the level inside each open parenthesis
    for tok in itertools.chain([scanner.current], scanner.tokens):
        if tok.type is kinds.NOT:
            level += 1
        elif tok.type is kinds.LPAREN:
            level += 1
            opened.append(level)
        elif tok.type is kinds.RPAREN:
            if opened:
                opened.pop()
            level = opened[-1] if opened else 0
        elif tok.type is kinds.IDENT:
            names.add(tok.value)
            level = opened[-1] if opened else 0
        deepest = max(deepest, level)
        if deepest > MAX_EXPRESSION_DEPTH:
            break
    return names, deepest


def _pytest_expression():
    """pytest's expression module, imported when an expression is first parsed: importing it
    loads much of pytest (~0.2 s), which the commands that parse none need not pay."""
    from _pytest.mark import expression

    return expression


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:60]!r}..."


def unknown_marks(markexpr: str, known) -> str | None:
    """What is wrong with an -m expression naming marks outside ``known`` (None: nothing)."""
    from casedb.names import did_you_mean

    try:
        unknown = sorted(MarkExpression(markexpr).idents() - set(known))
    except ValueError:  # a syntax error: the expression's own check says so
        return None
    if not unknown:
        return None
    hints = []
    for name in unknown:
        hint = did_you_mean(name, sorted(known))
        hints.append(f"{name!r}" + (f" ({hint})" if hint else ""))
    return (f"-m {markexpr!r}: no case or model has the mark {', '.join(hints)}; "
            "pytest --list-cases-by-mark -m '' shows every case's marks")
