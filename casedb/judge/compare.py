"""Compare a reference result with a target result.

:func:`compare` walks both structures together (tensors, tuples/lists, dicts, None, Python
scalars, other objects) and returns one :class:`Comparison` for the whole result:

* structure, then per tensor shape, then dtype (``check_dtype``), then
* ``mode="values"``: floating/complex elements match when ``|a - b| <= atol + rtol * |b|``
  (``a`` target, ``b`` reference — torch.testing's rule; ``max(|b|, hi_mag)`` for ``|b|`` given a
  summing op's ``hi_mag``); NaN matches NaN, an infinity matches
  the same infinity; integer and bool tensors must be equal. Reported: ``max_abs_err`` and
  ``max_rel_err`` (over elements finite on both sides; relative where the reference is
  nonzero), ``mismatch_count`` of ``numel``, and ``nan_inf_mismatch`` when a NaN/inf on one
  side is not matched on the other (given ``hi``, only where the target does not agree with it:
  casedb.judge.nonfinite; ``ref_faults`` counts where only the CPU reference is wrong);
* ``mode="ulp"``: floating elements are measured against a high-precision reference ``hi``
  (the same call in float32/float64) in ULPs of the output dtype, and the target fails when its
  error exceeds ``ulp_k`` times the low-precision reference's own error, or ``ulp_floor`` ULPs,
  whichever is larger (a ULP here is the dtype's spacing at ``max(|hi|, max|hi| / 64)``, so
  near-zero elements of a tensor are measured at its scale, and, given ``hi_mag`` (the error scale
  of a summing op, casedb.judge.accumulation), at no less than ``hi_mag``). Without ``hi``, or
  when ``hi`` has no nonzero finite element (no scale to count ULPs at), a part is compared as
  in ``values``. Reported: ``ulp_err`` and ``ref_ulp_err`` (the worst part);
* ``mode="metadata"``: shape, dtype and strides only (random or uninitialized outputs);
* ``mode="bits"``: bit-identical (same NaN payloads, ``-0.0 != 0.0``): the determinism check
  (``--check-determinism``) compares the target's two runs so.

Tolerances: ``rtol``/``atol`` for every part, or per dtype in ``tolerances``
(``{"float32": [rtol, atol], ...}``, keyed by the reference tensor's dtype; Python scalars use
their own type's precision: ``float64``).

Other objects are compared by equality where their type defines one (strings, dtypes, layouts,
enums, classes). Objects without value equality — the autocast object ``_enter_autocast``
returns, context managers, generators — and devices (the reference runs on the CPU, so they
differ by design) are *opaque*: only their type is checked, and their paths are listed in
``Comparison.opaque``. Identity never decides a result. When nothing else in the result was
compared, the comparison is ``comparable=False`` (``passed`` stays True: no difference was
seen, but nothing was verified either — callers report it apart from passes and failures).

Tensors are compared where they are (callers pass CPU tensors); integer differences are
measured in float64.
"""

from __future__ import annotations

import math
import enum
import types
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from casedb.judge.nonfinite import excused, isinf_scalar, isnan_scalar, unmatched
from casedb.judge.ulp import CHUNK, flat_chunks, hi_chunks, max_of, ulp_errors, ulp_of, ulp_scale, ulp_top

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

MODES = ("values", "metadata", "bits", "ulp")


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
    comparable: bool = True          # False: the result holds only opaque objects (see the module docstring)
    opaque: list = field(default_factory=list)  # paths of the parts whose type only was checked
    ulp_err: float | None = None     # mode "ulp": the target's worst error in ULPs of the output dtype
    ref_ulp_err: float | None = None  # ... and the CPU reference's own
    ref_faults: int = 0              # elements where only the CPU reference has NaN/inf wrong (casedb.judge.nonfinite)

    def to_dict(self) -> dict:
        return asdict(self)


class _Acc:
    __slots__ = ("mode", "rtol", "atol", "check_dtype", "failure", "where", "max_abs", "max_rel",
                 "mismatch", "numel", "nan_inf", "compared", "opaque", "opaque_what", "tolerances", "used",
                 "ulp_k", "ulp_floor", "ulp_err", "ref_ulp_err", "ref_faults")

    def __init__(self, mode, rtol, atol, check_dtype, tolerances=None, ulp_k=4.0, ulp_floor=4.0):
        self.mode = mode
        self.rtol = rtol
        self.atol = atol
        self.tolerances = tolerances or {}
        self.used: dict = {}         # dtype name -> (rtol, atol) applied
        self.ulp_k = ulp_k
        self.ulp_floor = ulp_floor
        self.ulp_err = None
        self.ref_ulp_err = None
        self.ref_faults = 0
        self.check_dtype = check_dtype
        self.failure = None
        self.where = None
        self.max_abs = None
        self.max_rel = None
        self.mismatch = 0
        self.numel = 0
        self.nan_inf = False
        self.compared = 0            # parts compared by value (tensors, scalars, None, equal-able objects)
        self.opaque: list[str] = []
        self.opaque_what: list[str] = []

    def fail(self, path: str, reason: str):
        if self.failure is None:
            self.failure = f"{path}: {reason}" if path else reason
            self.where = path

    def tol(self, dtype) -> tuple[float, float]:
        """(rtol, atol) for a part of this dtype (a torch.dtype, or the name of a Python scalar's)."""
        name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
        rtol, atol = self.tolerances.get(name, (self.rtol, self.atol))
        self.used[name] = (float(rtol), float(atol))
        return float(rtol), float(atol)

    def ulp(self, target: float, reference: float):
        self.ulp_err = target if self.ulp_err is None else max(self.ulp_err, target)
        self.ref_ulp_err = reference if self.ref_ulp_err is None else max(self.ref_ulp_err, reference)

    def err(self, abs_err: float, rel_err: float | None):
        self.max_abs = abs_err if self.max_abs is None else max(self.max_abs, abs_err)
        if rel_err is not None:
            self.max_rel = rel_err if self.max_rel is None else max(self.max_rel, rel_err)


def compare(ref: Any, out: Any, *, rtol: float = 0.0, atol: float = 0.0, mode: str = "values",
            check_dtype: bool = True, path: str = "", tolerances: dict | None = None, hi: Any = None,
            ulp_k: float = 4.0, ulp_floor: float = 4.0, hi_mag: Any = None) -> Comparison:
    """Compare ``out`` (target) against ``ref`` (reference); see the module docstring."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    acc = _Acc(mode, float(rtol), float(atol), check_dtype, tolerances, float(ulp_k), float(ulp_floor))
    _walk(ref, out, path, acc, hi, hi_mag)
    if acc.failure is None:
        tols = "; ".join(f"{d}: rtol={r:g}, atol={a:g}" for d, (r, a) in sorted(acc.used.items()))
        what = {"values": f"values match ({tols or f'rtol={rtol:g}, atol={atol:g}'})",
                "metadata": "metadata only (random or uninitialized output): shape, dtype and strides match",
                "bits": "bit-identical",
                "ulp": (f"within {max(acc.ulp_k * (acc.ref_ulp_err or 0), acc.ulp_floor):.3g} ULPs of the "
                        f"high-precision reference (target {acc.ulp_err or 0:.3g}, CPU reference "
                        f"{acc.ref_ulp_err or 0:.3g})" if acc.ulp_err is not None else f"values match ({tols})")}[mode]
        reason = what
        if acc.opaque and not acc.compared:
            reason = f"not comparable: {_opaque_text(acc)}; only their types were checked (they match)"
        elif acc.opaque:
            reason += f"; compared by type only: {_opaque_text(acc)}"
    else:
        reason = acc.failure
    if mode == "values" and acc.max_abs is None and acc.numel:
        acc.max_abs = 0.0
    return Comparison(passed=acc.failure is None, reason=reason, mode=mode,
                      max_abs_err=acc.max_abs, max_rel_err=acc.max_rel, mismatch_count=acc.mismatch,
                      numel=acc.numel, nan_inf_mismatch=acc.nan_inf, where=acc.where,
                      comparable=bool(acc.compared or not acc.opaque), opaque=list(acc.opaque),
                      ulp_err=acc.ulp_err, ref_ulp_err=acc.ref_ulp_err, ref_faults=acc.ref_faults)


def _opaque_text(acc: _Acc) -> str:
    shown = ", ".join(f"{p or 'the result'} ({w})" for p, w in zip(acc.opaque[:5], acc.opaque_what))
    return shown + (f" and {len(acc.opaque) - 5} more" if len(acc.opaque) > 5 else "")


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


def _hi_part(hi, key):
    try:
        return hi[key] if hi is not None else None
    except (KeyError, IndexError, TypeError):
        return None


def _walk(ref, out, path, acc: _Acc, hi=None, mag=None):
    kr, ko = _kind(ref), _kind(out)
    if kr != ko:
        acc.fail(path, f"reference is {_describe(ref)} but target is {_describe(out)}")
        if kr == "tensor":
            acc.numel += ref.numel()
            acc.mismatch += ref.numel()
        return
    if kr == "tensor":
        acc.compared += 1
        _tensor(ref, out, path, acc, hi if isinstance(hi, torch.Tensor) else None,
                mag if isinstance(mag, torch.Tensor) else None)
    elif kr == "sequence":
        if len(ref) != len(out):
            acc.fail(path, f"reference has {len(ref)} items, target {len(out)}")
        for i, (r, o) in enumerate(zip(ref, out)):
            _walk(r, o, f"{path}[{i}]", acc, _hi_part(hi, i), _hi_part(mag, i))
    elif kr == "dict":
        if set(ref) != set(out):
            acc.fail(path, f"keys differ: reference {sorted(map(str, ref))}, target {sorted(map(str, out))}")
        for k in ref:
            if k in out:
                _walk(ref[k], out[k], f"{path}.{k}" if path else str(k), acc, _hi_part(hi, k), _hi_part(mag, k))
    elif kr == "None":
        acc.compared += 1
    elif kr in ("bool", "number"):
        acc.compared += 1
        _scalar(ref, out, path, acc)
    else:
        _object(ref, out, path, acc)


# Types whose instances are singletons: identity is their value equality.
_SINGLETONS = (torch.dtype, torch.layout, torch.memory_format, torch.qscheme, enum.Enum, type,
               types.FunctionType, types.BuiltinFunctionType, types.ModuleType)


def _object(ref, out, path, acc: _Acc):
    if type(ref) is not type(out):
        acc.fail(path, f"reference is {_qualname(ref)} but target is {_qualname(out)}")
        return
    if isinstance(ref, torch.device):
        acc.opaque.append(path)
        acc.opaque_what.append("a device: the reference's is the CPU by design")
        return
    if not _has_value_equality(ref):  # == would be identity
        acc.opaque.append(path)
        acc.opaque_what.append(f"a {_qualname(ref)}, which has no value equality")
        return
    try:
        same = ref == out
        if not isinstance(same, bool):
            raise TypeError("== did not give a bool")
    except Exception:  # an == that raises or answers with something else (a tensor, NotImplemented)
        acc.opaque.append(path)
        acc.opaque_what.append(f"a {_qualname(ref)} whose == gives no answer")
        return
    acc.compared += 1
    if not same:
        acc.fail(path, f"reference {ref!r} != target {out!r}"[:300])


def _has_value_equality(x) -> bool:
    return isinstance(x, _SINGLETONS) or type(x).__eq__ is not object.__eq__


def _qualname(x) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


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
                isnan_scalar(ref) and isnan_scalar(out)) else True
            if not same:
                acc.mismatch += 1
                acc.fail(path, f"not bit-identical: {ref!r} vs {out!r}")
            return
        if isnan_scalar(ref) or isnan_scalar(out) or isinf_scalar(ref) or isinf_scalar(out):
            if (isnan_scalar(ref) and isnan_scalar(out)) or ref == out:
                return
            acc.nan_inf = True
            acc.mismatch += 1
            acc.fail(path, f"reference {ref!r}, target {out!r}")
            return
        d = abs(out - ref)
        acc.err(d, d / abs(ref) if ref != 0 else None)
        rtol, atol = acc.tol("float64")
        if not d <= atol + rtol * abs(ref):
            acc.mismatch += 1
            acc.fail(path, f"reference {ref!r}, target {out!r} (|diff| {d:.3g} > atol + rtol*|ref| = "
                           f"{atol + rtol * abs(ref):.3g})")
    else:
        d = abs(out - ref)
        acc.err(float(d), float(d) / abs(ref) if ref != 0 else None)
        if ref != out:
            acc.mismatch += 1
            acc.fail(path, f"reference {ref!r}, target {out!r}")


def _dense(t: torch.Tensor) -> torch.Tensor:
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def _tensor(ref: torch.Tensor, out: torch.Tensor, path: str, acc: _Acc, hi: torch.Tensor | None = None,
            mag: torch.Tensor | None = None):
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
    usable = (hi is not None and ref.dtype.is_floating_point and out.dtype.is_floating_point
              and hi.shape == ref.shape and hi.dtype.is_floating_point)
    hi = _dense(hi) if usable else None
    ulp = acc.mode == "ulp" and usable
    top = 0.0
    if ulp:
        top = ulp_top(hi)
        mag = _dense(mag) if mag is not None and mag.shape == hi.shape else None
        # an all-zero (or non-finite) high-precision result gives ULPs no scale: any rounding
        # residue of a correct target would count as millions of ULPs
        ulp = top > 0
    if ref.dtype == out.dtype and torch.equal(_bits(ref), _bits(out)):
        # bit-identical (the common case of a matching backend): nothing to measure
        acc.err(0.0, 0.0)
        if ulp:
            e = ulp_errors(ref, hi, top, mag)
            acc.ulp(e, e)
        return
    if ulp:
        _ulp_values(ref, out, hi, top, mag, path, acc)
    elif ref.dtype.is_floating_point or ref.dtype.is_complex or out.dtype.is_floating_point or out.dtype.is_complex:
        _float_values(ref, out, path, acc, _dense(mag) if mag is not None and mag.shape == ref.shape else None, hi)
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


def _float_values(ref, out, path, acc: _Acc, mag: torch.Tensor | None = None, hi: torch.Tensor | None = None):
    ct = _compute_dtype(ref.dtype, out.dtype)
    rtol, atol = acc.tol(ref.dtype)
    bad, max_abs, max_rel, nan_inf = 0, 0.0, None, False
    parts = (*(() if mag is None else (mag,)), *(() if hi is None else (hi,)))
    for r, o, *extra in flat_chunks(ref, out, *parts):
        m = extra[0] if mag is not None else None
        b, a = r.to(ct), o.to(ct)
        diff = (a - b).abs()
        babs = b.abs()
        # a summing op's error grows with its terms' magnitude (casedb.judge.accumulation)
        scale = babs if m is None else torch.maximum(babs, m.to(ct).nan_to_num(0.0, 0.0, 0.0))
        close = diff <= scale * rtol + atol
        nz = babs > 0
        finite = torch.isfinite(a) & torch.isfinite(b)
        if not bool(finite.all()):
            lost = unmatched(a, b, finite)
            if hi is not None and bool(lost.any()):
                # the CPU reference's NaN/inf can be the wrong ones: the high-precision reference decides
                ok, fault = excused(a.to(torch.float64), b.to(torch.float64), extra[-1].to(torch.float64), lost,
                                     ref.dtype, lambda x, h: (x - h).abs() <= h.abs() * rtol + atol)
                acc.ref_faults += int(fault.sum())
                lost &= ~ok
            close = torch.where(finite, close, ~lost)
            nan_inf |= bool(lost.any())
            diff = diff.masked_fill(~finite, 0)
            nz &= finite
        bad += int((~close).sum())
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max_of(max_rel, diff[nz] / babs[nz])
    acc.nan_inf |= nan_inf
    acc.err(max_abs, max_rel)
    if bad:
        acc.mismatch += bad
        n = ref.numel()
        extra = ", NaN/inf mismatch" if acc.nan_inf else ""
        rel = f"{max_rel:.3g}" if max_rel is not None else "n/a"
        acc.fail(path, f"{bad} of {n} elements ({100.0 * bad / n:.3g}%) exceed atol={atol:g} + "
                       f"rtol={rtol:g}*|ref|; max abs err {max_abs:.3g}, max rel err {rel}{extra}")


def _ulp_values(ref, out, hi, top, mag, path, acc: _Acc):
    e_t, e_r = 0.0, 0.0
    # two passes: which elements fail depends on the reference's own error over the whole tensor;
    # a tensor of one chunk (nearly all) keeps its scale for the second
    kept = [] if ref.numel() <= CHUNK else None
    for o, r, h, m in hi_chunks(hi, mag, out, ref):
        scale = ulp_scale(h, ref.dtype, top, m)
        e_t, e_r = max_of(e_t, ulp_of(o, h, scale)), max_of(e_r, ulp_of(r, h, scale))
        if kept is not None:
            kept.append(scale)
    acc.ulp(e_t, e_r)
    bound = max(acc.ulp_k * e_r, acc.ulp_floor)
    n_bad, max_abs, max_rel, nan_inf = 0, 0.0, None, False
    for i, (o, r, h, m) in enumerate(hi_chunks(hi, mag, out, ref)):
        a, b = o.to(torch.float64), r.to(torch.float64)
        scale = kept[i] if kept else ulp_scale(h, ref.dtype, top, m)
        finite = torch.isfinite(a) & torch.isfinite(b)
        lost = unmatched(a, b, finite)
        if bool(lost.any()):
            # the CPU reference's NaN/inf can be the wrong ones: the high-precision reference decides
            ok, fault = excused(a, b, h, lost, ref.dtype, lambda x, hh, s=scale: (x - hh).abs() / s <= bound)
            acc.ref_faults += int(fault.sum())
            lost &= ~ok
        nan_inf |= bool(lost.any())
        n_bad += int((lost | (finite & torch.isfinite(h) & ((a - h).abs() / scale > bound))).sum())
        diff = (a - b).abs().masked_fill(~finite, 0)
        babs = b.abs()
        nz = (babs > 0) & finite
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max_of(max_rel, diff[nz] / babs[nz])
    acc.nan_inf |= nan_inf
    acc.err(max_abs, max_rel)
    if n_bad:
        acc.mismatch += n_bad
        n = ref.numel()
        extra = ", NaN/inf mismatch" if acc.nan_inf else ""
        acc.fail(path, f"{n_bad} of {n} elements ({100.0 * n_bad / n:.3g}%) are off the {_dt(hi.dtype)} reference by "
                       f"more than {bound:.3g} ULPs of {_dt(ref.dtype)} (max({acc.ulp_k:g} x the CPU reference's "
                       f"{e_r:.3g}, {acc.ulp_floor:g})): the target's error is {e_t:.3g} ULPs{extra}")


def _exact_values(ref, out, path, acc: _Acc):
    bad, max_abs, max_rel = 0, 0.0, None
    for r, o in flat_chunks(ref, out):
        a = o.to(torch.float64) if o.dtype != torch.bool else o.to(torch.int8).to(torch.float64)
        b = r.to(torch.float64) if r.dtype != torch.bool else r.to(torch.int8).to(torch.float64)
        bad += int((o != r if o.dtype == r.dtype else a != b).sum())
        diff = (a - b).abs()
        babs = b.abs()
        nz = babs > 0
        max_rel = max_of(max_rel, diff[nz] / babs[nz])
        max_abs = max(max_abs, float(diff.max()))
    acc.err(max_abs, max_rel)
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
