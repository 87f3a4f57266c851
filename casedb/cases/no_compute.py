"""Calls that compute nothing: an uninitialized allocation, an alias, a conversion to what the
input already is. Such a call has nothing to judge (an ``empty`` tensor's values are whatever the
memory held; a no-op ``to`` returns its input), so every front end leaves it out the same way: the
scanner does not record it, and an import (any format) lists it as skipped with this reason.
"""

from __future__ import annotations

from casedb.cases import dtypes

UNINITIALIZED = frozenset("""
    empty empty_like empty_strided new_empty new_empty_strided empty_permuted empty_quantized
    _empty_affine_quantized _empty_per_channel_affine_quantized
""".split())
ALIASES = frozenset("detach detach_ alias lift_fresh".split())
# Tensor methods that convert to a dtype (or to nothing at all) and return the input unchanged
# when it already is what they convert to.
_METHOD_DTYPES = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64",
                  "int": "int32", "long": "int64", "bool": "bool", "short": "int16", "char": "int8",
                  "byte": "uint8"}
_CONVERSIONS = frozenset({"to", "type", "contiguous", *_METHOD_DTYPES})


def base_name(op: str) -> str:
    """``torch.ops.aten.empty_like.default`` -> ``empty_like``; ``torch.Tensor.to`` -> ``to``."""
    parts = op.split(".")
    if op.startswith("torch.ops.") and len(parts) >= 5:
        return parts[3]
    return parts[-1]


def reason(op: str, inputs: list, attrs: dict) -> str | None:
    """Why a normalized case computes nothing, or None when it computes something."""
    name = base_name(op)
    if name in UNINITIALIZED:
        return "uninitialized allocation: its values are whatever the memory held, nothing to compare"
    if name in ALIASES:
        return "alias: a new name for the same data, nothing computed"
    if name in _CONVERSIONS and (op.startswith("torch.Tensor.") or op.startswith("torch.ops.aten.")) \
            and _no_op_conversion(name, inputs, attrs):
        return "no-op conversion: the input already has that dtype and layout, it is returned as it is"
    return None


def _no_op_conversion(name: str, inputs: list, attrs: dict) -> bool:
    first = inputs[0] if inputs else None
    spec = first.get("tensor") if isinstance(first, dict) else None
    if not isinstance(spec, dict):
        return False
    if name == "contiguous":
        return not spec.get("preset")
    if name in _METHOD_DTYPES:
        return _same(spec, _METHOD_DTYPES[name])
    # to / type: a no-op only when every argument names the input's own dtype (or a device)
    words = [i.get("value") for i in inputs[1:] if isinstance(i, dict) and "value" in i]
    if len(words) != len(inputs) - 1:
        return False  # a tensor argument (to(other)) or a literal we do not read
    extra = {k: v for k, v in attrs.items() if k not in ("dtype", "device", "non_blocking")}
    if extra or attrs.get("copy") or not isinstance(attrs.get("dtype", spec["dtype"]), str):
        return False
    named = [w for w in words + [attrs.get("dtype")] if isinstance(w, str) and _is_dtype(w)]
    others = [w for w in words if not (isinstance(w, str) and (_is_dtype(w) or _is_device(w))) and w is not False]
    # (a conversion returns its input whatever its layout: only memory_format would copy)
    return not others and all(_same(spec, d) for d in named) and (bool(named) or name == "to")


def _is_dtype(word: str) -> bool:
    try:
        dtypes.canonical(word)
    except dtypes.UnknownDtype:
        return False
    return word.startswith("torch.") or word in dtypes.CANONICAL


def _is_device(word: str) -> bool:
    return word.split(":")[0] in ("cpu", "cuda", "meta", "xpu", "mps", "privateuseone") or ":" in word


def _same(spec: dict, dtype: str) -> bool:
    try:
        return dtypes.canonical(spec.get("dtype")) == dtypes.canonical(dtype)
    except dtypes.UnknownDtype:
        return False
