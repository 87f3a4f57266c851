"""Names as casedb compares them: op names, model keys, and the "did you mean" hint.

Torch-free and import-free (standard library only), so the case parser, the store, the
importers, the judge and triage can all use it without importing each other.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable


def normalize_op(op: Any) -> str:
    """The stored spelling of an op name: ``aten::add.Tensor`` and ``aten.add.Tensor`` ->
    ``torch.ops.aten.add.Tensor``, ``F.gelu`` -> ``torch.nn.functional.gelu``; other names as
    written (stripped). Raises ValueError for a non-string or empty name."""
    if not isinstance(op, str) or not op.strip():
        raise ValueError("'op' must be a non-empty string such as torch.add or torch.ops.aten.mm.default")
    op = op.strip()
    if op.startswith("aten::"):
        rest = op[len("aten::"):]
        return "torch.ops.aten." + rest.replace("::", ".")
    if op.startswith("aten."):
        return "torch.ops." + op
    if op.startswith("F."):
        return "torch.nn.functional." + op[2:]
    return op


def op_path(op: Any) -> str:
    """Where an op name leads under ``torch``: :func:`normalize_op`, and any other namespace's
    ``ns::op[.overload]`` (a custom library's trace spelling) as ``torch.ops.ns.op[.overload]``."""
    n = normalize_op(op)
    if "::" in n and not n.startswith("torch."):
        ns, rest = n.split("::", 1)
        n = f"torch.ops.{ns}.{rest}"
    return n


def model_key(name: str) -> str:
    """Model names match case-insensitively with '-' and '_' alike (gpt_oss = gpt-oss)."""
    return str(name).strip().lower().replace("_", "-")


def model_mark(name: str) -> str:
    """The ``model_<name>`` marker of a model (``granite-4.0-h-micro`` -> ``model_granite_4_0_h_micro``)."""
    return "model_" + re.sub(r"[^0-9a-zA-Z]+", "_", str(name)).strip("_").lower()


def close_names(word: Any, choices: Iterable, *, n: int = 1, ignore_case: bool = False) -> list:
    """Up to `n` of `choices` spelled like `word` (difflib's ratio >= 0.6), closest first, as
    given in `choices`. `ignore_case`: compare lower-cased."""
    choices = list(choices)
    if not ignore_case:
        return difflib.get_close_matches(str(word), [str(c) for c in choices], n=n)
    lowered = {}
    for c in choices:
        lowered.setdefault(str(c).lower(), c)
    return [lowered[c] for c in difflib.get_close_matches(str(word).lower(), list(lowered), n=n)]


def did_you_mean(word: Any, choices: Iterable, *, n: int = 1, ignore_case: bool = False,
                 quote: bool = True) -> str:
    """``did you mean 'x'?`` naming the closest of `choices` (``did you mean a, b?`` with
    ``quote=False``), or "" when none is close."""
    close = close_names(word, choices, n=n, ignore_case=ignore_case)
    if not close:
        return ""
    return "did you mean " + ", ".join(repr(c) if quote else str(c) for c in close) + "?"


def unknown_key_message(key: Any, allowed) -> str:
    """``unknown key 'nmae' — did you mean 'name'? (allowed: name, op, ...)``"""
    hint = did_you_mean(key, allowed)
    return f"unknown key {key!r}{' — ' + hint if hint else ''} (allowed: {', '.join(allowed)})"
