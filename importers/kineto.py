"""Kineto / chrome-trace importer (``torch.profiler.profile(record_shapes=True).export_chrome_trace``).

Reads ``.json`` or ``.json.gz`` (TensorBoard's ``*.pt.trace.json.gz``). Every ``cpu_op`` event
named like an operator (``aten::addmm``, ``mylib::op``) is a call; its ``Input type`` /
``Input Dims`` / ``Input Strides`` / ``Concrete Inputs`` become the case inputs.

Nesting: the profiler records every dispatcher call, so ``aten::linear`` contains ``aten::t``
and ``aten::addmm``. Events are nested by time on each thread. ``level="top"`` (default) keeps
the outermost operator of each nest (what the model called); ``level="leaf"`` keeps operators
with no operator inside them (what finally ran). Non-operator events (``record_function``
ranges, ``autograd::engine::evaluate_function: ...``, ``MmBackward0``, ``ProfilerStep#3``) are
transparent: they are never cases and never hide the operators inside them.

Kineto does not record the overload or argument names. When torch is importable the overload
is resolved against the dispatcher's schemas (argument count and kinds must fit), which also
names keyword-only arguments (they go to ``attrs``) and turns ScalarType / Layout /
MemoryFormat codes into ``torch.*`` names. Kineto writes ``""`` for every argument it does not
record: for an optional argument of a recordable kind (Tensor?, int?, ScalarType? ...) that
means None; for a ``str`` argument (gelu's ``approximate``, div's ``rounding_mode``) or a
``Tensor?[]`` list (``aten::index``) the value is unknown, so the call is *skipped* with that
reason rather than imported with a guessed value: use an Execution Trace for those ops. An
unrecorded ``Device`` becomes ``"cpu"``, a placeholder the runner maps to the target device.
Kineto records neither storage offsets (strided tensors get ``storage_offset: 0``) nor the
element dtypes of a ``Tensor[]`` (``aten::cat``): those elements take the dtype of another
tensor argument of the call, else none (the model default), said in the description.

This module also owns the profiler dtype names shared by the Execution Trace importer.
"""

from __future__ import annotations

import gc
import gzip
import json
import marshal
import math
import re
import zlib
from typing import Any, Iterator

from casedb.errors import InputError
from importers.files import read_bytes, read_head

__all__ = [
    "PROFILER_DTYPES",
    "SCALAR_TYPES",
    "LAYOUTS",
    "MEMORY_FORMATS",
    "TraceFormatError",
    "parse",
    "sniff",
    "load_json",
    "head_bytes",
    "paused_gc",
    "kineto_args",
    "NOT_RECORDED",
    "tensor_input",
    "contiguous",
    "float_input",
    "value_input",
]


class TraceFormatError(ValueError):
    """A trace file that cannot be read: the message names the file, the place and the fix."""


# Profiler element-type names (c10 ``toString`` of the C++ type, as written in Kineto's
# ``Input type`` and inside ET's ``Tensor(...)``) -> casedb dtype. Names checked with torch
# 2.13 on Linux (GCC spellings); MSVC/clang spellings added as aliases. Dtypes casedb cannot
# store (quantized, bits*, float8_e8m0fnu, float4, int1..7) are absent: such calls are skipped.
PROFILER_DTYPES: dict[str, str] = {
    "float": "fp32",
    "double": "float64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "bool": "bool",
    "signed char": "int8",
    "short int": "int16",
    "short": "int16",
    "int": "int32",
    "long int": "int64",
    "long long int": "int64",
    "long long": "int64",
    "__int64": "int64",
    "unsigned char": "uint8",
    "short unsigned int": "uint16",
    "unsigned short": "uint16",
    "unsigned int": "uint32",
    "long unsigned int": "uint64",
    "long long unsigned int": "uint64",
    "unsigned long long": "uint64",
    "unsigned __int64": "uint64",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
}

# c10::ScalarType codes (how a ``ScalarType dtype`` argument is recorded) -> torch name.
# Verified against torch.ops.aten.empty(dtype=<code>) with torch 2.13.
SCALAR_TYPES: dict[int, str] = {
    i: "torch." + n
    for i, n in enumerate(
        "uint8 int8 int16 int32 int64 float16 float32 float64 complex32 complex64 complex128 bool "
        "qint8 quint8 qint32 bfloat16 quint4x2 quint2x4 bits1x8 bits2x4 bits4x2 bits8 bits16 "
        "float8_e5m2 float8_e4m3fn float8_e5m2fnuz float8_e4m3fnuz uint16 uint32 uint64 "
        "uint1 uint2 uint3 uint4 uint5 uint6 uint7 int1 int2 int3 int4 int5 int6 int7 "
        "float8_e8m0fnu float4_e2m1fn_x2".split()
    )
}
LAYOUTS: dict[int, str] = {
    i: "torch." + n
    for i, n in enumerate(
        "strided sparse_coo sparse_csr _mkldnn sparse_csc sparse_bsr sparse_bsc jagged".split()
    )
}
MEMORY_FORMATS: dict[int, str] = {
    0: "torch.contiguous_format",
    1: "torch.preserve_format",
    2: "torch.channels_last",
    3: "torch.channels_last_3d",
}

NOT_RECORDED = "not recorded by Kineto"  # why of an argument Kineto wrote as ""
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")
_OP_CATS = frozenset(("cpu_op", "Operator", "operator"))
_INT = re.compile(r"^[+-]?\d+$")
_SNIFF_BYTES = 1 << 16


def float_input(x: float) -> dict:
    """A float argument: ``{"value": x}``, or ``{"py": "inf"}`` for what JSON cannot hold."""
    if math.isfinite(x):
        return {"value": x}
    return {"py": "nan" if x != x else ("inf" if x > 0 else "-inf")}


def value_input(v: Any) -> dict:
    """A recorded non-tensor value: ``{"value": v}``; non-finite floats (alone or in a list,
    which JSON cannot hold) as a ``{"py": ...}`` literal."""
    if isinstance(v, float):
        return float_input(v)
    if isinstance(v, list) and any(isinstance(x, float) and not math.isfinite(x) for x in v):
        items = (float_input(x).get("py") or repr(x) if isinstance(x, float) else repr(x) for x in v)
        return {"py": "[" + ", ".join(items) + "]"}
    return {"value": v}


def contiguous(shape, stride) -> bool:
    """True if ``stride`` is the row-major layout of ``shape`` (size-1 dims' strides ignored)."""
    expected = 1
    for n, s in zip(reversed(shape), reversed(stride)):
        if n == 0:
            return True
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def tensor_input(type_name: str, shape, stride=None, storage_offset: int = 0) -> dict | str:
    """The case input for one recorded tensor, or the reason it cannot be represented."""
    dtype = PROFILER_DTYPES.get(type_name)
    if dtype is None:
        return f"tensor of unsupported dtype {type_name!r}"
    spec: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
    if stride and len(stride) == len(shape) and not contiguous(shape, stride):
        spec["preset"] = "strided"
        spec["preset_args"] = {"stride": list(stride), "storage_offset": storage_offset}
    return {"tensor": spec}


# ----------------------------------------------------------------------------- file reading


def load_json(path, what: str, fix: str, max_bytes: int | None = None) -> Any:
    """Read a ``.json`` / ``.json.gz`` file (a regular file, size-capped: :mod:`importers.files`);
    a truncated or corrupt one raises TraceFormatError."""
    path = str(path)
    try:
        raw = read_bytes(path, max_bytes)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceFormatError(
            f"{path}: the gzip data is truncated or corrupt ({e}); {fix}"
        ) from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        at_end = e.pos >= len(raw.rstrip()) or e.msg.startswith("Unterminated string")
        where = "at the end of the file" if at_end else f"at line {e.lineno} column {e.colno}"
        raise TraceFormatError(
            f"{path}: not a complete {what}: invalid JSON {where} ({e.msg}); "
            f"the file looks truncated or corrupt: {fix}"
        ) from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{path}: not a {what}: not UTF-8 text ({e.reason}); {fix}") from None
    except RecursionError:
        raise TraceFormatError(f"{path}: not a {what}: JSON nested too deeply to read; {fix}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise TraceFormatError(f"{path}: not a {what}: {e}; {fix}") from None


_KINETO_HEAD = re.compile(rb'"traceEvents"\s*:\s*\[|"schemaVersion"\s*:')
_LEGACY_HEAD = re.compile(rb'^\s*\[\s*\{[^{}]*"ph"\s*:')


def head_bytes(path, head) -> bytes:
    """Sniffing input as bytes: ``head`` may be raw bytes (gzip is opened here) or decoded text."""
    if isinstance(head, str):
        return head.encode("utf-8", "replace")
    if head[:2] == b"\x1f\x8b":
        try:
            return read_head(path)
        except InputError:
            return b""
    return head


def sniff(path, head: bytes | str) -> bool:
    """True if the file is a Kineto/chrome trace (``head``: the file's first bytes or text)."""
    data = head_bytes(path, head)
    if not data and str(path).endswith(".gz"):
        return str(path).endswith(".pt.trace.json.gz")
    return bool(_KINETO_HEAD.search(data[:_SNIFF_BYTES]) or _LEGACY_HEAD.match(data[:4096]))


# ----------------------------------------------------------------------------- conversion


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


def kineto_args(types, dims, strides, concrete) -> tuple[list[tuple], str | None] | str:
    """Kineto's per-argument columns -> neutral argument tuples for ``execution_trace.bind``.

    Returns ``(args, note)`` or a skip reason. Tuples: ``("T", input)`` a tensor,
    ``("TL", input)`` a tensor list, ``("V", value)`` a recorded scalar or scalar list,
    ``("U", why, kind)`` a value Kineto did not record: ``kind`` "" for an argument it writes as
    ``""`` (why = NOT_RECORDED), "Scalar"/"ScalarList" for a scalar whose value is missing.
    """
    n = len(types)
    if len(dims) != n or (strides is not None and len(strides) != n) or (
        concrete is not None and len(concrete) != n
    ):
        raise ValueError("Input type / Input Dims / Input Strides / Concrete Inputs lengths differ")
    args: list[tuple] = []
    note = None
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
            args.append(("T", ti))
    # Kineto writes "TensorList" instead of the element dtypes. Use the dtype of another tensor
    # argument of the same call when there is one; otherwise leave dtype out, which means the
    # model's default dtype, and say so in the description.
    for a in args:
        if a[0] == "TL":
            for spec in a[1]["tensor_list"]:
                if list_dtype is not None:
                    spec["dtype"] = list_dtype
            if list_dtype is None and a[1]["tensor_list"]:
                note = "Kineto does not record Tensor[] element dtypes: the model default dtype is used"
    return args, note


_SCHEMA_CACHE: dict[str, list | None] = {}
_RESOLVED: dict[tuple, Any] = {}


def _torch_schemas(name: str):
    """Parsed dispatcher schemas of ``ns::op`` (torch, cached), or None without torch."""
    if name in _SCHEMA_CACHE:
        return _SCHEMA_CACHE[name]
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a casedb dependency
        _SCHEMA_CACHE[name] = None
        return None
    from .execution_trace import parse_schema

    try:
        found = [parse_schema(str(s)) for s in torch._C._jit_get_schemas_for_operator(name)]
    except RuntimeError:
        found = []
    _SCHEMA_CACHE[name] = found or None
    return _SCHEMA_CACHE[name]


def _convert(name: str, args_cols, schemas_for=_torch_schemas):
    """One distinct Kineto call -> ``(op, inputs, attrs, note)`` or a skip-reason string."""
    from .execution_trace import bind, bind_positional, resolve_overload

    got = kineto_args(*args_cols)
    if isinstance(got, str):
        return got
    args, note = got
    schemas = schemas_for(name)
    if not schemas:
        # Not a registered operator here (torch missing, custom op library not loaded):
        # positional arguments on the overload packet; unrecorded ones become None.
        ns, op = name.split("::", 1)
        inputs = bind_positional(args)
        if isinstance(inputs, str):
            return inputs
        return f"torch.ops.{ns}.{op}", inputs, {}, note or "no schema: overload and argument names unknown"
    # Which overload fits depends only on the kind of each argument: resolve once per shape.
    kinds = (name, tuple(("VL" if a[1].__class__ is list else "VS") if a[0] == "V"
                         else ("U", a[2]) if a[0] == "U" else a[0] for a in args))
    schema = _RESOLVED.get(kinds)
    if schema is None:
        schema = _RESOLVED[kinds] = resolve_overload(schemas, args)
    if isinstance(schema, str):
        return schema
    res = bind(schema, args, source="Kineto")
    if isinstance(res, str):
        return res
    return res[0], res[1], res[2], note


# ----------------------------------------------------------------------------- parse

_FIX = "re-export it with torch.profiler.profile(record_shapes=True) ... prof.export_chrome_trace(path)"


class paused_gc:
    """Pause the cyclic GC while a big trace is decoded and grouped.

    Decoding allocates millions of containers that all stay alive; every automatic collection
    would walk them again (measured: more than half of json.loads time on a 70 MB trace).
    """

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


def _group(path: str, level: str, max_bytes: int | None = None) -> list[tuple]:
    """Decode the trace, keep the top/leaf operator calls, group identical ones.

    Returns ``[(event, index, count), ...]`` in first-occurrence order: only one event per
    distinct call survives, so the decoded trace can be freed before records are built.
    """
    data = load_json(path, "Kineto trace", _FIX, max_bytes)
    if isinstance(data, dict):
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise TraceFormatError(f"{path}: no 'traceEvents' list: not a Kineto/chrome trace; {_FIX}")
        if data.get("record_shapes") == 0:
            raise TraceFormatError(
                f"{path}: the trace was recorded without input shapes; profile with "
                "torch.profiler.profile(record_shapes=True) and export it again"
            )
    elif isinstance(data, list):
        events = data
    else:
        raise TraceFormatError(f"{path}: not a Kineto/chrome trace (top level is {type(data).__name__}); {_FIX}")
    del data

    # 1. Operator events per thread, as (ts, -dur, index): sorting puts parents before children.
    # (The hot loop of a big import: one dict probe for non-operator events, cached names.)
    is_op: dict = {}
    threads: dict = {}
    cats = _OP_CATS
    match = _OP_NAME.match
    last_key = lst = None
    for i, e in enumerate(events):
        if e.__class__ is not dict or e.get("cat") not in cats:
            continue
        name = e.get("name")
        ok = is_op.get(name)
        if ok is None:
            ok = is_op[name] = name.__class__ is str and match(name) is not None
        if not ok or e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        if key != last_key:
            lst = threads.get(key)
            if lst is None:
                lst = threads[key] = []
            last_key = key
        lst.append((e.get("ts"), -(e.get("dur") or 0), i))

    # 2. Nesting by time on each thread: the outermost (top) or innermost (leaf) operators.
    kept: list[int] = []
    top = level == "top"
    for lst in threads.values():
        try:
            lst.sort()
        except TypeError:
            bad = next(i for ts, nd, i in lst if not isinstance(ts, (int, float)) or not isinstance(nd, (int, float)))
            raise TraceFormatError(
                f"{path}: event {bad} ({events[bad].get('name')}): missing or bad 'ts'/'dur'; "
                f"the trace is corrupt: {_FIX}"
            ) from None
        stack: list[list] = []  # [end, index, has_child]
        for ts, ndur, i in lst:
            while stack:
                end = stack[-1][0]
                if ts < end or (ndur == 0 and ts <= end):
                    break
                done = stack.pop()
                if not top and not done[2]:
                    kept.append(done[1])
            if stack:
                stack[-1][2] = True
            elif top:
                kept.append(i)
            stack.append([ts - ndur, i, False])
        if not top:
            kept.extend(d[1] for d in stack if not d[2])
    kept.sort()

    # 3. Group identical calls under one cheap text key.
    groups: dict = {}
    no_shapes = 0
    for i in kept:
        e = events[i]
        a = e.get("args")
        if a.__class__ is not dict or "Input Dims" not in a or "Input type" not in a:
            no_shapes += 1
            key = (e["name"], None)
        else:
            # marshal version 2 (no back-references) is a canonical byte string of these
            # lists, ~4x cheaper than repr(); 1 and 1.0, True and 1 stay distinct.
            key = (e["name"], marshal.dumps((a["Input type"], a["Input Dims"], a.get("Input Strides"),
                                             a.get("Concrete Inputs")), 2))
        g = groups.get(key)
        if g is None:
            groups[key] = [e, i, 1]
        else:
            g[2] += 1
    if kept and no_shapes == len(kept):
        raise TraceFormatError(
            f"{path}: no operator event has 'Input Dims': the trace was recorded without shapes; "
            "profile with torch.profiler.profile(record_shapes=True) and export it again"
        )
    return [tuple(g) for g in groups.values()]


def parse(path, *, level: str = "top", max_bytes: int | None = None, **_options) -> Iterator[dict]:
    """Yield casedb records for the operator calls in a Kineto trace (see module docstring).

    level: "top" keeps the outermost operator of each nest, "leaf" the innermost ones.
    max_bytes: cap on the (decompressed) file size, default ``importers.files.MAX_INPUT_BYTES``.
    Identical calls are aggregated into one record whose ``count`` is the number of calls and
    whose ``where`` is the first of them (``<path>:event <index in traceEvents>``).
    """
    if level not in ("top", "leaf"):
        raise ValueError(f"level must be 'top' or 'leaf', not {level!r}")
    path = str(path)
    with paused_gc():
        try:
            groups = _group(path, level, max_bytes)
        except (TypeError, AttributeError, KeyError, IndexError) as err:
            # Valid JSON in the wrong shape (a hand-edited or foreign file).
            raise TraceFormatError(f"{path}: malformed Kineto trace ({type(err).__name__}: {err}); {_FIX}") from None
    for e, i, count in groups:
        name = e["name"]
        where = f"{path}:event {i}"
        a = e.get("args")
        if a.__class__ is not dict or "Input Dims" not in a or "Input type" not in a:
            yield {"type": "skipped", "where": where, "op": name, "count": count,
                   "reason": "event has no input shapes (Input Dims / Input type)"}
            continue
        try:
            res = _convert(name, (a["Input type"], a["Input Dims"], a.get("Input Strides"),
                                  a.get("Concrete Inputs")))
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as err:
            raise TraceFormatError(
                f"{path}: event {i} ({name}): malformed arguments ({err}); the trace is corrupt: {_FIX}"
            ) from None
        if isinstance(res, str):
            yield {"type": "skipped", "where": where, "op": name, "count": count, "reason": res}
            continue
        op, inputs, attrs, note = res
        description = f"{path} event {i}"
        if note:
            description += f" ({note})"
        yield {
            "type": "case",
            "model": None,
            "where": where,
            "count": count,
            "case": {"op": op, "inputs": inputs, "attrs": attrs, "description": description},
        }
