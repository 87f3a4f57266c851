"""Kineto's per-argument columns (``Input type`` / ``Input Dims`` / ``Input Strides`` /
``Concrete Inputs``) as the neutral argument tuples of :mod:`importers.op_schema`, and the dtype
of the ``Tensor[]`` elements Kineto does not record. Used by :mod:`importers.kineto`."""

from __future__ import annotations

import re
from typing import Any

from importers.trace_values import (
    FLOATING_PROFILER_DTYPES,
    NOT_RECORDED,
    PROFILER_DTYPES,
    contiguous,
    profiler_dtype,
    tensor_input,
)

_INT = re.compile(r"^[+-]?\d+$")


def _scalar(text: str):
    """A Kineto ``Concrete Inputs`` scalar ('3', '0.', '-inf', 'True') -> value, or raise."""
    if _INT.match(text):
        return int(text)
    if text == "True":
        return True
    if text == "False":
        return False
    return float(text)  # '0.', '1e-05', 'inf', 'nan'; anything else raises ValueError


def _scalar_list(text: str) -> list:
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(text)
    body = text[1:-1].strip()
    return [_scalar(x.strip()) for x in body.split(",")] if body else []


def kineto_args(types, dims, strides, concrete, list_default: tuple[str, str] | None = None
                ) -> tuple[list[tuple], str | None] | str:
    """Kineto's per-argument columns -> neutral argument tuples for ``execution_trace.bind``.

    Returns ``(args, note)`` or a skip reason. Tuples: ``("T", input)`` a tensor,
    ``("TL", input)`` a tensor list, ``("V", value)`` a recorded scalar or scalar list,
    ``("U", why, kind)`` a value Kineto did not record: ``kind`` "" for an argument it writes as
    ``""`` (why = NOT_RECORDED), "Scalar"/"ScalarList" for a scalar whose value is missing; a 0-d
    tensor whose value is written is ``("T", input, value)``. ``list_default``: (dtype, why) of
    Tensor[] elements in a call without another tensor argument (Kineto writes no element dtype).
    """
    n = len(types)
    if len(dims) != n or (strides is not None and len(strides) != n) or (
        concrete is not None and len(concrete) != n
    ):
        raise ValueError("Input type / Input Dims / Input Strides / Concrete Inputs lengths differ")
    args: list[tuple] = []
    list_dtype = None
    for j, t in enumerate(types):
        if t == "Scalar" or t == "ScalarList":
            c = concrete[j] if concrete is not None else ""
            if c == "":
                args.append(("U", f"{t} value not recorded (the trace has no Concrete Inputs)", t))
                continue
            try:
                args.append(("V", _scalar(c) if t == "Scalar" else _scalar_list(c)))
            except ValueError:
                args.append(("U", f"unreadable {t} value {c!r}", t))
        elif t == "":
            args.append(("U", NOT_RECORDED, ""))
        elif t == "TensorList":
            st = strides[j] if strides is not None else None
            items = []
            for k, shape in enumerate(dims[j]):
                spec: dict[str, Any] = {"shape": list(shape)}
                s = st[k] if st and k < len(st) else None
                if s and len(s) == len(shape) and not contiguous(shape, s):
                    spec["preset"] = "strided"
                    spec["preset_args"] = {"stride": list(s), "storage_offset": 0}
                items.append(spec)
            args.append(("TL", {"tensor_list": items}))
        else:
            st = strides[j] if strides is not None else None
            ti = tensor_input(t, dims[j], st)
            if isinstance(ti, str):
                return ti
            if list_dtype is None:
                list_dtype = ti["tensor"]["dtype"]
            value = _zero_dim_value(dims[j], concrete[j] if concrete is not None else "")
            args.append(("T", ti) if value is None else ("T", ti, value))
    # Kineto writes "TensorList" instead of the element dtypes. Use the dtype of another tensor
    # argument of the same call when there is one; otherwise list_default (import --dtype, else
    # the trace's dominant floating dtype), said in the description; without one, leave dtype
    # out, which means the model's default dtype.
    return args, _list_dtypes(args, list_dtype, list_default)


def _list_dtypes(args: list[tuple], dtype: str | None, default: tuple[str, str] | None) -> str | None:
    """Give the Tensor[] elements of ``args`` ``dtype`` (another tensor argument's), else the
    default's; the description's note when it is not another argument's."""
    why = note = None
    if dtype is None:
        dtype, why = default or (None, "the model default dtype is used")
    for a in args:
        if a[0] == "TL" and a[1]["tensor_list"]:
            for spec in a[1]["tensor_list"]:
                if dtype is not None:
                    spec["dtype"] = dtype
            if why is not None:
                note = f"Kineto does not record Tensor[] element dtypes: {dtype + ', ' if dtype else ''}{why}"
    return note


def _zero_dim_value(shape, text):
    """The value Kineto wrote for a 0-d tensor argument (a Python number it was called with), or None."""
    if shape or not text:
        return None
    try:
        value = _scalar(text)
    except ValueError:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def list_dtype(groups: list[tuple], dtype: str | None) -> tuple[str, str] | None:
    """(dtype, why) for Tensor[] elements Kineto wrote no dtype for: ``dtype`` (import --dtype),
    else the trace's dominant floating dtype, else None."""
    if dtype is not None:
        return profiler_dtype(dtype), "set by import --dtype"
    found = dominant_dtype(groups)
    return (found, "the dominant floating dtype of the trace's tensors") if found else None


def dominant_dtype(groups: list[tuple]) -> str | None:
    """The floating dtype most tensor arguments of the trace's calls have (each call counted as
    often as it ran), or None: what the model's other tensors use."""
    seen: dict[str, int] = {}
    for _name, _i, count, cols in groups:
        for t in cols[0] if cols is not None else ():
            dt = PROFILER_DTYPES.get(t) if t.__class__ is str else None
            if dt in FLOATING_PROFILER_DTYPES:
                seen[dt] = seen.get(dt, 0) + count
    return max(seen, key=seen.__getitem__) if seen else None


_JOINS = {"aten::cat": "cat", "aten::concat": "cat", "aten::concatenate": "cat", "aten::stack": "stack"}
LOOKAHEAD = 64  # distinct calls searched for the one that takes a join's result


def consumer_dtypes(groups: list[tuple]) -> dict[int, tuple[str, str]]:
    """For a cat / stack with no other tensor argument (position in ``groups``, the first-call
    ordered ``(name, index, count, columns)`` of :func:`importers.kineto._group`): the dtype of
    the first later call that takes a tensor of the shape it returns, and why. A bf16 model's
    float32 rotary ``cat((freqs, freqs))`` is read by a float32 ``cos``; its bf16 cache by bf16 ops."""
    found: dict[int, tuple[str, str]] = {}
    for g, (name, _i, _count, cols) in enumerate(groups):
        shape = _joined_shape(name, cols)
        if shape is None:
            continue
        for later_name, later_i, _c, later_cols in groups[g + 1:g + 1 + LOOKAHEAD]:
            dtype = next((PROFILER_DTYPES.get(t) for t, d in zip(later_cols[0], later_cols[1])
                          if d == shape and PROFILER_DTYPES.get(t) in FLOATING_PROFILER_DTYPES), None) \
                if later_cols is not None else None
            if dtype is not None:
                found[g] = (dtype, f"the dtype of the next call taking its result ({later_name}, event {later_i})")
                break
    return found


def _joined_shape(name: str, cols) -> list | None:
    """The shape a cat / stack of a Tensor[] alone (no tensor argument with a dtype) returns, or None."""
    join = _JOINS.get(name)
    if join is None or cols is None or "TensorList" not in cols[0]:
        return None
    types, dims, _strides, concrete = cols
    if any(t in PROFILER_DTYPES for t in types):
        return None
    shapes = [list(s) for s in dims[types.index("TensorList")] if list(s) != [0]]  # legacy empty cat inputs
    try:
        dim = int(concrete[1]) if concrete is not None and len(concrete) > 1 and concrete[1] != "" else 0
    except ValueError:
        return None
    if not shapes or any(len(s) != len(shapes[0]) for s in shapes):
        return None
    out = list(shapes[0])
    if join == "stack":
        dim = dim + len(out) + 1 if dim < 0 else dim
        return out[:dim] + [len(shapes)] + out[dim:] if 0 <= dim <= len(out) else None
    dim = dim + len(out) if dim < 0 else dim
    if not 0 <= dim < len(out):
        return None
    out[dim] = sum(s[dim] for s in shapes)
    return out
