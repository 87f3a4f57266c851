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

Schema parsing and argument binding are :mod:`importers.op_schema`'s, shared with the Kineto
importer.
"""

from __future__ import annotations

import marshal
import re
from typing import Iterator

from importers.op_schema import bind, parse_schema, python_scalars
from importers.record import ImportRecord
from importers.trace_values import TraceFormatError, head_bytes, load_json, paused_gc, tensor_input


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
    return bool(_HEAD.search(data) and _NODES.search(data)) or (b'"nodes"' in data and b'"schema"' in data)


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
    schema_of, up = _schemas_and_parents(path, data, nodes)
    kept = _kept(nodes, schema_of, up, level)
    return _same_calls(path, nodes, schema_of, kept)


def _schemas_and_parents(path: str, data: dict, nodes: list) -> tuple[list, list]:
    """Each node's ``op_schema`` (None: not an operator) and parent index (None: a root)."""
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
    # make the walk in _kept loop forever.
    up: list = [None] * len(nodes)
    for i, n in enumerate(nodes):
        p = by_id.get(n.get("ctrl_deps", n.get("parent")))
        up[i] = None if p == i else p
    _check_acyclic(path, nodes, up)
    return schema_of, up


def _kept(nodes: list, schema_of: list, up: list, level: str) -> list[int]:
    """The top (no operator above) or leaf (no operator below) operator nodes, in call order."""
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
    return kept


def _same_calls(path: str, nodes: list, schema_of: list, kept: list[int]) -> list[tuple]:
    """Identical calls grouped: ``[(node, index, count, op_schema), ...]``."""
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


def parse(path, *, level: str = "top", max_bytes: int | None = None, **_options) -> Iterator[ImportRecord]:
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
        schema, args, note = python_scalars(schema, args, "the Execution Trace")
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
                     "description": f"{path} event {i} (node {n.get('id')}{'; ' + note if note else ''})"},
        }
