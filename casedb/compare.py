"""Compare a reference result with a target result.

:func:`compare` walks both structures together (tensors, tuples/lists, dicts, None, Python
scalars, other objects) and returns one :class:`Comparison` for the whole result:

* structure, then per tensor shape, then dtype (``check_dtype``), then
* ``mode="values"``: floating/complex elements match when ``|a - b| <= atol + rtol * |b|``
  (``a`` target, ``b`` reference — torch.testing's rule); NaN matches NaN, an infinity matches
  the same infinity; integer and bool tensors must be equal. Reported: ``max_abs_err`` and
  ``max_rel_err`` (over elements finite on both sides; relative where the reference is
  nonzero), ``mismatch_count`` of ``numel``, and ``nan_inf_mismatch`` when a NaN/inf on one
  side is not matched on the other;
* ``mode="metadata"``: shape, dtype and strides only (random or uninitialized outputs);
* ``mode="bits"``: bit-identical (determinism: same NaN payloads, ``-0.0 != 0.0``).

Tensors are compared where they are (callers pass CPU tensors); integer differences are
measured in float64.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

MODES = ("values", "metadata", "bits")


@dataclass
class Comparison:
    passed: bool
    reason: str                      # why it failed, or what was compared when it passed
    mode: str = "values"
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatch_count: int = 0
    numel: int = 0
    nan_inf_mismatch: bool = False
    where: str | None = None         # path of the first failing part, e.g. "output[1]"

    def to_dict(self) -> dict:
        return asdict(self)


class _Acc:
    __slots__ = ("mode", "rtol", "atol", "check_dtype", "failure", "where", "max_abs", "max_rel",
                 "mismatch", "numel", "nan_inf")

    def __init__(self, mode, rtol, atol, check_dtype):
        self.mode = mode
        self.rtol = rtol
        self.atol = atol
        self.check_dtype = check_dtype
        self.failure = None
        self.where = None
        self.max_abs = None
        self.max_rel = None
        self.mismatch = 0
        self.numel = 0
        self.nan_inf = False

    def fail(self, path: str, reason: str):
        if self.failure is None:
            self.failure = f"{path}: {reason}" if path else reason
            self.where = path

    def err(self, abs_err: float, rel_err: float | None):
        self.max_abs = abs_err if self.max_abs is None else max(self.max_abs, abs_err)
        if rel_err is not None:
            self.max_rel = rel_err if self.max_rel is None else max(self.max_rel, rel_err)


def compare(ref: Any, out: Any, *, rtol: float = 0.0, atol: float = 0.0, mode: str = "values",
            check_dtype: bool = True, path: str = "") -> Comparison:
    """Compare ``out`` (target) against ``ref`` (reference); see the module docstring."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    acc = _Acc(mode, float(rtol), float(atol), check_dtype)
    _walk(ref, out, path, acc)
    if acc.failure is None:
        what = {"values": f"values match (rtol={rtol:g}, atol={atol:g})",
                "metadata": "metadata only (random or uninitialized output): shape, dtype and strides match",
                "bits": "bit-identical"}[mode]
        reason = what
    else:
        reason = acc.failure
    if mode == "values" and acc.max_abs is None and acc.numel:
        acc.max_abs = 0.0
    return Comparison(passed=acc.failure is None, reason=reason, mode=mode,
                      max_abs_err=acc.max_abs, max_rel_err=acc.max_rel, mismatch_count=acc.mismatch,
                      numel=acc.numel, nan_inf_mismatch=acc.nan_inf, where=acc.where)


def _kind(x) -> str:
    if isinstance(x, torch.Tensor):
        return "tensor"
    if x is None:
        return "None"
    if isinstance(x, (list, tuple)):
        return "sequence"
    if isinstance(x, dict):
        return "dict"
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, (int, float, complex)):
        return "number"
    return type(x).__name__


def _walk(ref, out, path, acc: _Acc):
    kr, ko = _kind(ref), _kind(out)
    if kr != ko:
        acc.fail(path, f"reference is {_describe(ref)} but target is {_describe(out)}")
        if kr == "tensor":
            acc.numel += ref.numel()
            acc.mismatch += ref.numel()
        return
    if kr == "tensor":
        _tensor(ref, out, path, acc)
    elif kr == "sequence":
        if len(ref) != len(out):
            acc.fail(path, f"reference has {len(ref)} items, target {len(out)}")
        for i, (r, o) in enumerate(zip(ref, out)):
            _walk(r, o, f"{path}[{i}]", acc)
    elif kr == "dict":
        if set(ref) != set(out):
            acc.fail(path, f"keys differ: reference {sorted(map(str, ref))}, target {sorted(map(str, out))}")
        for k in ref:
            if k in out:
                _walk(ref[k], out[k], f"{path}.{k}" if path else str(k), acc)
    elif kr == "None":
        pass
    elif kr in ("bool", "number"):
        _scalar(ref, out, path, acc)
    elif isinstance(ref, torch.device):
        pass  # the reference runs on the CPU, the target elsewhere: devices differ by design
    else:
        try:
            same = bool(ref == out)
        except Exception:  # objects without a usable ==
            same = repr(ref) == repr(out)
        if not same:
            acc.fail(path, f"reference {ref!r} != target {out!r}"[:300])


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor {list(x.shape)} {str(x.dtype).replace('torch.', '')}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"{type(x).__name__} {x!r}"[:80]


def _scalar(ref, out, path, acc: _Acc):
    if acc.mode == "metadata":
        if acc.check_dtype and type(ref) is not type(out):
            acc.fail(path, f"reference is {type(ref).__name__}, target {type(out).__name__}")
        return
    acc.numel += 1
    if acc.check_dtype and type(ref) is not type(out):
        acc.fail(path, f"reference is {type(ref).__name__} {ref!r}, target {type(out).__name__} {out!r}")
        acc.mismatch += 1
        return
    if isinstance(ref, float) or isinstance(out, float) or isinstance(ref, complex) or isinstance(out, complex):
        if acc.mode == "bits":
            same = (ref == out and math.copysign(1, ref.real) == math.copysign(1, out.real)) if not (
                _isnan(ref) and _isnan(out)) else True
            if not same:
                acc.mismatch += 1
                acc.fail(path, f"not bit-identical: {ref!r} vs {out!r}")
            return
        if _isnan(ref) or _isnan(out) or _isinf(ref) or _isinf(out):
            if (_isnan(ref) and _isnan(out)) or ref == out:
                return
            acc.nan_inf = True
            acc.mismatch += 1
            acc.fail(path, f"reference {ref!r}, target {out!r}")
            return
        d = abs(out - ref)
        acc.err(d, d / abs(ref) if ref != 0 else None)
        if not d <= acc.atol + acc.rtol * abs(ref):
            acc.mismatch += 1
            acc.fail(path, f"reference {ref!r}, target {out!r} (|diff| {d:.3g} > atol + rtol*|ref| = "
                           f"{acc.atol + acc.rtol * abs(ref):.3g})")
    else:
        d = abs(out - ref)
        acc.err(float(d), float(d) / abs(ref) if ref != 0 else None)
        if ref != out:
            acc.mismatch += 1
            acc.fail(path, f"reference {ref!r}, target {out!r}")


def _isnan(x) -> bool:
    return isinstance(x, (float, complex)) and x != x


def _isinf(x) -> bool:
    return isinstance(x, (float, complex)) and math.isinf(abs(x))


def _dense(t: torch.Tensor) -> torch.Tensor:
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def _tensor(ref: torch.Tensor, out: torch.Tensor, path: str, acc: _Acc):
    n = ref.numel()
    acc.numel += n
    if ref.shape != out.shape:
        acc.mismatch += n
        acc.fail(path, f"shape {list(out.shape)} but reference {list(ref.shape)}")
        return
    if ref.dtype != out.dtype and (acc.check_dtype or acc.mode == "bits"):
        acc.mismatch += n
        acc.fail(path, f"dtype {_dt(out.dtype)} but reference {_dt(ref.dtype)}")
        return
    if acc.mode == "metadata":
        if ref.layout != out.layout:
            acc.fail(path, f"layout {out.layout} but reference {ref.layout}")
        elif ref.layout == torch.strided and n > 1:
            rs = [s for s, d in zip(ref.stride(), ref.shape) if d > 1]
            os_ = [s for s, d in zip(out.stride(), out.shape) if d > 1]
            if rs != os_:
                acc.fail(path, f"strides {list(out.stride())} but reference {list(ref.stride())}")
        return
    if n == 0:
        return
    ref, out = _dense(ref), _dense(out)
    if acc.mode == "bits":
        rb, ob = _bits(ref), _bits(out)
        if not torch.equal(rb, ob):
            bad = int((rb != ob).sum())
            acc.mismatch += bad
            acc.fail(path, f"not bit-identical: {bad} of {n} elements differ")
        return
    if ref.dtype == out.dtype and torch.equal(_bits(ref), _bits(out)):
        # bit-identical (the common case of a matching backend): nothing to measure
        acc.err(0.0, 0.0)
        return
    if ref.dtype.is_floating_point or ref.dtype.is_complex or out.dtype.is_floating_point or out.dtype.is_complex:
        _float_values(ref, out, path, acc)
    else:
        _exact_values(ref, out, path, acc)


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _compute_dtype(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    wide = torch.float64 in (a, b) or torch.complex128 in (a, b) or not (
        a.is_floating_point or a.is_complex) or not (b.is_floating_point or b.is_complex)
    if a.is_complex or b.is_complex:
        return torch.complex128 if wide else torch.complex64
    return torch.float64 if wide else torch.float32


def _float_values(ref, out, path, acc: _Acc):
    ct = _compute_dtype(ref.dtype, out.dtype)
    b = ref.to(ct)
    a = out.to(ct)
    diff = (a - b).abs()
    babs = b.abs()
    close = diff <= babs * acc.rtol + acc.atol
    finite = torch.isfinite(a) & torch.isfinite(b)
    all_finite = bool(finite.all())
    if not all_finite:
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        close = torch.where(finite, close, same)
        if bool((~finite & ~same).any()):
            acc.nan_inf = True
        diff = diff.masked_fill(~finite, 0)
    bad = int((~close).sum())
    max_abs = float(diff.max())
    nz = babs > 0
    if not all_finite:
        nz &= finite
    max_rel = float((diff[nz] / babs[nz]).max()) if bool(nz.any()) else None
    acc.err(max_abs, max_rel)
    if bad:
        acc.mismatch += bad
        n = ref.numel()
        extra = ", NaN/inf mismatch" if acc.nan_inf else ""
        rel = f"{max_rel:.3g}" if max_rel is not None else "n/a"
        acc.fail(path, f"{bad} of {n} elements ({100.0 * bad / n:.3g}%) exceed atol={acc.atol:g} + "
                       f"rtol={acc.rtol:g}*|ref|; max abs err {max_abs:.3g}, max rel err {rel}{extra}")


def _exact_values(ref, out, path, acc: _Acc):
    a = out.to(torch.float64) if out.dtype != torch.bool else out.to(torch.int8).to(torch.float64)
    b = ref.to(torch.float64) if ref.dtype != torch.bool else ref.to(torch.int8).to(torch.float64)
    neq = out != ref if out.dtype == ref.dtype else a != b
    diff = (a - b).abs()
    babs = b.abs()
    nz = babs > 0
    max_rel = float((diff[nz] / babs[nz]).max()) if bool(nz.any()) else None
    max_abs = float(diff.max())
    acc.err(max_abs, max_rel)
    bad = int(neq.sum())
    if bad:
        acc.mismatch += bad
        n = ref.numel()
        acc.fail(path, f"{bad} of {n} elements ({100.0 * bad / n:.3g}%) differ (exact comparison for "
                       f"{_dt(ref.dtype)}); max abs err {max_abs:.3g}")


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (a view: same element size, any strides)."""
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        return t.view(_INT_OF_SIZE[t.element_size()])
    return t


def bitwise_equal(a: Any, b: Any) -> Comparison:
    """Whether two results are bit-identical (the determinism check)."""
    return compare(a, b, mode="bits")
