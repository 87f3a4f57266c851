"""A case's call identity: one key for the same call, whatever the front end spelt it.

A scan writes ``torch.nn.functional.linear(x, w, None)`` and ``torch.Tensor.to(x, torch.float32)``,
a trace ``torch.ops.aten.linear.default(x, w, None)`` and ``torch.ops.aten.to.dtype(x,
torch.float32, False, False, None)``: the same calls, different signatures (the signature keys
what a case executes, spelling included: :mod:`casedb.cases.signature`). The identity keys the call:

* the operator, :func:`casedb.cases.op_identity.op_name` (``linear``, ``to``);
* its arguments bound by name to the ATen op's schema (the overload the trace names, else the
  first whose argument kinds fit: a tensor for ``Tensor``, a ``torch.float32`` for ``ScalarType``),
  positional ones in the schema's order, a Python function's keyword names read from its own
  signature (``F.dropout(training=)`` is ATen's ``train``), ``input`` read as ``self``;
* an argument equal to the schema's default left out (``alpha=1``, ``non_blocking=False``), and
  keywords that change nothing at ATen level (``inplace=False``, ``_stacklevel``) dropped;
* the explicit seed.

A call that does not bind (no ATen op of that name, an argument it does not take, a Python
function laid out otherwise) is keyed by its operator name and its inputs as written: it is one
call with the same spelling only (``torch.Tensor.__getitem__`` and ``torch.getitem`` alike).
:data:`ADAPTERS` lays out the torch functions whose arguments differ from their ATen op's
(``F.embedding(input, weight)`` is ``aten::embedding(weight, indices)``).

The identity depends on the schemas of the torch it is computed with: a later torch may key a
stored call otherwise, which costs a missed dedupe, never a wrong one.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any

from casedb.cases import op_identity
from casedb.cases.signature import canonical_json, signature_payload

_KINDS = ("tensor", "value", "py", "tensor_list", "file")
# keyword names of torch-level functions and what the ATen schema calls them
_RENAMES = {"input": "self", "training": "train"}
# keywords of torch-level functions that change nothing at ATen level when they have this value
_INERT = {"inplace": (False,), "_stacklevel": None}
_MEMORY_FORMATS = ("torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                   "torch.channels_last_3d")
_ANY = object()


def _embedding(args: dict) -> dict | None:
    """``F.embedding(input, weight, padding_idx=None, max_norm=None, ...)`` as
    ``aten::embedding(weight, indices, padding_idx=-1, ...)`` (max_norm renormalises: no identity)."""
    if _value(args.pop("max_norm", {"value": None})) is not None:
        return None
    args.pop("norm_type", None)
    if "input" in args:
        args["indices"] = args.pop("input")
    if _value(args.get("padding_idx", {"value": None})) is None:
        args.pop("padding_idx", None)
    return args


ADAPTERS = {"torch.nn.functional.embedding": _embedding}


def identity(op: str, inputs: list, attrs: dict, seed: int | None) -> str:
    """The 64-hex-digit call identity of a normalized case (see the module docstring)."""
    bound = bind(op, inputs, attrs)
    if bound is None:
        payload = signature_payload(op_identity.op_name(op), inputs, attrs, seed)
    else:
        payload = signature_payload("aten." + bound[0], [], bound[1], seed)
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def of(case) -> str:
    """A normalized case's identity (:class:`casedb.cases.spec.Normalized`), kept on it once computed."""
    if case.identity is None:
        case.identity = identity(case.op, case.inputs, case.attrs, case.seed)
    return case.identity


def bind(op: str, inputs: list, attrs: dict) -> tuple[str, dict] | None:
    """(operator, {argument: item}) of the call bound to its ATen schema, defaults left out; None
    when it does not bind."""
    name = op_identity.op_name(op)
    if name.startswith("torch.") or not name.isidentifier():
        return None
    schemas = _schemas(name, _overload(op))
    if not schemas:
        return None
    given = _named(op, inputs, {k: _item(v) for k, v in attrs.items()})
    if given is None:
        return None
    positional, named = given
    for schema in schemas:
        args = _fit(schema, positional, named)
        if args is not None:
            return name, args
    return None


def _overload(op: str) -> str | None:
    if op.startswith("torch.ops.aten.") and op.count(".") == 4:
        return op.rsplit(".", 1)[1]
    return None


def _item(v: Any) -> dict:
    return v if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in _KINDS else {"value": v}


def _value(item: dict) -> Any:
    return item.get("value", _ANY) if isinstance(item, dict) else _ANY


def _named(op: str, inputs: list, attrs: dict) -> tuple[list, dict] | None:
    """(positional items, keyword items) with a Python function's positional arguments named by
    its signature, the op's adapter applied and inert keywords dropped."""
    params = _python_params(op)
    positional, named = list(inputs), dict(attrs)
    if params is not None:
        if len(positional) > len(params):
            return None
        named.update(zip(params, positional))
        positional = []
    adapter = ADAPTERS.get(op)
    if adapter is not None:
        if positional:
            return None
        named = adapter(named)
        if named is None:
            return None
    for key, inert in _INERT.items():
        if key in named and (inert is None or _value(named[key]) in inert):
            del named[key]
    return positional, named


@functools.lru_cache(maxsize=None)
def _python_params(op: str) -> tuple[str, ...] | None:
    """The positional parameter names of a torch-level Python function (``F.dropout``), else None."""
    if not op.startswith("torch.nn.functional."):
        return None
    import torch.nn.functional as F

    fn = getattr(F, op.rsplit(".", 1)[1], None)
    if not inspect.isfunction(fn):
        return None
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


@functools.lru_cache(maxsize=None)
def _schemas(name: str, overload: str | None) -> tuple:
    """Per overload (the named one only, if given): ((arg name, type text, default, kwarg only), ...)."""
    import torch

    try:
        packet = getattr(torch.ops.aten, name)
        names = [overload] if overload else packet.overloads()
        out = []
        for ov in names:
            if ov == "out" or ov.endswith("_out"):
                continue
            args = getattr(packet, ov)._schema.arguments
            out.append(tuple((a.name, str(a.real_type), _default(a) if a.has_default_value() else _ANY,
                              a.kwarg_only) for a in args if not a.is_out))
        return tuple(out)
    except (AttributeError, RuntimeError):
        return ()


def _default(arg) -> Any:
    value = arg.default_value
    kind = str(arg.real_type)
    if "MemoryFormat" in kind and isinstance(value, int) and 0 <= value < len(_MEMORY_FORMATS):
        return _MEMORY_FORMATS[value]
    if value is not None and not isinstance(value, (bool, int, float, str, list, tuple)):
        return str(value)  # torch.strided, torch.float32 ...: as a case spells them
    return list(value) if isinstance(value, tuple) else value


def _fit(schema: tuple, positional: list, named: dict) -> dict | None:
    """{argument: item} of the call under one overload's schema (defaults left out), or None."""
    slots = [a for a in schema if not a[3]]
    if len(positional) > len(slots):
        positional = _packed(slots, positional)
        if positional is None:
            return None
    names = {a[0] for a in schema}
    named = {(k if k in names else _RENAMES.get(k, k)): v for k, v in named.items()}
    if any(k not in names for k in named):
        return None
    given = dict(zip((a[0] for a in slots), positional))
    if set(given) & set(named):
        return None
    given.update(named)
    out = {}
    for arg_name, kind, default, _ in schema:
        if arg_name not in given:
            if default is _ANY:
                return None
            continue
        item = _as_list(kind, given[arg_name])
        if not _fits(kind, item):
            return None
        if _is_default(arg_name, item, default):
            continue
        out[arg_name] = item
    return out


def _as_list(kind: str, item: dict) -> dict:
    """An int given for an ``int[]`` argument is that one-element list (``x.mean(-1)`` is
    ``aten::mean.dim(x, [-1])``: torch reads it so)."""
    v = _value(item)
    if "List[int]" in kind and isinstance(v, int) and not isinstance(v, bool):
        return {"value": [v]}
    return item


def _is_default(arg_name: str, item: dict, default) -> bool:
    v = _value(item)
    if default is None and arg_name == "pin_memory" and v is False:  # a factory's "not pinned", spelt both ways
        return True
    return default is not _ANY and v == default and type(v) is type(default)


def _packed(slots: list, positional: list) -> list | None:
    """``x.view(2, 3)`` as ``aten::view(x, [2, 3])``: trailing ints into the list argument."""
    if len(slots) < 2 or "List[" not in slots[1][1] or "int" not in slots[1][1].lower():
        return None
    rest = [_value(i) for i in positional[1:]]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in rest):
        return None
    return [positional[0], {"value": rest}]


def _fits(kind: str, item: dict) -> bool:
    """Whether an input item can be an argument of the schema type ``kind``."""
    key = next(iter(item))
    if kind.startswith("Optional[") and _value(item) is None:
        return True
    base = kind[len("Optional["):-1] if kind.startswith("Optional[") else kind
    if base == "Tensor":
        return key in ("tensor", "file")
    if key in ("tensor", "file"):
        return False
    if base.startswith("List[") and "Tensor" in base:
        return key in ("tensor_list", "value", "py")
    if key != "value":
        return key == "py"
    v = item["value"]
    if base == "bool":
        return isinstance(v, bool)
    if base in ("int", "SymInt"):
        return isinstance(v, int) and not isinstance(v, bool)
    if base == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if base in ("Scalar", "number"):
        return isinstance(v, (int, float, bool))
    if base in ("ScalarType", "MemoryFormat", "Layout"):
        return isinstance(v, str) and v.startswith("torch.")
    if base in ("Device", "str"):
        return isinstance(v, str) and not v.startswith("torch.")
    if base.startswith("List["):
        return isinstance(v, (list, int)) and not isinstance(v, bool)
    return True
