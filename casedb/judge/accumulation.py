"""The error a correct implementation of a summing op may carry, as a magnitude per element.

An output element of a summing op is a sum of ``n`` terms. Summed in another order, as every
vectorised CPU kernel, GPU kernel and compiler does, it is off the exact sum by up to about
``log2(n)`` roundings of the accumulator at the terms' magnitude (pairwise and blocked orders;
one order against another), not by a few roundings at the result's magnitude, which
cancellation can make arbitrarily small. :func:`error_scale` gives, for each output element, the
magnitude at which the ULP judge counts the target's ULPs (and the tolerance judge its relative
error), so that these correct errors stay within the judges' bounds:

* ``"float32"`` ops (matmuls, linear, convolutions, sums, means, cumsum: kernels accumulate in
  float32, or float64 for float64): the sum of the terms' magnitudes (the same call on
  ``|inputs|`` in high precision) times float32's epsilon over the output's, grown by
  ``1 + log2(n) / 4`` (one more ULP of the judges' 4-ULP floor per doubling of the terms). For bf16
  and fp16 outputs that is 2^-16 or 2^-13 of the terms' sum, so their own rounding still decides;
* ``linear`` and convolutions with a bias: also ``|result| + |bias|``: a bias added after the
  product was rounded to the output dtype (inductor's convolution on CUDA) is off by a rounding
  at the product's magnitude (measured on an H100: 8 ULPs of bf16 at the result's);
* ``"output"`` ops (``index_add``, ``scatter_add``, ``scatter_reduce``, ``index_put`` with
  ``accumulate``): GPU atomics round every add in the output dtype, in any order, so the scale is
  the terms' magnitude times ``sqrt(n)``, ``n`` the most terms one element receives;
* normalisations (softmax, log_softmax): ``|result|`` grown by ``1 + log2(n) / 4``, ``n``
  the length of the normalised dim (their normaliser is such a sum);
* ``"affine"`` ops (``layer_norm``): ``w * (x - mean) * rstd + b`` where ``w * x_hat`` and ``b``
  can cancel: the terms' magnitude ``|w| * (|x| + |mean|) * rstd + |b|`` at float32's epsilon, grown
  as a scan is (below) by the normalised length: the mean and variance are sums of it that a
  vectorised CPU kernel takes lane by lane, sequentially (inductor's CPU layer_norm of 1,152
  one-signed values around 4.3e9: 11 ULPs of the terms' magnitude where ``w * x_hat`` and ``b``
  cancel);
* scans (``cumsum``) grow by ``1 + sqrt(n) / 4``: along an outer dim CUDA scans each column
  sequentially, a running total in float32 (the CPU in float64), whose error is a random walk of
  ``n`` roundings, not a tree's ``log2(n)``: an H100's float32 cumsum of 256 one-signed terms was up
  to 14.8 ULPs of its terms' magnitude off over 8 M elements (reproduced on the CPU: 14.8).

:func:`reciprocal_factor`: a mean may be computed as the sum times ``1/n`` rounded to float32
(CUDA's ``mean``), which scales every element by the same ``fl(1/n) * n``; the bias judge
(casedb.judge.bias) accepts that common factor and nothing else.

Self-contained (torch and the standard library): ``casedb repro`` copies it into its scripts.

Measured on an H100 (bench/README.md): without these, a correct CUDA eager run of granite4h
failed 11 cases (cumsum over 256 terms 4.3 ULPs of its terms' magnitude, bf16 index_add 41 ULPs
at the result's, softmax over 320 values 6 ULPs); on extremal values (one-signed, around 4.3e9)
a bf16 layer_norm was 3,000 off where ``w * x_hat`` and ``b`` of 4e9 cancel to 1e5, and a 256-term
float32 cumsum 14 ULPs of its terms' magnitude.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils import _pytree

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

# Ops whose every output element is a sum of many input terms (products of inputs), accumulated
# in float32 (float64 for float64). Names as cases spell them.
ACCUMULATING_OPS = frozenset({
    "torch.mean", "torch.Tensor.mean", "torch.sum", "torch.Tensor.sum", "torch.nansum", "torch.Tensor.nansum",
    "torch.cumsum", "torch.Tensor.cumsum", "torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__",
    "torch.mm", "torch.Tensor.mm", "torch.bmm", "torch.Tensor.bmm", "torch.nn.functional.linear", "torch.einsum",
    "torch.addmm", "torch.baddbmm", "torch._grouped_mm", "aten.mm", "aten.bmm", "aten.addmm", "aten.mean",
    "aten.sum", "aten.linear"})
SCATTER_ADD_OPS = frozenset({
    "torch.index_add", "torch.Tensor.index_add", "torch.Tensor.index_add_", "torch.scatter_add",
    "torch.Tensor.scatter_add", "torch.Tensor.scatter_add_", "torch.scatter_reduce", "torch.Tensor.scatter_reduce",
    "torch.Tensor.scatter_reduce_", "torch.index_put", "torch.Tensor.index_put", "torch.Tensor.index_put_",
    "aten.index_add", "aten.scatter_add", "aten.scatter_reduce", "aten.index_put"})
CONVOLUTION_OPS = frozenset({
    "torch.nn.functional.conv1d", "torch.nn.functional.conv2d", "torch.nn.functional.conv3d",
    "torch.conv1d", "torch.conv2d", "torch.conv3d", "torch.nn.functional.conv_transpose1d",
    "torch.nn.functional.conv_transpose2d", "torch.nn.functional.conv_transpose3d", "aten.convolution"})
NORMALIZING_OPS = frozenset({
    "torch.softmax", "torch.Tensor.softmax", "torch.nn.functional.softmax", "torch.log_softmax",
    "torch.Tensor.log_softmax", "torch.nn.functional.log_softmax", "aten._softmax", "aten._log_softmax"})
AFFINE_NORM_OPS = frozenset({
    "torch.nn.functional.layer_norm", "torch.layer_norm", "aten.layer_norm", "aten.native_layer_norm"})
MEAN_OPS = frozenset({"torch.mean", "torch.Tensor.mean", "aten.mean"})
_BIASED = CONVOLUTION_OPS | {"torch.nn.functional.linear", "aten.linear"}
# The judges' floor (casedb.judge.numerics.ULP_FLOOR, 4 ULPs) grows by one ULP per doubling of the terms.
GROWTH_PER_DOUBLING = 0.25
SCAN_WALK = 0.25  # scans: the floor grows by this many ULPs per sqrt(n)


def _name(op: str) -> str:
    name = op[len("torch.ops."):] if op.startswith("torch.ops.") else op
    return ".".join(name.split(".")[:2]) if name.startswith("aten.") else name


def kind(op: str | None) -> str | None:
    """"float32", "output", "normalize" or "affine" (see the module docstring), None for other ops."""
    if not op:
        return None
    name = _name(op)
    if name in SCATTER_ADD_OPS:
        return "output"
    if name in AFFINE_NORM_OPS:
        return "affine"
    if name in NORMALIZING_OPS:
        return "normalize"
    if name in ACCUMULATING_OPS or name in CONVOLUTION_OPS:
        return "float32"
    return None


def _arg(args, kwargs, i: int, key: str, default=None):
    if key in kwargs:
        return kwargs[key]
    return args[i] if len(args) > i else default


def terms(op: str, args, kwargs, out) -> int:
    """The most terms summed into one output element (1 when unknown)."""
    name, x = _name(op), args[0] if args else None
    if not isinstance(x, torch.Tensor):
        return 1
    if name in SCATTER_ADD_OPS:
        index = _arg(args, kwargs, 2, "index")
        if isinstance(index, torch.Tensor) and index.numel() and not index.is_floating_point():
            return 1 + int(torch.bincount(index.reshape(-1).to(torch.int64).clamp(min=0)).max())
        return 1
    if name in AFFINE_NORM_OPS:
        shape = _arg(args, kwargs, 1, "normalized_shape", ())
        return max(1, math.prod(shape)) if isinstance(shape, (list, tuple, torch.Size)) else 1
    if name in NORMALIZING_OPS or name.endswith("cumsum"):
        dim = _arg(args, kwargs, 1, "dim", -1)
        return x.shape[dim] if isinstance(dim, int) and x.dim() else 1
    if name in CONVOLUTION_OPS:
        w = _arg(args, kwargs, 1, "weight")
        return w[0].numel() if isinstance(w, torch.Tensor) and w.dim() else 1
    if name.endswith(("mm", "matmul", "linear", "bmm")):
        return x.shape[-1] if x.dim() else 1
    if isinstance(out, torch.Tensor) and out.numel():
        return max(1, x.numel() // out.numel())  # sums and means over some dims
    return 1


def growth(n: int) -> float:
    """How much a sum of ``n`` terms widens the floor: one ULP of it per doubling."""
    return 1.0 + math.log2(max(n, 1)) * GROWTH_PER_DOUBLING


def scan_growth(n: int) -> float:
    """How much a scan of ``n`` terms (or a sum taken sequentially) widens the floor: a random
    walk of ``n`` roundings."""
    return 1.0 + math.sqrt(max(n, 1)) * SCAN_WALK


def reciprocal_factor(op: str | None, args, kwargs, out, dtype: torch.dtype) -> float | None:
    """``fl(1/n) * n`` for a mean of ``n`` terms per element of ``out`` whose own dtype
    (``dtype``) accumulates in float32: the common factor of a mean computed as the sum times the
    rounded reciprocal. None for other ops, float64, or when the reciprocal is exact."""
    if not op or _name(op) not in MEAN_OPS or not isinstance(out, torch.Tensor) or dtype == torch.float64:
        return None
    n = terms(op, args, kwargs, out)
    factor = float(torch.tensor(1.0 / n, dtype=torch.float32).double() * n) if n > 1 else 1.0
    return None if factor == 1.0 else factor


def error_scale(op: str, fn: Callable, args, kwargs, hi_out: Any, dtype: torch.dtype) -> torch.Tensor | None:
    """The magnitude per element of ``hi_out`` (the call's high-precision output, on ``args``
    and ``kwargs``, its upcast inputs) at which a correct implementation's error in ``dtype``
    (the output's) is measured; None for ops that sum nothing (or when a call fails)."""
    k = kind(op)
    if k is None or not isinstance(hi_out, torch.Tensor) or not hi_out.is_floating_point():
        return None
    n = terms(op, args, kwargs, hi_out)
    if k == "normalize":
        return hi_out.abs() * growth(n)
    if k == "affine":
        mags = _affine_terms(args, kwargs, hi_out)
        if mags is None:
            return None
        acc = torch.float32 if dtype.itemsize <= 4 else torch.float64
        return mags * (scan_growth(n) * torch.finfo(acc).eps / torch.finfo(dtype).eps)
    mags = _call(fn, *_pytree.tree_map(_absolute, (args, kwargs)))
    if not isinstance(mags, torch.Tensor) or mags.shape != hi_out.shape:
        return None
    if k == "output":
        return mags * math.sqrt(n)
    acc = torch.float32 if dtype.itemsize <= 4 else torch.float64
    grown = scan_growth(n) if _name(op).endswith("cumsum") else growth(n)
    scale = mags * (grown * torch.finfo(acc).eps / torch.finfo(dtype).eps)
    bias = _arg(args, kwargs, 2, "bias") if _name(op) in _BIASED else None
    if isinstance(bias, torch.Tensor):
        # the bias alone, broadcast as the op adds it: the call with every other float input zeroed
        b = _call(fn, *_pytree.tree_map(lambda t: t.abs() if t is bias else torch.zeros_like(t) if isinstance(
            t, torch.Tensor) and t.is_floating_point() else t, (args, kwargs)))
        if isinstance(b, torch.Tensor) and b.shape == hi_out.shape:
            scale = torch.maximum(scale, hi_out.abs() + b)
    return scale


MATMUL_OPS = frozenset(n for n in ACCUMULATING_OPS if n.endswith(("mm", "matmul", "__matmul__", "linear", "einsum")))
_REDUCED = {torch.bfloat16: "allow_bf16_reduced_precision_reduction", torch.float16: "allow_fp16_reduced_precision_reduction"}


def reduced_precision_reduction(op: str | None, device: torch.device, dtype: torch.dtype | None) -> str | None:
    """The PyTorch setting that lets cuBLAS sum a bf16/fp16 matmul's split-K partials in that
    dtype, when it is on for this call (a CUDA matmul of such an output); else None. An H100's bf16
    lm_head was 22.7 ULPs off with it on (PyTorch's default) and passed with it off."""
    flag = _REDUCED.get(dtype)
    if flag is None or device.type != "cuda" or not op or _name(op) not in MATMUL_OPS:
        return None
    return f"torch.backends.cuda.matmul.{flag}" if getattr(torch.backends.cuda.matmul, flag, False) else None


def _affine_terms(args, kwargs, hi_out: torch.Tensor) -> torch.Tensor | None:
    """``|w| * (|x| + |mean|) * rstd + |b|`` of a layer_norm call (its upcast inputs), per element."""
    x, shape = (args[0] if args else None), _arg(args, kwargs, 1, "normalized_shape", ())
    if not isinstance(x, torch.Tensor) or not isinstance(shape, (list, tuple, torch.Size)) or not shape:
        return None
    w, b, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias"), _arg(args, kwargs, 4, "eps", 1e-5)
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    mean = x.mean(dims, keepdim=True)
    rstd = torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + float(eps))
    mags = (x.abs() + mean.abs()) * rstd
    if isinstance(w, torch.Tensor):
        mags = mags * w.abs()
    if isinstance(b, torch.Tensor):
        mags = mags + b.abs()
    return mags if mags.shape == hi_out.shape else None


def _absolute(t):
    return t.abs() if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) else t


def _call(fn, args, kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:  # the magnitudes are a refinement: without them the result's own scale stands
        return None
