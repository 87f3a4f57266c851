"""What a case says about its own judgement: its marks, ``skip_if`` and ``xfail_if`` conditions
(checked by :mod:`casedb.cases.safe_eval`, never run as Python) and ``expects_error``.

Part of reading a case (:mod:`casedb.cases.spec`); errors are ValueErrors the case reader turns
into InputErrors with the place.
"""

from __future__ import annotations

import re

from casedb.cases import marks as marks_mod, safe_eval
from casedb.names import unknown_key_message

ERROR_TYPES = ("RuntimeError", "ValueError", "TypeError", "AssertionError", "IndexError",
               "KeyError", "NotImplementedError", "ZeroDivisionError", "OverflowError",
               "AttributeError", "Exception", "torch.OutOfMemoryError", "OutOfMemoryError",
               "torch._dynamo.exc.Unsupported", "BackendCompilerFailed", "InductorError")
_DEVICE = re.compile(r"^(cpu|cuda|xpu|mps|meta|hpu|spyre|privateuseone|[a-z_]+)(:\d+)?$")


# Markers pytest and common plugins give behaviour to: a case mark of that name would become the
# marker itself (a failing case skipped, xfailed, parametrized...). The pytest plugin also drops,
# at run time, any stored mark that another plugin of that session registers (casedb.run.worker).
PYTEST_MARKERS = frozenset({
    "skip", "skipif", "xfail", "parametrize", "usefixtures", "filterwarnings", "tryfirst", "trylast",
    "hookwrapper", "optionalhook", "timeout", "anyio", "asyncio", "hypothesis", "xdist_group", "benchmark",
    "flaky", "forked", "repeat", "order", "run", "dependency", "django_db", "no_cover"})
# casedb's own marks of each model's cases (casedb.names.model_mark)
MODEL_MARK_PREFIX = "model_"


def reserved_mark(name: str) -> str | None:
    """Why ``name`` cannot be a case's own mark (None: it can)."""
    if name in PYTEST_MARKERS:
        return (f"mark {name!r} is a pytest marker: on a case it would make pytest {name} it (a failure skipped "
                "or hidden); rename the mark (e.g. case_" + name + "), or use skip_if / xfail_if")
    if name.startswith(MODEL_MARK_PREFIX):
        return (f"mark {name!r}: marks starting with {MODEL_MARK_PREFIX!r} are casedb's own, one per model "
                "(-m model_<name> selects a model's cases); rename the mark")
    return None


def marks_of(value) -> list[str]:
    if value is None:
        return []
    items = re.split(r"[,\s]+", value.strip()) if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError("'marks' must be a mark name or a list of mark names")
    out = []
    for m in items:
        if not m:
            continue
        if not isinstance(m, str) or not marks_mod.is_mark_name(m):
            raise ValueError(f"mark {m!r} is not a valid pytest marker name (letters, digits, _)")
        why = reserved_mark(m)
        if why:
            raise ValueError(why)
        if m not in out:
            out.append(m)
    return out


def conditions(value, key: str) -> list[dict] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, str):
            item = {"expr": item}
        if not isinstance(item, dict) or "expr" not in item:
            raise ValueError(f"'{key}' entries are {{expr: <condition>, reason: <text>}}")
        for k in item:
            if k not in ("expr", "reason"):
                raise ValueError(f"in '{key}': " + unknown_key_message(k, ("expr", "reason")))
        expr = item["expr"]
        if isinstance(expr, bool):
            expr = str(expr)
        safe_eval.check_condition(str(expr))
        out.append({"expr": str(expr), "reason": str(item.get("reason") or f"{key}: {expr}")})
    return out


def xfail(expr, reason, strict=None) -> dict | None:
    """``{expr, reason}`` of ``xfail_if``; ``strict: False`` (``xfail_strict: false``: a pass is a
    pass, as the RFC runner's non-strict ``mode: xfail``) kept only where given."""
    if strict is not None and not isinstance(strict, bool):
        raise ValueError(f"'xfail_strict' must be true or false, got {strict!r}")
    if expr is None and reason is None:
        return None
    if expr is None:
        expr = "True"
    if isinstance(expr, bool):
        expr = str(expr)
    safe_eval.check_condition(str(expr))
    out = {"expr": str(expr), "reason": str(reason or f"xfail_if: {expr}")}
    return out if strict is not False else {**out, "strict": False}


def _one_expectation(v, label) -> dict:
    if isinstance(v, str):
        v = {"type": v}
    if not isinstance(v, dict) or "type" not in v:
        raise ValueError(f"{label} needs {{type: <ExceptionType>, match: <substring>}}")
    for k in v:
        if k not in ("type", "match"):
            raise ValueError(f"in {label}: " + unknown_key_message(k, ("type", "match")))
    t = str(v["type"])
    if t not in ERROR_TYPES:
        raise ValueError(f"{label}: unknown error type {t!r}; allowed: {', '.join(ERROR_TYPES)}")
    out = {"type": t}
    if v.get("match") is not None:
        out["match"] = str(v["match"])
    return out


def expects_error(value) -> dict | None:
    if value is None:
        return None
    if isinstance(value, dict) and "type" not in value and value:
        # split per side: {ref: {...}, cuda: {...}}
        out = {}
        for side, v in value.items():
            if side != "ref" and not _DEVICE.match(str(side)):
                raise ValueError(f"expects_error: {side!r} is neither 'ref' nor a device type")
            out[str(side)] = _one_expectation(v, f"expects_error.{side}")
        return out
    return _one_expectation(value, "expects_error")
