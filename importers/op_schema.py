"""Dispatcher operator schemas: parsing ``aten::add.Tensor(Tensor self, ...) -> Tensor``, picking
the overload that fits a call's recorded arguments, and binding them to ``(op, inputs, attrs)``.

Arguments come as neutral tuples, whichever trace recorded them: ``("T", input)`` a tensor,
``("TL", input)`` a tensor list, ``("V", value)`` a recorded value, ``("N",)`` a recorded None,
``("U", why, kind)`` a value not recorded, ``("X", why)`` an unrepresentable one. Used by both
trace importers (:mod:`importers.kineto`, :mod:`importers.execution_trace`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from importers.trace_values import LAYOUTS, MEMORY_FORMATS, NOT_RECORDED, SCALAR_TYPES, value_input


@dataclass(frozen=True)
class SchemaArg:
    name: str
    type: str  # as written, alias annotations removed: "Tensor?[]", "int[1]?", "ScalarType?"
    base: str  # element type without ?/[]: "Tensor", "int", "str", ...
    is_list: bool
    optional: bool  # the argument itself may be None
    elem_optional: bool  # list elements may be None (Tensor?[])
    kwarg_only: bool
    default: str | None


@dataclass(frozen=True)
class Schema:
    name: str  # "aten::add"
    overload: str  # "Tensor" ("default" when the schema has none)
    args: tuple[SchemaArg, ...]

    @property
    def op(self) -> str:
        ns, op = self.name.split("::", 1)
        return f"torch.ops.{ns}.{op}.{self.overload}"


_ALIAS = re.compile(r"\([^()]*\)")
_LIST = re.compile(r"^(.*?)\[(\d*)\]$")
_SCHEMA_CACHE: dict[str, Schema] = {}


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    out, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def parse_schema(text: str) -> Schema:
    """Parse ``aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor``."""
    hit = _SCHEMA_CACHE.get(text)
    if hit is not None:
        return hit
    open_at = text.index("(")
    full = text[:open_at].strip()
    depth = 0
    for close_at in range(open_at, len(text)):
        c = text[close_at]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                break
    else:
        raise ValueError(f"unbalanced parentheses in schema {text!r}")
    name, _, overload = full.partition(".")
    args: list[SchemaArg] = []
    kwarg_only = False
    for part in _split_top(text[open_at + 1 : close_at]):
        if part == "*":
            kwarg_only = True
            continue
        decl, eq, default = part.partition("=")
        decl = decl.strip()
        typ, _, arg_name = decl.rpartition(" ")
        typ = _ALIAS.sub("", typ).replace(" ", "")
        optional = typ.endswith("?")
        core = typ[:-1] if optional else typ
        m = _LIST.match(core)
        is_list = bool(m)
        elem = m.group(1) if m else core
        elem_optional = is_list and elem.endswith("?")
        base = elem.rstrip("?")
        args.append(SchemaArg(arg_name, typ, base, is_list, optional, elem_optional, kwarg_only,
                              default.strip() if eq else None))
    schema = Schema(name, overload or "default", tuple(args))
    _SCHEMA_CACHE[text] = schema
    return schema


# Kinds of values Kineto records for an argument (anything else it writes as "").
_SCALAR_BASES = frozenset(("int", "SymInt", "float", "bool", "Scalar", "ScalarType", "Layout",
                           "MemoryFormat", "complex"))
_SCALAR_LIST_BASES = frozenset(("int", "SymInt", "float", "bool", "Scalar"))


def _recordable(a: SchemaArg) -> bool:
    """Would Kineto record a non-None value of this argument (so its "" means None)?"""
    if a.base == "Tensor":
        return not a.elem_optional
    return (a.base in _SCALAR_LIST_BASES) if a.is_list else (a.base in _SCALAR_BASES)


def _fits(a: SchemaArg, v: tuple) -> int:
    """0 if Kineto value ``v`` fits argument ``a``, 1 if it fits with an unknown value, -1 if not."""
    k = v[0]
    if k == "T":
        return 0 if a.base == "Tensor" and not a.is_list else -1
    if k == "TL":
        return 0 if a.base == "Tensor" and a.is_list else -1
    if k == "V":
        if isinstance(v[1], list):
            return 0 if a.is_list and a.base in _SCALAR_LIST_BASES else -1
        return 0 if not a.is_list and a.base in _SCALAR_BASES else -1
    if v[2]:  # a Scalar / ScalarList whose value is missing: right kind, unknown value
        scalar_list = v[2] == "ScalarList"
        ok = a.is_list == scalar_list and a.base in (_SCALAR_LIST_BASES if scalar_list else _SCALAR_BASES)
        return 1 if ok else -1
    # Written as "": fine for an optional argument of a recorded kind (it was None); an unknown
    # value for anything Kineto never records (str, Device, Tensor?[] ...).
    if _recordable(a):
        return 0 if a.optional else -1  # a required int/Tensor/... would have been recorded
    return 1


def resolve_overload(schemas: list[Schema], args: list[tuple]) -> Schema | str:
    """Pick the overload whose arguments fit the Kineto values, or say why none does."""
    best, best_score = None, None
    for s in schemas:
        if len(s.args) != len(args):
            continue
        score = 0
        for a, v in zip(s.args, args):
            f = _fits(a, v)
            if f < 0:
                break
            score += f
        else:
            # TorchScript-only overloads (prim_*) lose ties against real ones.
            key = (score, s.overload.startswith("prim_"))
            if best_score is None or key < best_score:
                best, best_score = s, key
    if best is None:
        name = schemas[0].name if schemas else "?"
        return f"no overload of {name} takes the {len(args)} recorded arguments"
    return best


def _convert_value(a: SchemaArg, v: Any) -> Any:
    """A recorded non-tensor value -> casedb value (plain), by the schema type."""
    if v is None:
        return None
    base = a.base
    if base == "ScalarType":
        return SCALAR_TYPES.get(v, v) if isinstance(v, int) else v
    if base == "Layout":
        return LAYOUTS.get(v, v) if isinstance(v, int) else v
    if base == "MemoryFormat":
        return MEMORY_FORMATS.get(v, v) if isinstance(v, int) else v
    if base == "float":
        if a.is_list and isinstance(v, list):
            return [float(x) if isinstance(x, (int, str)) and not isinstance(x, bool) else x for x in v]
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            return float(v)
    if base == "bool" and isinstance(v, int) and not a.is_list:
        return bool(v)
    return v


def _unknown_reason(a: SchemaArg, source: str) -> str:
    return (f"{source} does not record the {a.type} argument {a.name!r}; "
            "import an Execution Trace (torch.profiler.ExecutionTraceObserver) to get this op")


def bind(schema: Schema, args: list[tuple], source: str = "the trace") -> tuple[str, list, dict] | str:
    """Bind neutral argument tuples to a schema: ``(op, inputs, attrs)`` or a skip reason.

    Tuples: ``("T", input)`` tensor, ``("TL", input)`` tensor list, ``("V", value)`` recorded
    value, ``("N",)`` recorded None, ``("U", why, kind)`` not recorded (see
    ``kineto.kineto_args``), ``("X", why)`` unrepresentable.
    """
    if len(args) != len(schema.args):
        return (f"{len(args)} recorded arguments but the schema of {schema.name}.{schema.overload} "
                f"has {len(schema.args)}")
    inputs: list = []
    attrs: dict = {}
    for a, v in zip(schema.args, args):
        k = v[0]
        if k == "T" or k == "TL":
            form = v[1]
        elif k == "N":
            form = {"value": None}
        elif k == "V":
            val = v[1]
            if a.base == "Tensor" and a.is_list and val == []:
                form = {"tensor_list": []}
            else:
                form = value_input(_convert_value(a, val))
        elif k == "U":
            if v[1] != NOT_RECORDED:  # a scalar was passed but its value is missing
                return f"argument {a.name!r}: {v[1]}"
            if a.optional and _recordable(a):
                form = {"value": None}
            elif a.base == "Device":
                # Kineto never records devices. Beside a tensor argument an optional device is
                # None, as ET records it (_to_copy, empty_like: the device follows the tensor); a
                # factory op gets "cpu", the placeholder the runner maps to the target device
                # (None would leave it on the host), which ET records as the device it ran on.
                follows = a.optional and any(x[0] in ("T", "TL") for x in args)
                form = {"value": None if follows else "cpu"}
            elif a.base == "Generator" and a.optional:
                form = {"value": None}
            else:
                return _unknown_reason(a, source)
        else:  # "X"
            return f"argument {a.name!r}: {v[1]}"
        if a.kwarg_only:
            attrs[a.name] = form["value"] if len(form) == 1 and "value" in form else form
        else:
            inputs.append(form)
    return schema.op, inputs, attrs


# Python numbers an op was called with reach the dispatcher as 0-d "wrapped number" tensors of
# these dtypes; neither profiler records their value. NEUTRAL_SCALARS: the value used then,
# mul's and div's identity (never a zero divisor), of the Python type the number had.
WRAPPED_DTYPES = {"float64": float, "int64": int}
NEUTRAL_SCALARS = {float: 1.0, int: 1}


def torch_schemas(name: str) -> list[Schema] | None:
    """Parsed dispatcher schemas of ``ns::op`` (torch, cached), or None without torch or op."""
    if name in _OVERLOADS:
        return _OVERLOADS[name]
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a casedb dependency
        _OVERLOADS[name] = None
        return None
    try:
        found = [parse_schema(str(s)) for s in torch._C._jit_get_schemas_for_operator(name)]
    except RuntimeError:
        found = []
    _OVERLOADS[name] = found or None
    return _OVERLOADS[name]


_OVERLOADS: dict[str, list | None] = {}


def python_scalars(schema: Schema, args: list[tuple], source: str,
                   schemas: list[Schema] | None = None) -> tuple[Schema, list[tuple], str | None]:
    """A 0-d float64/int64 tensor passed where the op has a Scalar overload was a Python number
    (``x * 0.5``): rebound to that overload as a value of its Python type, the trace's value where
    it has one (``("T", input, value)``), else NEUTRAL_SCALARS, said in the returned note. Never a
    random float64 tensor, which fails on devices without float64. Other calls come back as they are."""
    wrapped = [j for j, (a, v) in enumerate(zip(schema.args, args))
               if v[0] == "T" and a.base == "Tensor" and not a.is_list and v[1]["tensor"]["shape"] == []
               and v[1]["tensor"].get("dtype") in WRAPPED_DTYPES and "preset" not in v[1]["tensor"]]
    if not wrapped:
        return schema, args, None
    schemas = torch_schemas(schema.name) if schemas is None else schemas
    for positions in [wrapped] + [[j] for j in reversed(wrapped)] * (len(wrapped) > 1):
        alt = _scalar_overload(schema, positions, schemas or ())
        if alt is None:
            continue
        args = list(args)
        guessed = []
        for j in positions:
            kind = WRAPPED_DTYPES[args[j][1]["tensor"]["dtype"]]
            recorded = args[j][2] if len(args[j]) > 2 else None
            if recorded is None:
                guessed.append(f"{schema.args[j].name}={NEUTRAL_SCALARS[kind]!r}")
            args[j] = ("V", kind(recorded) if recorded is not None else NEUTRAL_SCALARS[kind])
        note = (f"{source} does not record the value of the Python number {', '.join(guessed)}: a neutral "
                "value (mul's identity, never a zero divisor)") if guessed else None
        return alt, args, note
    return schema, args, None


def _scalar_overload(schema: Schema, positions: list[int], schemas) -> Schema | None:
    """The overload of the same op taking a Scalar at ``positions`` and the same arguments elsewhere."""
    for alt in schemas:
        if alt.overload == schema.overload or len(alt.args) != len(schema.args):
            continue
        if all((b.base == "Scalar" and not b.is_list) if j in positions else (b.type == a.type and b.name == a.name)
               for j, (a, b) in enumerate(zip(schema.args, alt.args))):
            return alt
    return None


def bind_positional(args: list[tuple]) -> list | str:
    """Without a schema: every argument positional, unrecorded ones None."""
    out = []
    for v in args:
        k = v[0]
        if k in ("T", "TL"):
            out.append(v[1])
        elif k == "V":
            out.append(value_input(v[1]))
        elif k in ("N", "U"):
            out.append({"value": None})
        else:
            return v[1]
    return out
