"""The inputs of a v2 model-ops config (``sample_inputs_func`` args and kwargs, tensor specs and
their inits) as casedb's input specs: the same kind of values their loader makes (README.md here,
"v2 model-ops configs", has the init table). Errors are ValueErrors; :class:`_Bad` carries the line
of the mapping it is in, :class:`_Opaque` marks an input casedb cannot store (listed as skipped)."""

from __future__ import annotations

import difflib
import math
from typing import Any

from casedb.cases import dtypes
from casedb.cases.presets import contiguous_strides

TENSOR_KEYS = ("shape", "stride", "storage_offset", "dtype", "device", "init", "init_args", "device_layout")
INIT_ARG_KEYS = ("low", "high", "total", "fill_value", "path", "key")
ARG_KINDS = ("tensor", "tensor_list", "cache", "module_path", "config_path", "model_id", "value", "py")
# where their model-ops configs live, as their configs write paths (their runner expands the token)
THEIR_CONFIG_DIR = "${TORCH_DEVICE_ROOT}/tests/configs/model_ops_tests/"
INITS = ("rand", "randn", "zeros", "ones", "randint", "arange", "eye", "full", "file", "xavier", "cumsum_offsets")


class _Bad(ValueError):
    """A bad input spec, with the line of the mapping it is in."""

    def __init__(self, message: str, obj=None):
        super().__init__(message)
        self.line = getattr(obj, "line", None)


class _Opaque(ValueError):
    """An input casedb cannot represent (an HF cache, module or config object)."""



def _arg(a: Any, label: str) -> dict:
    if not isinstance(a, dict) or not a:
        raise ValueError(f"{label}: each args element is a mapping with one of {', '.join(ARG_KINDS)}")
    kind = next((k for k in ARG_KINDS if k in a), None)
    if kind is None:
        raise _Bad(f"{label}: " + _unknown(next(iter(a)), ARG_KINDS), a)
    if kind in ("cache", "module_path", "config_path", "model_id"):
        raise _Opaque(f"{label}: a {kind} input (an HF cache, module or config object) is not a tensor casedb "
                      "can store")
    if len(a) != 1:
        raise ValueError(f"{label}: give one of {', '.join(ARG_KINDS)} per args element, got {', '.join(map(str, a))}")
    body = a[kind]
    if kind == "tensor" and isinstance(body, list):
        kind = "tensor_list"  # the v1 spelling; their v2 loader refuses it, casedb reads it as a list
    if kind == "tensor":
        t = tensor(body, label)
        return {"file": t["file"]} if "file" in t else {"tensor": t}
    if kind == "tensor_list":
        if not isinstance(body, list):
            raise ValueError(f"{label}: tensor_list is a list of tensor specs")
        items = [tensor(t, f"{label}[{i}]") for i, t in enumerate(body)]
        if any("file" in t for t in items):
            raise ValueError(f"{label}: init: file inside a tensor_list is not supported; give the list's "
                             "tensors another init")
        return {"tensor_list": items}
    if kind == "py":
        return {"py": body}
    return {"value": body}


def _kwarg(v: Any, label: str):
    """A keyword value: an input spec (``{value: X}`` unwrapped to X), else the plain value."""
    if isinstance(v, dict) and any(k in v for k in ARG_KINDS):
        item = _arg(v, label)
        return item["value"] if "value" in item else item
    return v


def _unknown(key, allowed) -> str:
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    return f"unknown key {key!r}" + (f" — did you mean {close[0]!r}?" if close else "") + \
        f" (allowed: {', '.join(allowed)})"


def tensor(spec: Any, label: str) -> dict:
    """One v2 tensor spec as casedb's: the same kind of values (see the README's init table), the
    recorded layout as the ``strided`` preset when it is not the contiguous one."""
    if not isinstance(spec, dict):
        raise ValueError(f"{label}: a tensor spec is a mapping with shape and dtype")
    for k in spec:
        if k not in TENSOR_KEYS:
            raise _Bad(f"{label}: " + _unknown(k, TENSOR_KEYS), spec)
    if "shape" not in spec or "dtype" not in spec:
        raise ValueError(f"{label}: a tensor spec needs shape and dtype")
    shape = spec["shape"]
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"{label}: shape must be a list of integers >= 0, got {shape!r}")
    try:
        dtype = dtypes.canonical(spec["dtype"])
    except dtypes.UnknownDtype as e:
        raise ValueError(f"{label}: {e}") from None
    init_args = spec.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise ValueError(f"{label}: init_args must be a mapping")
    for k in init_args:
        if k not in INIT_ARG_KEYS:
            raise _Bad(f"{label}: init_args: " + _unknown(k, INIT_ARG_KEYS), init_args)
    init = spec.get("init") or "rand"
    if init not in INITS:
        raise ValueError(f"{label}: unknown init {init!r} (known: {', '.join(INITS)})")
    if init == "file":
        if not init_args.get("path"):
            raise ValueError(f"{label}: init: file needs init_args.path")
        # read by casedb.cases.spec into a data tensor (values from the file, checked against shape and
        # dtype) laid out as recorded (their loader makes it contiguous; casedb keeps recorded layouts)
        return {"file": {"path": beside_config(str(init_args["path"])), "key": init_args.get("key"), "shape": shape,
                         "dtype": dtype, "as": "data", "layout": _layout(spec, shape, label)}}
    out = {"shape": shape, "dtype": dtype, **_init(init, init_args, shape, dtype, label)}
    layout = _layout(spec, shape, label)
    if layout:
        out.update(preset="strided", preset_args=layout)
    if spec.get("device_layout") is not None:
        out["device_layout"] = spec["device_layout"]
    return out


def _layout(spec: dict, shape: list, label: str) -> dict | None:
    stride = spec.get("stride")
    offset = spec.get("storage_offset", 0) or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{label}: storage_offset must be an integer >= 0, got {offset!r}")
    if stride is None:
        return {"stride": contiguous_strides(shape), "storage_offset": offset} if offset else None
    if not isinstance(stride, list) or len(stride) != len(shape) or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in stride):
        raise ValueError(f"{label}: stride must be {len(shape)} integers >= 0 (one per dimension of {shape}), "
                         f"got {stride!r}")
    if stride == contiguous_strides(shape) and not offset:
        return None
    return {"stride": stride, "storage_offset": offset}


def _init(init: str, a: dict, shape: list, dtype: str, label: str) -> dict:
    """casedb's init (and init_args) making the values theirs makes (make_tensor's rules)."""
    floating = dtype in dtypes.FLOATING or dtype in dtypes.COMPLEX
    need = {"randint": "high", "cumsum_offsets": "total", "full": "fill_value"}.get(init)
    if need and a.get(need) is None:
        raise ValueError(f"{label}: init: {init} needs init_args.{need}")
    if init == "rand":
        # make_tensor(low=0, high=1): floats in [0, 1), bools 50 %, integers randint(0, 1): zeros
        return {"init": "rand"} if floating or dtype == "bool" else {"init": "zeros"}
    if init == "randn":
        if not floating:
            raise ValueError(f"{label}: init: randn makes no {dtype} values (torch.randn is floating only)")
        return {"init": "randn"}
    if init == "randint":
        low, high = _bound(a.get("low", 0), "low", label), _bound(a["high"], "high", label)
        if dtype == "bool":
            return {"init": "rand"}
        if floating:
            return {"init": "uniform", "init_args": {"low": float(low), "high": float(high)}}
        low, high = _clamp(low, high, dtype)
        if high <= low:
            raise ValueError(f"{label}: randint needs high > low (got low={low}, high={high})")
        return {"init": "randint", "init_args": {"low": low, "high": high}}
    if init == "arange" and len(shape) != 1:
        raise ValueError(f"{label}: init: arange needs a 1-d shape, got {shape}")
    if init == "full":
        return {"init": "full", "init_args": {"fill_value": a["fill_value"]}}
    if init == "cumsum_offsets":
        return {"init": "cumsum_offsets", "init_args": {"total": a["total"]}}
    return {"init": init}  # zeros, ones, arange, eye, xavier: checked by casedb.cases.spec


def _bound(v, key: str, label: str) -> int:
    """A randint bound as their loader reads it (an integer; 3.0 is 3), else ValueError."""
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{label}: randint's init_args.{key} must be an integer, got {str(v)[:40]!r}")
    return v


def _clamp(low, high, dtype: str) -> tuple[int, int]:
    """randint bounds clamped to the dtype's range, as make_tensor clamps them."""
    import torch

    info = torch.iinfo(getattr(torch, dtype))
    return max(int(low), info.min), min(int(high), info.max)


def beside_config(path: str) -> str:
    """A path written under their config folder (``${TORCH_DEVICE_ROOT}/tests/configs/model_ops_tests/
    x.files/a.pt``) as casedb reads it: relative to the config's own folder (the file's folder stands
    for theirs; what lies outside it stays refused)."""
    return path[len(THEIR_CONFIG_DIR):] if path.startswith(THEIR_CONFIG_DIR) else path
