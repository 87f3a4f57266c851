"""A case's inputs and keyword values as stored: tensor specs (shape, dtype, init, preset), plain
values and ``py:`` literals, ``data:`` tensors and ``file:`` tensors (both kept as blobs).

Part of reading a case (:mod:`casedb.cases.spec`); every error is a ValueError naming the input
(``inputs[0]``, ``attrs.dim``), which the case reader turns into an InputError with the place.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

from casedb.cases import blobs, dtypes, presets, safe_eval
from casedb.errors import InputError
from casedb.names import unknown_key_message

INPUT_KINDS = ("tensor", "value", "py", "tensor_list", "file")
TENSOR_KEYS = ("shape", "init", "init_args", "dtype", "preset", "preset_args", "data", "device_layout")
INITS = ("rand", "randn", "zeros", "ones", "arange", "randint", "uniform", "data", "full", "eye", "xavier",
         "cumsum_offsets")
INIT_ARGS = {"randint": ("low", "high"), "uniform": ("low", "high"), "arange": ("start", "step"),
             "randn": ("mean", "std"), "rand": (), "zeros": (), "ones": (), "data": ("data",),
             "full": ("fill_value",), "eye": (), "xavier": (), "cumsum_offsets": ("total",)}

# Bounds on what one case may hold (a few bytes of manifest must not cost gigabytes downstream):
# a _foreach op over every parameter of a large model lists a few thousand tensors; torch's
# kernels take at most 25 dimensions and real tensors have fewer than 10.
MAX_TENSOR_LIST = 10_000
MAX_RANK = 64


class InputContext:
    """Where a case's inputs are read from, and the blobs their data and file tensors give."""

    def __init__(self, source, base_dir, case_dtype, allow_outside=False, max_bytes=None):
        self.source = source
        self.base_dir = base_dir
        self.case_dtype = case_dtype
        self.allow_outside = allow_outside
        self.max_bytes = max_bytes
        self.blobs: dict[str, bytes] = {}


def read_input(item: Any, ctx: InputContext, label: str) -> dict:
    if not isinstance(item, dict) or len(item) != 1:
        keys = list(item) if isinstance(item, dict) else type(item).__name__
        raise ValueError(f"{label}: each input is a mapping with exactly one of {', '.join(INPUT_KINDS)} (got {keys})")
    kind, body = next(iter(item.items()))
    if kind not in INPUT_KINDS:
        raise ValueError(f"{label}: " + unknown_key_message(kind, INPUT_KINDS))
    if kind == "tensor" and isinstance(body, list):
        kind = "tensor_list"  # the RFC implementation's loader reads `tensor: [specs]` as a list of tensors
    if kind == "tensor":
        return {"tensor": _tensor(body, ctx, label)}
    if kind == "tensor_list":
        if not isinstance(body, list):
            raise ValueError(f"{label}: tensor_list must be a list of tensor specs")
        if len(body) > MAX_TENSOR_LIST:
            raise ValueError(f"{label}: tensor_list holds {len(body):,} tensors; a case takes at most "
                             f"{MAX_TENSOR_LIST:,} in one list")
        return {"tensor_list": [_tensor(t, ctx, f"{label}[{i}]") for i, t in enumerate(body)]}
    if kind == "value":
        return value_item(body, label)
    if kind == "py":
        return {"py": safe_eval.canonical_py(body)}
    if isinstance(body, dict) and body.get("as") == "data":
        # a tensor spec whose values a file holds (the RFC implementation's init: file): a data tensor
        f = _file(body, ctx, label)
        t = {"shape": f["shape"], "dtype": f["dtype"], "init": "data", "blob": f["blob"]}
        if body.get("layout"):
            t.update(preset="strided", preset_args=body["layout"])
        return {"tensor": t}
    return {"file": _file(body, ctx, label)}


def _plain_value(v: Any, label: str) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain_value(x, label) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain_value(x, label) for k, x in v.items()}
    raise ValueError(f"{label}: {type(v).__name__} values are not supported (use numbers, strings, lists, null or py:)")


def literal_string(text: str) -> Any:
    """What a string value means in the RFC implementation's dialect.

    Its loader reads string values as Python literals (``"(1, 64)"`` is a tuple, ``"None"`` is
    None) and keeps any other string; so does casedb, with the ``py:`` parser (never ``eval``),
    which also knows ``inf``/``-inf``/``nan``. ``torch.<name>`` strings stay strings: the runner
    turns them into dtypes, layouts or memory formats, as it always has.
    """
    if text.startswith("torch."):
        return text
    try:
        return safe_eval.parse_py_literal(text)
    except (ValueError, SyntaxError, RecursionError):  # not a literal: a plain string (mean, cuda:0)
        return text


def string_spelling(text: str) -> str:
    """How to write the string ``text`` in a manifest so that it reads back as that string."""
    back = literal_string(text)
    return text if isinstance(back, str) and back == text else safe_eval.format_py_literal(text)


def _json_native(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return type(v) is list and all(_json_native(x) for x in v)


def value_item(v: Any, label: str, key: str | None = None) -> dict:
    """A ``value:`` (or a plain keyword value) as stored: ``{"value": v}`` or ``{"py": text}``.

    A string is read by :func:`literal_string`; what it stands for is stored as if written
    natively (``"None"`` as null, ``"[1, 2]"`` as a list, ``"-inf"`` as -.inf), and what has no
    YAML spelling (tuples, Ellipsis, slices, torch dtypes inside a literal) as the ``py:`` text.
    A ``dtype`` keyword spelled like a dtype (``fp16``) becomes ``torch.<dtype>``, as the RFC's
    loader reads it.
    """
    if isinstance(v, str):
        if key == "dtype" and not v.startswith("torch."):
            try:
                return {"value": "torch." + dtypes.canonical(v)}
            except dtypes.UnknownDtype:
                pass
        v = literal_string(v)
        if not _json_native(v):
            return {"py": safe_eval.format_py_literal(v)}
    return {"value": _plain_value(v, label)}


def _shape(shape: Any, label: str) -> list[int]:
    if not isinstance(shape, (list, tuple)):
        raise ValueError(f"{label}: shape must be a list of non-negative integers, got {shape!r}")
    if len(shape) > MAX_RANK:
        raise ValueError(f"{label}: shape has {len(shape):,} dimensions; a tensor has at most {MAX_RANK}")
    out = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int):
            raise ValueError(f"{label}: shape {list(shape)} has {d!r}; dimensions must be non-negative integers")
        if d < 0:
            raise ValueError(f"{label}: shape {list(shape)} has negative dimension {d}; dimensions must be >= 0")
        out.append(d)
    return out


def _tensor(spec: Any, ctx: InputContext, label: str) -> dict:
    if not isinstance(spec, dict):
        raise ValueError(f"{label}: a tensor spec is a mapping with 'shape' (and optionally {', '.join(TENSOR_KEYS[1:])})")
    for k in spec:
        if k not in TENSOR_KEYS:
            raise ValueError(f"{label}: " + unknown_key_message(k, TENSOR_KEYS))
    try:
        dtype = dtypes.canonical(spec["dtype"]) if spec.get("dtype") is not None else ctx.case_dtype
    except dtypes.UnknownDtype as e:
        raise ValueError(f"{label}: {e}") from None
    init = spec.get("init")
    data = spec.get("data")
    init_args = spec.get("init_args") or {}
    if init == "data" and data is None:
        data = init_args.get("data") if isinstance(init_args, dict) else init_args
        init_args = {}
    if data is not None and init in (None, "data"):
        init = "data"
    if init is None:
        init = "randn" if dtype in dtypes.FLOATING or dtype in dtypes.COMPLEX else ("rand" if dtype == "bool" else "randint")
    if init not in INITS:
        raise ValueError(f"{label}: unknown init {init!r}; allowed: {', '.join(INITS)}")
    if not isinstance(init_args, dict):
        raise ValueError(f"{label}: init_args must be a mapping")
    for k in init_args:
        if k not in INIT_ARGS[init]:
            raise ValueError(f"{label}: init {init!r} does not take {k!r} (it takes: {', '.join(INIT_ARGS[init]) or 'nothing'})")
    if init == "data":
        if data is None:
            raise ValueError(f"{label}: init: data needs the values in 'data:'")
        out = _data_tensor(data, dtype, spec.get("shape"), ctx, label)
    else:
        if "shape" not in spec:
            raise ValueError(f"{label}: tensor needs a 'shape' (use [] for a 0-d tensor)")
        out = {"shape": _shape(spec["shape"], label), "dtype": dtype, "init": init}
        args = _init_args(init, init_args, dtype, out["shape"], label)
        if args:
            out["init_args"] = args
    if spec.get("device_layout") is not None:
        out["device_layout"] = _device_layout(spec["device_layout"], label)
    preset = spec.get("preset")
    if preset is not None:
        pargs = spec.get("preset_args") or {}
        if not isinstance(pargs, dict):
            raise ValueError(f"{label}: preset_args must be a mapping")
        problem = presets.check_args(str(preset), pargs)
        if problem:
            raise ValueError(f"{label}: {problem}")
        out["preset"] = str(preset)
        if pargs:
            out["preset_args"] = {k: _plain_value(v, label) for k, v in pargs.items()}
    elif spec.get("preset_args"):
        raise ValueError(f"{label}: preset_args given without a preset")
    return out


def _init_args(init: str, given: dict, dtype: str, shape: list, label: str) -> dict:
    """An init's arguments as numbers, with the defaults of randint and uniform; checked for the shape."""
    args = {k: _number(v, f"{label}.init_args.{k}") for k, v in given.items()}
    if init == "randint":
        args.setdefault("low", 0)
        args.setdefault("high", 2 if dtype == "bool" else 10)
        if args["high"] <= args["low"]:
            raise ValueError(f"{label}: randint needs high > low (got low={args['low']}, high={args['high']})")
    elif init == "uniform":
        args.setdefault("low", 0.0)
        args.setdefault("high", 1.0)
    problem = _init_problem(init, shape, args)
    if problem:
        raise ValueError(f"{label}: {problem}")
    return args


def _init_problem(init: str, shape: list, args: dict) -> str | None:
    """What is wrong with an init's arguments for this shape (the inits that need some), else None."""
    if init == "full" and "fill_value" not in args:
        return "init 'full' needs init_args.fill_value"
    if init == "eye" and (len(shape) != 2 or shape[0] != shape[1]):
        return f"init 'eye' needs a square 2-d shape, got {shape}"
    if init == "xavier" and len(shape) < 2:
        return f"init 'xavier' needs at least 2 dimensions (fan in and out), got {shape}"
    if init == "cumsum_offsets":
        total = args.get("total")
        if isinstance(total, bool) or not isinstance(total, int) or total < 0 or len(shape) != 1:
            return (f"init 'cumsum_offsets' needs a 1-d shape and init_args.total, an integer >= 0 "
                    f"(got {shape}, {total!r})")
    return None


def _device_layout(v: Any, label: str) -> dict:
    """A device backend's layout of the tensor (the RFC implementation's ``device_layout``): kept with
    it and handed to the target (casedb.cases.materialize.DEVICE_LAYOUT_HOOKS); the CPU ignores it."""
    if not isinstance(v, dict) or set(v) != {"device_size", "stride_map", "device_dtype"}:
        raise ValueError(f"{label}: device_layout is {{device_size: [int], stride_map: [int], device_dtype: str}}")
    size, smap = v["device_size"], v["stride_map"]
    for key, xs in (("device_size", size), ("stride_map", smap)):
        if not isinstance(xs, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in xs):
            raise ValueError(f"{label}: device_layout.{key} must be a list of integers, got {xs!r}")
    if len(size) != len(smap) or not isinstance(v["device_dtype"], str):
        raise ValueError(f"{label}: device_layout needs device_size and stride_map of one length and a "
                         "device_dtype name")
    return {"device_size": size, "stride_map": smap, "device_dtype": v["device_dtype"]}


def _number(v, label):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{label}: must be a number, got {v!r}")
    return v


def _store_blob(t, ctx: InputContext) -> str:
    data = blobs.encode(t)
    sha = hashlib.sha256(data).hexdigest()
    ctx.blobs[sha] = data
    return sha


def _data_tensor(data, dtype: str, shape, ctx: InputContext, label: str) -> dict:
    import torch

    try:
        t = torch.tensor(data, dtype=getattr(torch, dtype))
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{label}: data is not a rectangular list of numbers for dtype {dtype}: {e}") from None
    if shape is not None:
        want = _shape(shape, label)
        if list(t.shape) != want:
            if t.numel() == math.prod(want):
                t = t.reshape(want)
            else:
                raise ValueError(f"{label}: data has shape {list(t.shape)} but shape says {want}")
    return {"shape": list(t.shape), "dtype": dtype, "init": "data", "blob": _store_blob(t, ctx)}


def _file(body, ctx: InputContext, label: str) -> dict:
    """A ``file:`` input: a tensor saved by ``torch.save``, read from below the manifest's folder
    (unless ``--allow-outside``), a regular file within the size cap, loaded ``weights_only``."""
    import torch

    from casedb import files

    path_text = body.get("path") if isinstance(body, dict) else body
    if not isinstance(path_text, str) or not path_text.strip():
        raise ValueError(f"{label}: file: takes a path to a .pt, .npy or .safetensors file relative to the manifest")
    key = body.get("key") if isinstance(body, dict) else None
    base = Path(ctx.base_dir) if ctx.base_dir is not None else Path.cwd()
    path = Path(path_text)
    if not path.is_absolute():
        path = base / path
    cap = files.MAX_INPUT_BYTES if ctx.max_bytes is None else ctx.max_bytes
    try:
        # opened once; what was opened (not what the name resolved to before) must lie below the
        # folder: `..`, links and a link swapped meanwhile may not lead out of it
        f = files.open_below(path, None if ctx.allow_outside else base, cap)
    except InputError as e:
        raise ValueError(f"{label}: file {path_text!r} {e.message}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        try:
            t = _load_keyed(f, path, key, torch)
        except ValueError as e:
            raise ValueError(f"{label}: cannot load {path_text!r} as a tensor: {e}") from None
        except Exception as e:  # torch raises many types for a bad file
            raise ValueError(f"{label}: cannot load {path_text!r} as a tensor: {type(e).__name__}: {e}") from None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{label}: {path_text!r} holds a {type(t).__name__}, not a tensor")
    # sized on its shape before it is made contiguous: an expanded view of a tiny storage
    nbytes = t.numel() * t.element_size()
    if nbytes > cap:
        raise ValueError(f"{label}: {path_text!r} holds a tensor of {nbytes:,} bytes, over "
                         f"the {cap:,}-byte limit on one input (casedb import --max-input-mb)")
    try:
        files.check_tensor_bomb(path, size, nbytes)
    except InputError as e:
        raise ValueError(f"{label}: {path_text!r} {e.message}") from None
    dtype = str(t.dtype).replace("torch.", "")
    want = (body.get("shape"), body.get("dtype")) if isinstance(body, dict) else (None, None)
    if want[0] is not None and (list(want[0]) != list(t.shape) or dtypes.canonical(want[1] or dtype) != dtype):
        raise ValueError(f"{label}: {path_text!r} holds a {dtype} tensor of shape {list(t.shape)}, but the "
                         f"spec says {want[1]} {list(want[0])}")
    return {"blob": _store_blob(t, ctx), "shape": _shape(list(t.shape), label), "dtype": dtype, "path": path_text}


def _load_keyed(f, path: Path, key, torch):
    """The tensor of a .npy (no pickles), .safetensors or torch.save file; ``key`` picks one
    from a file holding several (a safetensors file or a saved dict)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        import numpy

        return torch.from_numpy(numpy.load(f, allow_pickle=False).copy())
    if suffix == ".safetensors":
        from safetensors.torch import load

        found = load(f.read())
    else:
        found = _load_tensor(f, torch)
    if not isinstance(found, dict):
        return found
    if key is None and len(found) == 1:
        key = next(iter(found))
    if key not in found:
        raise ValueError(f"it holds {len(found)} tensors ({', '.join(map(str, list(found)[:8]))}); name one with "
                         "init_args.key" if key is None else f"it has no tensor {key!r}")
    return found[key]


def _load_tensor(f, torch):
    """torch.load of an open .pt file, checked first to be what torch.save writes: a zip whose
    entries are stored, not compressed, so loading needs no more memory than the file's size."""
    import zipfile

    size = f.seek(0, 2)
    f.seek(0)
    if not zipfile.is_zipfile(f):
        raise ValueError("not a .pt file written by torch.save (a zip archive); save it again with torch.save")
    f.seek(0)
    with zipfile.ZipFile(f) as z:
        infos = z.infolist()
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos) or sum(i.file_size for i in infos) > size:
        raise ValueError("its zip entries are compressed or larger than the file, which torch.save never "
                         "writes; save it again with torch.save")
    f.seek(0)
    return torch.load(f, map_location="cpu", weights_only=True)
