"""Validate and normalize one case (RFC-0186 schema, plus what real manifests and traces use).

Input: a case mapping as written in a manifest (or produced by an importer), the model's
defaults and where it came from. Output: a :class:`Normalized` — the executed part (``op``,
``inputs``, ``attrs``, explicit ``seed``: signed by :mod:`casedb.cases.signature`) and the
occurrence part (name, description, tolerances, marks, ``skip_if``, expectations), plus the
blobs that data/file tensors need. The normalization rules are in :mod:`casedb.cases.signature`.

Every error names the place (``file:line``), the case and what is allowed.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casedb.cases import blobs, dtypes, marks as marks_mod, presets, safe_eval, signature as sig_mod
from casedb.errors import InputError

CASE_KEYS = ("name", "op", "inputs", "attrs", "kwmap", "description", "expects_error", "marks",
             "skip_if", "dtype", "seed", "rtol", "atol", "xfail_if", "xfail_reason", "count")
DEFAULT_KEYS = ("dtype", "seed", "rtol", "atol")
INPUT_KINDS = ("tensor", "value", "py", "tensor_list", "file")
TENSOR_KEYS = ("shape", "init", "init_args", "dtype", "preset", "preset_args", "data", "device_layout")
INITS = ("rand", "randn", "zeros", "ones", "arange", "randint", "uniform", "data", "full", "eye", "xavier",
         "cumsum_offsets")
INIT_ARGS = {"randint": ("low", "high"), "uniform": ("low", "high"), "arange": ("start", "step"),
             "randn": ("mean", "std"), "rand": (), "zeros": (), "ones": (), "data": ("data",),
             "full": ("fill_value",), "eye": (), "xavier": (), "cumsum_offsets": ("total",)}
ERROR_TYPES = ("RuntimeError", "ValueError", "TypeError", "AssertionError", "IndexError",
               "KeyError", "NotImplementedError", "ZeroDivisionError", "OverflowError",
               "AttributeError", "Exception", "torch.OutOfMemoryError", "OutOfMemoryError",
               "torch._dynamo.exc.Unsupported", "BackendCompilerFailed", "InductorError")
_DEVICE = re.compile(r"^(cpu|cuda|xpu|mps|meta|hpu|spyre|privateuseone|[a-z_]+)(:\d+)?$")
# Bounds on what one case may hold (a few bytes of manifest must not cost gigabytes downstream):
# a _foreach op over every parameter of a large model lists a few thousand tensors; torch's
# kernels take at most 25 dimensions and real tensors have fewer than 10.
MAX_TENSOR_LIST = 10_000
MAX_RANK = 64


@dataclass
class Normalized:
    signature: str
    op: str
    inputs: list
    attrs: dict
    seed: int | None
    dtype: str                      # the dtype the case computes in (derived from its tensors)
    derived_marks: list[str]
    # occurrence (per model)
    name: str | None
    description: str | None
    marks: list[str]
    declared_dtype: str | None      # the case's own `dtype:` override, if it had one
    rtol: float | None              # the case's own tolerance (None: casedb.judge.numerics decides)
    atol: float | None
    skip_if: list[dict] | None
    expects_error: dict | None
    xfail: dict | None
    blobs: dict[str, bytes] = field(default_factory=dict)


def line_of(obj) -> int | None:
    return getattr(obj, "line", None)


def _where(source: str | None, obj, fallback: str | None = None) -> str | None:
    line = line_of(obj)
    if source and line:
        return f"{source}:{line}"
    return fallback or source


def unknown_key_message(key: str, allowed) -> str:
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    hint = f" — did you mean {close[0]!r}?" if close else ""
    return f"unknown key {key!r}{hint} (allowed: {', '.join(allowed)})"


def normalize_op(op: Any) -> str:
    if not isinstance(op, str) or not op.strip():
        raise ValueError("'op' must be a non-empty string such as torch.add or torch.ops.aten.mm.default")
    op = op.strip()
    if op.startswith("aten::"):
        rest = op[len("aten::"):]
        return "torch.ops.aten." + rest.replace("::", ".")
    if op.startswith("aten."):
        return "torch.ops." + op
    if op.startswith("F."):
        return "torch.nn.functional." + op[2:]
    return op


def _refuse_unsafe_op(op: str) -> None:
    """Ops are tensor operations: a name that reaches os.system, a file writer, a module loader
    or process-wide state through torch — ``torch.ops.aten.from_file`` as much as ``torch.from_file``
    — is refused at import (casedb.cases.ops and casedb.cases.dispatcher have the rule; the run checks again)."""
    from casedb.cases.ops import UnsafeOpError, refuse_unsafe

    try:
        refuse_unsafe(op)
    except UnsafeOpError as e:
        raise ValueError(str(e)) from None


def normalize_defaults(defaults: Any, where: str | None) -> dict:
    if defaults is None:
        return {}
    if not isinstance(defaults, dict):
        raise InputError("'default' must be a mapping of dtype, seed, rtol, atol", where=where)
    out = {}
    for k, v in defaults.items():
        if k not in DEFAULT_KEYS:
            raise InputError(unknown_key_message(k, DEFAULT_KEYS) + " in 'default'", where=_where(where, defaults, where))
    try:
        if defaults.get("dtype") is not None:
            out["dtype"] = dtypes.canonical(defaults["dtype"])
        if defaults.get("seed") is not None:
            out["seed"] = _int(defaults["seed"], "seed")
        for k in ("rtol", "atol"):
            if defaults.get(k) is not None:
                out[k] = _tol(defaults[k], k)
    except (ValueError, dtypes.UnknownDtype) as e:
        raise InputError(f"in 'default': {e}", where=where) from None
    return out


class _Ctx:
    def __init__(self, source, base_dir, case_dtype, allow_outside=False, max_bytes=None):
        self.source = source
        self.base_dir = base_dir
        self.case_dtype = case_dtype
        self.allow_outside = allow_outside
        self.max_bytes = max_bytes
        self.blobs: dict[str, bytes] = {}


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: Any, what: str) -> None:
    """Raise ValueError if a string in `value` holds a lone surrogate (JSON's "\\ud800" escape,
    an undecodable file name): it is not Unicode text, and SQLite cannot store it."""
    if isinstance(value, str):
        hit = _SURROGATE.search(value)
        if hit:
            raise ValueError(f"{what} holds the lone surrogate \\u{ord(hit.group()):04x}, which is not a "
                             "Unicode character; fix the text")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, what)
            check_text(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_text(v, what)


def normalize_case(case: Any, defaults: dict, *, source: str | None = None, where: str | None = None,
                   base_dir: Path | None = None, allow_outside: bool = False,
                   max_bytes: int | None = None) -> Normalized:
    """Validate one case mapping and return its normalized form (raises InputError).

    ``file:`` inputs are read from below `base_dir` only, unless `allow_outside`; `max_bytes`
    caps each such file (default ``importers.files.MAX_INPUT_BYTES``)."""
    where = _where(source, case, where)
    if not isinstance(case, dict):
        raise InputError(f"a case must be a mapping with at least 'op' and 'inputs', got {type(case).__name__}", where=where)
    name = case.get("name")
    if name is not None and not isinstance(name, (str, int)):
        raise InputError("'name' must be a string", where=where)
    name = None if name is None else str(name)
    try:
        check_text(name, "'name'")
    except ValueError as e:
        raise InputError(str(e), where=where, case=name) from None
    try:
        for k in case:
            if k not in CASE_KEYS:
                raise ValueError(unknown_key_message(k, CASE_KEYS))
        if "op" not in case:
            raise ValueError("missing 'op' (e.g. op: torch.add)")
        op = normalize_op(case["op"])
        _refuse_unsafe_op(op)
        declared = dtypes.canonical(case["dtype"]) if case.get("dtype") is not None else None
        case_dtype = declared or dtypes.canonical(defaults.get("dtype") or "float32")
        ctx = _Ctx(source, base_dir, case_dtype, allow_outside, max_bytes)
        raw_inputs = case.get("inputs", [])
        if raw_inputs is None:
            raw_inputs = []
        if isinstance(raw_inputs, dict):
            raise ValueError("'inputs' must be a list of {tensor|value|py|tensor_list|file: ...} items, not a mapping")
        if not isinstance(raw_inputs, list):
            raise ValueError("'inputs' must be a list")
        inputs = [_input(item, ctx, f"inputs[{i}]") for i, item in enumerate(raw_inputs)]
        if "attrs" in case and "kwmap" in case:
            raise ValueError("give keyword arguments in 'attrs' or 'kwmap', not both")
        raw_attrs = case.get("attrs", case.get("kwmap")) or {}
        if not isinstance(raw_attrs, dict):
            raise ValueError("'attrs' must be a mapping of keyword arguments")
        attrs = {}
        for k, v in raw_attrs.items():
            if not isinstance(k, str) or not k.isidentifier():
                raise ValueError(f"keyword argument name {k!r} is not an identifier")
            if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in INPUT_KINDS:
                attrs[k] = _input(v, ctx, f"attrs.{k}")
            else:
                item = _value_item(v, f"attrs.{k}", key=k)
                attrs[k] = item["value"] if "value" in item else item
        seed = _int(case["seed"], "seed") if case.get("seed") is not None else None
        if "count" in case and (isinstance(case["count"], bool) or not isinstance(case["count"], int) or case["count"] < 1):
            raise ValueError(f"'count' (calls of this case in the model) must be a positive integer, got {case['count']!r}")
        # the case's own tolerance only: the rest is casedb.judge.numerics' (per compared dtype, at run time)
        rtol = _tol(case["rtol"], "rtol") if case.get("rtol") is not None else None
        atol = _tol(case["atol"], "atol") if case.get("atol") is not None else None
        occ_marks = _marks(case.get("marks"))
        skip_if = _conditions(case.get("skip_if"), "skip_if")
        xfail = _xfail(case.get("xfail_if"), case.get("xfail_reason"))
        expects = _expects(case.get("expects_error"))
        description = case.get("description")
        if description is not None:
            description = str(description).rstrip("\n")
        check_text(description, "'description'")
        for label, value in (("'skip_if'", skip_if), ("'xfail_if'", xfail), ("'expects_error'", expects)):
            if value is not None:
                check_text(value, label)
        key = sig_mod.signature(op, inputs, attrs, seed)
    except UnicodeEncodeError as e:  # a lone surrogate in op, inputs or attrs (signing encodes them)
        raise InputError(f"op, inputs or attrs hold the lone surrogate \\u{ord(e.object[e.start]):04x}, which "
                         "is not a Unicode character; fix the text", where=where, case=name) from None
    except (ValueError, dtypes.UnknownDtype, safe_eval.UnsafeExpression) as e:
        raise InputError(str(e), where=where, case=name) from None
    except InputError as e:
        e.case = e.case or name
        raise
    except RecursionError:
        raise InputError("nested too deeply to read; a case needs far fewer levels", where=where, case=name) from None
    computes = computed_dtype(inputs, attrs, case_dtype)
    derived = marks_mod.derive(inputs, attrs)
    # A derived mark written into a manifest (as `casedb export` does) is not a hand-written one.
    occ_marks = [m for m in occ_marks if m not in derived]
    return Normalized(
        signature=key, op=op, inputs=inputs, attrs=attrs, seed=seed, dtype=computes,
        derived_marks=derived, name=name, description=description,
        marks=occ_marks, declared_dtype=declared, rtol=rtol, atol=atol, skip_if=skip_if,
        expects_error=expects, xfail=xfail, blobs=ctx.blobs,
    )


def computed_dtype(inputs: list, attrs: dict, case_dtype: str) -> str:
    """The dtype a case computes in: its floating tensors' promotion, else its first tensor's,
    else (no tensors) the case's own dtype."""
    tensors = list(marks_mod.iter_tensors(inputs, attrs))
    return dtypes.promote_floating(t["dtype"] for t in tensors) or (tensors[0]["dtype"] if tensors else case_dtype)


# ----------------------------------------------------------------------------------- inputs

def _input(item: Any, ctx: _Ctx, label: str) -> dict:
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
        return _value_item(body, label)
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


def _value_item(v: Any, label: str, key: str | None = None) -> dict:
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


def _tensor(spec: Any, ctx: _Ctx, label: str) -> dict:
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
        args = {k: _number(v, f"{label}.init_args.{k}") for k, v in init_args.items()}
        if init == "randint":
            args.setdefault("low", 0)
            args.setdefault("high", 2 if dtype == "bool" else 10)
            if args["high"] <= args["low"]:
                raise ValueError(f"{label}: randint needs high > low (got low={args['low']}, high={args['high']})")
        elif init == "uniform":
            args.setdefault("low", 0.0)
            args.setdefault("high", 1.0)
        problem = _init_problem(init, out["shape"], args)
        if problem:
            raise ValueError(f"{label}: {problem}")
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


def _int(v, label):
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"'{label}' must be an integer, got {v!r}")
    return v


def _tol(v, label):
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ValueError(f"'{label}' must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or math.isnan(v):
        raise ValueError(f"'{label}' must be a non-negative number, got {v!r}")
    return float(v)


def _store_blob(t, ctx: _Ctx) -> str:
    data = blobs.encode(t)
    sha = hashlib.sha256(data).hexdigest()
    ctx.blobs[sha] = data
    return sha


def _data_tensor(data, dtype: str, shape, ctx: _Ctx, label: str) -> dict:
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


def _file(body, ctx: _Ctx, label: str) -> dict:
    """A ``file:`` input: a tensor saved by ``torch.save``, read from below the manifest's folder
    (unless ``--allow-outside``), a regular file within the size cap, loaded ``weights_only``."""
    import torch

    from importers import files

    path_text = body.get("path") if isinstance(body, dict) else body
    if not isinstance(path_text, str) or not path_text.strip():
        raise ValueError(f"{label}: file: takes a path to a .pt, .npy or .safetensors file relative to the manifest")
    key = body.get("key") if isinstance(body, dict) else None
    base = Path(ctx.base_dir) if ctx.base_dir is not None else Path.cwd()
    path = Path(path_text)
    if not path.is_absolute():
        path = base / path
    if not ctx.allow_outside:
        # Resolved first: `..` and symlinks may not lead out of the folder either.
        if not path.resolve().is_relative_to(base.resolve()):
            raise ValueError(f"{label}: file {path_text!r} is outside the manifest's folder {base}; file: inputs "
                             "are read only from below it (casedb import --allow-outside reads it, if you trust "
                             "this manifest)")
    if not path.exists():
        raise ValueError(f"{label}: file {path_text!r} not found (looked at {path})")
    cap = files.MAX_INPUT_BYTES if ctx.max_bytes is None else ctx.max_bytes
    try:
        f = files.open_capped(path, cap)
    except InputError as e:
        raise ValueError(f"{label}: file {path_text!r} {e.message}") from None
    with f:
        try:
            t = _load_keyed(f, path, key, torch)
        except ValueError as e:
            raise ValueError(f"{label}: cannot load {path_text!r} as a tensor: {e}") from None
        except Exception as e:  # torch raises many types for a bad file
            raise ValueError(f"{label}: cannot load {path_text!r} as a tensor: {type(e).__name__}: {e}") from None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{label}: {path_text!r} holds a {type(t).__name__}, not a tensor")
    if t.numel() * t.element_size() > cap:  # e.g. an expanded view of a tiny storage
        raise ValueError(f"{label}: {path_text!r} holds a tensor of {t.numel() * t.element_size():,} bytes, over "
                         f"the {cap:,}-byte limit on one input (casedb import --max-input-mb)")
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


# ------------------------------------------------------------------------------ judgement

def _marks(value) -> list[str]:
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
        if m not in out:
            out.append(m)
    return out


def _conditions(value, key: str) -> list[dict] | None:
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


def _xfail(expr, reason) -> dict | None:
    if expr is None and reason is None:
        return None
    if expr is None:
        expr = "True"
    if isinstance(expr, bool):
        expr = str(expr)
    safe_eval.check_condition(str(expr))
    return {"expr": str(expr), "reason": str(reason or f"xfail_if: {expr}")}


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


def _expects(value) -> dict | None:
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
