"""Restricted evaluation of the two kinds of Python text a manifest may hold.

Nothing from a manifest is ever passed to ``eval``. Both forms are parsed with :mod:`ast` and
walked by hand against an allow-list:

* ``py:`` literals — tuples, lists, ``None``, ``Ellipsis``/``...``, ``True``/``False``, ints,
  floats, ``inf``, ``-inf``, ``nan``, strings, ``slice(a, b, c)`` with literal arguments and the
  torch constants ``torch.<dtype>`` (any alias casedb accepts: ``torch.half``), ``torch.<layout>``
  and ``torch.<memory_format>`` — looked up in those three tables, never evaluated.
* ``skip_if`` / ``xfail_if`` expressions — ``and``/``or``/``not``, comparisons
  (``== != < <= > >= in not in``), literals, tuples/lists of literals, the names ``device``,
  ``backend``, ``dtype_str``, ``op``, ``model`` and attribute chains under ``cfg`` (e.g.
  ``cfg.test_device.type``). No calls, no subscripts, no other names.
"""

from __future__ import annotations

import ast
import math
from typing import Any


class UnsafeExpression(ValueError):
    """The text uses something outside the allow-list."""


# ---------------------------------------------------------------------------------- py: literals

_PY_NAMES = {"None": None, "Ellipsis": Ellipsis, "True": True, "False": False, "inf": math.inf, "nan": math.nan}


def parse_py_literal(src: str) -> Any:
    """Parse a restricted ``py:`` literal and return the Python object."""
    try:
        tree = ast.parse(str(src).strip(), mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"py literal {src!r} is not valid Python syntax: {e.msg}") from None
    return _literal(tree.body, src)


def _literal(node: ast.AST, src: str) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis or node.value is None or isinstance(node.value, (bool, int, float, str)):
            return node.value
        raise UnsafeExpression(f"py literal {src!r}: constant {node.value!r} is not allowed")
    if isinstance(node, ast.Name):
        if node.id in _PY_NAMES:
            return _PY_NAMES[node.id]
        raise UnsafeExpression(
            f"py literal {src!r}: name {node.id!r} is not allowed (allowed: {', '.join(sorted(_PY_NAMES))})"
        )
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand, src)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UnsafeExpression(f"py literal {src!r}: unary minus only applies to numbers")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, src) for e in node.elts)
    if isinstance(node, ast.List):
        return [_literal(e, src) for e in node.elts]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        obj = torch_constant(node.attr)
        if obj is None:
            raise UnsafeExpression(
                f"py literal {src!r}: torch.{node.attr} is not a torch dtype, layout or memory format")
        return obj
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "slice":
        if node.keywords or not 1 <= len(node.args) <= 3:
            raise UnsafeExpression(f"py literal {src!r}: slice() takes 1 to 3 positional arguments")
        parts = [_literal(a, src) for a in node.args]
        for p in parts:
            if p is not None and (isinstance(p, bool) or not isinstance(p, int)):
                raise UnsafeExpression(f"py literal {src!r}: slice() arguments must be ints or None")
        return slice(*parts)
    raise UnsafeExpression(
        f"py literal {src!r}: {type(node).__name__} is not allowed; only tuples, lists, None, Ellipsis, "
        "slice(...), ints, floats, inf, -inf, nan, strings and torch.<dtype>"
    )


def torch_constant(name: str):
    """``torch.<name>`` when it is a dtype (any casedb alias), layout or memory format; else None."""
    from casedb.cases import dtypes

    import torch

    try:
        name = dtypes.canonical(name)
    except dtypes.UnknownDtype:
        pass
    obj = getattr(torch, name, None) if not name.startswith("_") else None
    return obj if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)) else None


def _is_torch_constant(value: Any) -> bool:
    # checked by type name so that formatting other literals never imports torch
    return type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "layout", "memory_format")


def format_py_literal(value: Any) -> str:
    """Canonical text of a literal produced by :func:`parse_py_literal` (round-trips exactly)."""
    if value is Ellipsis:
        return "Ellipsis"
    if _is_torch_constant(value):
        return str(value)  # torch.float16, torch.strided, torch.channels_last
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, slice):
        return f"slice({format_py_literal(value.start)}, {format_py_literal(value.stop)}, {format_py_literal(value.step)})"
    if isinstance(value, tuple):
        inner = ", ".join(format_py_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(format_py_literal(v) for v in value) + "]"
    raise TypeError(f"not a py literal: {value!r}")


def canonical_py(src: str) -> str:
    """Validate and canonicalize ``py:`` text, e.g. ``(..., None, slice(None))`` → one spelling."""
    return format_py_literal(parse_py_literal(src))


# ------------------------------------------------------------------------- skip_if expressions

CONDITION_NAMES = ("device", "backend", "dtype_str", "op", "model", "cfg")
_CMP = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def check_condition(expr: str) -> ast.Expression:
    """Parse a ``skip_if`` expression and check it against the allow-list; return the tree."""
    try:
        tree = ast.parse(str(expr).strip(), mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"expression {expr!r} is not valid Python syntax: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.Not, ast.Compare,
                             ast.Load, ast.Tuple, ast.List)) or type(node) in _CMP:
            continue
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            continue
        if isinstance(node, (ast.USub,)):
            continue
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
            continue
        if isinstance(node, ast.Name):
            if node.id in CONDITION_NAMES or node.id in ("True", "False", "None"):
                continue
            raise UnsafeExpression(
                f"expression {expr!r}: name {node.id!r} is not allowed (allowed: {', '.join(CONDITION_NAMES)})"
            )
        if isinstance(node, ast.Attribute):
            root = node
            while isinstance(root, ast.Attribute):
                if root.attr.startswith("_"):
                    raise UnsafeExpression(f"expression {expr!r}: private attribute {root.attr!r} is not allowed")
                root = root.value
            if isinstance(root, ast.Name) and root.id == "cfg":
                continue
            raise UnsafeExpression(f"expression {expr!r}: attributes are only allowed under cfg (e.g. cfg.test_device.type)")
        raise UnsafeExpression(
            f"expression {expr!r}: {type(node).__name__} is not allowed; use names ({', '.join(CONDITION_NAMES)}), "
            "literals, comparisons and and/or/not"
        )
    return tree


def evaluate_condition(expr: str, env: dict[str, Any]) -> bool:
    """Evaluate a checked ``skip_if`` expression against ``env`` (no ``eval``)."""
    tree = check_condition(expr)
    return bool(_eval(tree.body, env))


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.id]
        return env.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _eval(node.value, env)
        if isinstance(base, dict):
            return base.get(node.attr)
        return getattr(base, node.attr, None)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, env) for v in node.values)
        return any(_eval(v, env) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            try:
                ok = _CMP[type(op)](left, right)
            except TypeError:
                ok = False
            if not ok:
                return False
            left = right
        return True
    raise UnsafeExpression(f"{type(node).__name__} is not allowed")
