"""PyTorch Execution Trace importer (``torch.profiler.ExecutionTraceObserver``), JSON or .json.gz.

Each node with an ``op_schema`` attr is an operator call. Its ``inputs.values / shapes / types /
strides`` are bound to the schema's arguments: positional arguments become ``inputs``,
keyword-only ones ``attrs``; non-tensor arguments keep their recorded values (ScalarType /
Layout / MemoryFormat codes become ``torch.*`` names). Tensors keep their strides and, when
non-contiguous, their storage offset (``preset: strided``). The observer writes doubles with 6
significant digits (sdpa's ``scale=0.353553``): that is the precision of float arguments here.
Unrepresentable arguments (``Tensor?[]`` lists holding None, e.g. ``x[:, idx]``'s
``aten::index``; opaque objects) make the call a skipped record with the reason.

Nesting follows ``ctrl_deps`` (the parent node): ``level="top"`` (default) keeps operators with
no operator above them, ``level="leaf"`` those with no operator below them. Nodes without a
schema (the thread/process roots, ``record_function`` ranges) are transparent, the same rule
as the Kineto importer, so both imports of one forward give the same top-level calls.

This module also owns the operator-schema parsing and argument binding that the Kineto importer
uses with the dispatcher's schemas.
"""

from __future__ import annotations

import marshal
import re
from dataclasses import dataclass
from typing import Any, Iterator

from .kineto import (
    LAYOUTS,
    MEMORY_FORMATS,
    NOT_RECORDED,
    SCALAR_TYPES,
    TraceFormatError,
    load_json,
    paused_gc,
    head_bytes,
    tensor_input,
    value_input,
)

__all__ = ["parse", "sniff", "parse_schema", "bind", "bind_positional", "resolve_overload", "Schema", "SchemaArg"]


# ----------------------------------------------------------------------------- schemas


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
                # Kineto never records devices. "cpu" is a placeholder the runner maps to the
                # target device (None would leave a factory op on the host); ET records them.
                form = {"value": "cpu"}
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


# ----------------------------------------------------------------------------- nodes


def _et_args(types, values, shapes, strides) -> list[tuple]:
    """ET ``inputs`` columns -> neutral argument tuples."""
    n = len(types)
    if len(values) != n or len(shapes) != n or (strides is not None and len(strides) != n):
        raise ValueError("inputs.values / shapes / types / strides lengths differ")
    out: list[tuple] = []
    for j, t in enumerate(types):
        v = values[j]
        if t.startswith("Tensor("):
            dt = t[7:-1]
            if dt.startswith("nullptr"):  # an undefined tensor: None for a Tensor? argument
                out.append(("N",))
                continue
            ti = tensor_input(dt, shapes[j], strides[j] if strides is not None else None,
                              v[2] if isinstance(v, list) and len(v) > 2 else 0)
            out.append(("X", ti) if isinstance(ti, str) else ("T", ti))
        elif t.startswith("GenericList["):
            elems = t[12:-1].split(",") if len(t) > 13 else []
            if elems and all(e.startswith("Tensor(") for e in elems):
                if any(e.startswith("Tensor(nullptr") for e in elems):
                    out.append(("X", "Tensor?[] list with None entries is not representable"))
                    continue
                items = []
                st = strides[j] if strides is not None else None
                for k, e in enumerate(elems):
                    ti = tensor_input(e[7:-1], shapes[j][k], st[k] if st else None,
                                      v[k][2] if isinstance(v[k], list) and len(v[k]) > 2 else 0)
                    if isinstance(ti, str):
                        break
                    items.append(ti["tensor"])
                else:
                    out.append(("TL", {"tensor_list": items}))
                    continue
                out.append(("X", ti))
            elif any(e.startswith("Tensor(") for e in elems):
                out.append(("X", f"mixed list {t} is not representable"))
            elif all(e in ("Int", "Double", "Bool", "String", "Device") for e in elems):
                out.append(("V", [float(x) if e == "Double" else x for e, x in zip(elems, v)]))
            else:
                out.append(("X", f"opaque object argument {t}"))
        elif t == "Int" or t == "Bool" or t == "String" or t == "Device":
            out.append(("V", v))
        elif t == "Double":
            out.append(("V", float(v)))  # ET writes inf/nan as the strings 'inf', '-inf', 'nan'
        elif t == "None":
            out.append(("N",))
        else:
            out.append(("X", f"opaque object argument ({t})"))
    return out


def _attr(node: dict, name: str):
    for a in node.get("attrs") or ():
        if a.get("name") == name:
            return a.get("value")
    return None


_HEAD = re.compile(rb'"schema"\s*:\s*"')
_NODES = re.compile(rb'"nodes"\s*:\s*\[')


def sniff(path, head: bytes | str) -> bool:
    """True if the file is an Execution Trace (JSON with ``schema`` and ``nodes``)."""
    data = head_bytes(path, head)
    return bool(_HEAD.search(data) and _NODES.search(data))


_FIX = ("record it again with torch.profiler.ExecutionTraceObserver().register_callback(path) "
        "(start/stop, or profile(execution_trace_observer=...))")


def _check_acyclic(path: str, nodes: list, up: list) -> None:
    """Raise TraceFormatError if following parents from some node comes back to it."""
    state = bytearray(len(nodes))  # 0 unseen, 1 on the current walk, 2 done (reaches a root)
    for start in range(len(nodes)):
        walk = []
        j = start
        while j is not None and state[j] == 0:
            state[j] = 1
            walk.append(j)
            j = up[j]
        if j is not None and state[j] == 1:
            ring = walk[walk.index(j):]
            ids = ", ".join(str(nodes[k].get("id")) for k in ring[:10]) + (" ..." if len(ring) > 10 else "")
            raise TraceFormatError(
                f"{path}: event {j} (node {nodes[j].get('id')}): ctrl_deps form a cycle of {len(ring)} nodes "
                f"(ids {ids}); the trace is corrupt: {_FIX}")
        for k in walk:
            state[k] = 2


def _group(path: str, level: str, max_bytes: int | None = None) -> list[tuple]:
    """Decode the trace, keep the top/leaf operator nodes, group identical calls.

    Returns ``[(node, index, count, op_schema), ...]`` in first-call order, one node per
    distinct call, so the decoded trace can be freed before records are built.
    """
    data = load_json(path, "Execution Trace", _FIX, max_bytes)
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or "schema" not in data:
        raise TraceFormatError(f"{path}: no 'schema' and 'nodes': not an Execution Trace; {_FIX}")

    by_id: dict = {}
    schema_of: list = [None] * len(nodes)
    for i, n in enumerate(nodes):
        if n.__class__ is not dict or "id" not in n:
            raise TraceFormatError(f"{path}: event {i}: node without an 'id'; the trace is corrupt: {_FIX}")
        by_id[n["id"]] = i
        s = _attr(n, "op_schema")
        if s:
            schema_of[i] = s
        if i == 0 and isinstance(n.get("inputs"), list):
            raise TraceFormatError(
                f"{path}: Execution Trace schema {data.get('schema')!r} stores inputs as a list "
                f"(the format before torch 2.1), which is not supported; {_FIX} with a current torch"
            )

    # Parent of every node by ctrl_deps (older traces: parent). A node that is its own parent is
    # a root (the process node of a real trace is); any longer cycle is corrupt and would
    # make the walk below loop forever.
    up: list = [None] * len(nodes)
    for i, n in enumerate(nodes):
        p = by_id.get(n.get("ctrl_deps", n.get("parent")))
        up[i] = None if p == i else p
    _check_acyclic(path, nodes, up)

    # Nearest operator ancestor of every node (None at the root); non-operators are transparent.
    memo: dict = {}

    def op_parent(i: int):
        chain = []
        j = i
        while True:
            p = up[j]
            if p is None:
                found = None
                break
            if schema_of[p] is not None:
                found = p
                break
            if p in memo:
                found = memo[p]
                break
            chain.append(p)
            j = p
        for c in chain:
            memo[c] = found
        return found

    op_idx = [i for i in range(len(nodes)) if schema_of[i] is not None]
    parent = {i: op_parent(i) for i in op_idx}
    if level == "top":
        kept = [i for i in op_idx if parent[i] is None]
    else:
        has_child = {p for p in parent.values() if p is not None}
        kept = [i for i in op_idx if i not in has_child]
    # First occurrence = earliest call: node ids are handed out in call order.
    kept.sort(key=lambda i: (nodes[i]["id"] if isinstance(nodes[i]["id"], int) else 0, i))

    groups: dict = {}
    for i in kept:
        n = nodes[i]
        inp = n.get("inputs")
        try:
            types = inp["types"]
            # Tensor and storage ids differ per call; of a tensor value only the offset matters.
            vkey = []
            for t, v in zip(types, inp["values"]):
                if t.startswith("Tensor("):
                    vkey.append(v[2] if isinstance(v, list) and len(v) > 2 else 0)
                elif t.startswith("GenericList[Tensor"):
                    vkey.append([x[2] if isinstance(x, list) and len(x) > 2 else 0 for x in v])
                else:
                    vkey.append(v)
            key = (schema_of[i], marshal.dumps((types, inp["shapes"], inp.get("strides"), vkey), 2))
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise TraceFormatError(
                f"{path}: event {i} (node {n.get('id')}, {n.get('name')}): malformed inputs ({err}); "
                f"the trace is corrupt: {_FIX}"
            ) from None
        g = groups.get(key)
        if g is None:
            groups[key] = [n, i, 1, schema_of[i]]
        else:
            g[2] += 1
    return [tuple(g) for g in groups.values()]


def parse(path, *, level: str = "top", max_bytes: int | None = None, **_options) -> Iterator[dict]:
    """Yield casedb records for the operator calls in an Execution Trace (see module docstring).

    Identical calls are aggregated into one record with a ``count``; ``where`` is the first call,
    ``<path>:event <index in nodes>``.
    """
    if level not in ("top", "leaf"):
        raise ValueError(f"level must be 'top' or 'leaf', not {level!r}")
    path = str(path)
    with paused_gc():
        try:
            groups = _group(path, level, max_bytes)
        except (TypeError, AttributeError, KeyError, IndexError) as err:
            # Valid JSON in the wrong shape (a hand-edited or foreign file).
            raise TraceFormatError(f"{path}: malformed Execution Trace ({type(err).__name__}: {err}); {_FIX}") from None
    for n, i, count, schema_text in groups:
        name = n.get("name")
        where = f"{path}:event {i}"
        inp = n["inputs"]
        try:
            schema = parse_schema(schema_text)
            args = _et_args(inp["types"], inp["values"], inp["shapes"], inp.get("strides"))
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as err:
            raise TraceFormatError(
                f"{path}: event {i} (node {n.get('id')}, {name}): malformed inputs or op_schema ({err}); "
                f"the trace is corrupt: {_FIX}"
            ) from None
        res = bind(schema, args, source="the Execution Trace")
        if isinstance(res, str):
            yield {"type": "skipped", "where": where, "op": name, "count": count, "reason": res}
            continue
        op, inputs, attrs = res
        yield {
            "type": "case",
            "model": None,
            "where": where,
            "count": count,
            "case": {"op": op, "inputs": inputs, "attrs": attrs,
                     "description": f"{path} event {i} (node {n.get('id')})"},
        }
