"""Dtype names: the one table of spellings casedb accepts and the canonical name it stores.

Canonical names are torch's attribute names (``float16``, ``bfloat16``, ``int64`` ...). Accepted
aliases: the RFC's ``fp16``/``bf16``/``fp32``, torch's ``half``/``float``/``double``/``long``/
``int``/``short``, the ``torch.`` prefix of each, and the short codes of PyTorch's operator logs
(``f16``, ``bf16``, ``f32``, ``i64``, ``b8`` ...). Matching is case-insensitive.
"""

from __future__ import annotations

CANONICAL = (
    "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "complex32", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
)

_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64", "f64": "float64",
    "fp8": "float8_e4m3fn", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
    "c32": "complex32", "chalf": "complex32", "c64": "complex64", "cfloat": "complex64",
    "c128": "complex128", "cdouble": "complex128",
    "i8": "int8", "i16": "int16", "short": "int16", "i32": "int32", "int": "int32",
    "i64": "int64", "long": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "b8": "bool", "boolean": "bool",
}

# Short spellings used when writing manifests back (the RFC's own style where it has one).
SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}

FLOATING = {"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
            "float8_e4m3fnuz", "float8_e5m2fnuz"}
COMPLEX = {"complex32", "complex64", "complex128"}
INTEGER = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


class UnknownDtype(ValueError):
    pass


def canonical(name) -> str:
    """Canonical dtype name for any accepted spelling; raises UnknownDtype listing what is known."""
    key = str(name).strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    if key in CANONICAL:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise UnknownDtype(
        f"unknown dtype {name!r}; known: {', '.join(CANONICAL)} "
        f"(aliases: fp16, bf16, fp32, fp64, half, float, double, int, long, torch.<name>)"
    )


def short(name: str) -> str:
    return SHORT.get(name, name)


def promote_floating(names) -> str | None:
    """The floating dtype a computation over these dtypes runs in (torch's promotion among floats)."""
    names = [n for n in names if n in FLOATING]
    if not names:
        return None
    if "float64" in names:
        return "float64"
    if "float32" in names:
        return "float32"
    kinds = set(names)
    if "float16" in kinds and "bfloat16" in kinds:
        return "float32"
    if "bfloat16" in kinds:
        return "bfloat16"
    if "float16" in kinds:
        return "float16"
    return names[0]


def reference_dtype(name) -> str:
    """The canonical name of an upcast reference dtype (``--reference-dtype``): a floating dtype."""
    canon = canonical(name)
    if canon not in FLOATING:
        raise UnknownDtype(f"reference dtype {name!r} is not a floating dtype (use float32 or float64)")
    return canon
