"""What the trace importers share: the profiler's dtype and enum codes, how a recorded value
or tensor becomes a case input, reading a (gzipped) JSON trace, and the error for a bad one.

Used by :mod:`importers.kineto`, :mod:`importers.execution_trace`, :mod:`importers.op_schema`
and :mod:`importers.oplog`.
"""

from __future__ import annotations

import gc
import gzip
import json
import math
import zlib
from typing import Any

import msgspec
import orjson

from casedb.errors import InputError
from casedb.files import read_bytes, read_head


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

FLOATING_PROFILER_DTYPES = ("fp32", "bf16", "fp16", "float64")


def profiler_dtype(name: str) -> str:
    """A dtype a user names (bf16, bfloat16, torch.bfloat16) in the spelling trace cases use;
    ValueError naming the choices."""
    from casedb.cases import dtypes

    try:
        wanted = dtypes.canonical(name)
    except dtypes.UnknownDtype as e:
        raise ValueError(str(e)) from None
    for spelling in dict.fromkeys(PROFILER_DTYPES.values()):
        if dtypes.canonical(spelling) == wanted:
            return spelling
    raise ValueError(f"dtype {name!r} is not one a trace records; choose one of "
                     f"{', '.join(dict.fromkeys(PROFILER_DTYPES.values()))}")


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


def load_json(path, what: str, fix: str, max_bytes: int | None = None) -> Any:
    """Read a ``.json`` / ``.json.gz`` file (a regular file, size-capped: :mod:`casedb.files`);
    a truncated or corrupt one raises TraceFormatError."""
    return _decode(_read(path, fix, max_bytes), str(path), what, fix)


def load_typed(path, decoder: msgspec.json.Decoder, what: str, fix: str,
               max_bytes: int | None = None) -> tuple[Any, bool]:
    """Like :func:`load_json`, decoding with ``decoder`` (msgspec Structs of the fields an
    importer reads: the rest is checked as JSON and skipped, never built). Returns
    ``(value, True)``, or ``(load_json's value, False)`` for what the typed decoder refuses
    (another shape, NaN, bad JSON: the stdlib's reading and error messages)."""
    raw = _read(path, fix, max_bytes)
    if _utf8(raw):
        try:
            return decoder.decode(raw), True
        except (ValueError, RecursionError):  # msgspec.DecodeError and ValidationError included
            pass
    return _decode(raw, str(path), what, fix), False


def raw_value(raw: msgspec.Raw, path, what: str, fix: str) -> Any:
    """One field kept as raw JSON by :func:`load_typed`, read as the stdlib reads it (numbers out
    of the double range, integers over 64 bits, the stdlib's limit on digits)."""
    try:
        return msgspec.json.decode(raw)
    except (ValueError, RecursionError):
        return _stdlib(bytes(raw), str(path), what, fix)


def _utf8(raw: bytes | bytearray) -> bool:
    """True if ``raw`` is UTF-8 (msgspec does not check the strings it skips; the stdlib refuses)."""
    if raw.isascii():
        return True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read(path, fix: str, max_bytes: int | None) -> bytes | bytearray:
    try:
        return read_bytes(path, max_bytes)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceFormatError(
            f"{path}: the gzip data is truncated or corrupt ({e}); {fix}"
        ) from None


def _decode(raw: bytes | bytearray, path: str, what: str, fix: str) -> Any:
    try:
        return orjson.loads(raw)  # 2-3x the stdlib's speed: a big trace's import is mostly decoding
    except orjson.JSONDecodeError:
        # what orjson refuses the stdlib may read (NaN, Infinity, lone surrogates): bad input
        # takes the stdlib's path, for its reading and its error messages. (orjson reads an
        # integer over 64 bits as a float; load_typed's decoder keeps it exact.)
        return _stdlib(raw, path, what, fix)


def _stdlib(raw: bytes | bytearray, path: str, what: str, fix: str) -> Any:
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
