"""Faulty backends: a real dynamo backend with one known bug added, to measure what casedb catches.

Each mutant is a small function registered with :func:`mutant`; its docstring names the real bug
class it models. Importing this module registers one dynamo backend per mutant, named
``casedb_mutant_<name>`` (``casedb run --import casedb.mutation.mutants --backend casedb_mutant_zeros``;
``casedb mutants`` runs them all and scores them, see :mod:`casedb.mutation.score`). Every backend
compiles the graph with a real *base* backend — environment variable ``CASEDB_MUTANT_BASE``,
default ``eager`` (dynamo's eager backend: the captured graph run by PyTorch), or ``aot_eager``,
``inductor``, any registered name; read at compile time, so ``-j`` workers inherit it — runs it,
and adds the bug. ``casedb_mutant_none`` adds nothing: the control.

Kinds (``@mutant(name, kind=...)``):

* ``"output"``: ``f(tensor) -> tensor`` of the same shape and dtype, applied to every tensor the
  call produces: its outputs, and the inputs it writes into (changed in place, so the written
  arguments show the bug too). Return the tensor itself where the bug does not apply.
* ``"input"``: ``f(args) -> list | None``: the arguments the base is called with (``None``: the
  bug does not apply to this call). Replaced tensors the call writes into are written back.
* ``"call"``: ``f(call, args) -> outputs | None``: the whole call; ``call(*args)`` runs the base,
  ``call.gm`` is the captured graph. Must not touch ``args`` before returning ``None``.

Every call notes whether the bug changed anything (``casedb.run.execute.note("mutant", {"name",
"changed", "base"})``; a run keeps it in ``results.metrics.notes``): the mutated result (outputs
and written inputs) is compared with the base's true result, computed on copies of the inputs so
in-place ops are not applied twice (copies keep strides and storage offsets, so compiled code
sees the layout it was compiled for; inputs whose storage exceeds ``harness.COPY_LIMIT`` are shared and
assumed read-only). The registry, the backends and the helpers are
:mod:`casedb.mutation.harness`. A mutant that raises where the base does not counts as a change.

Users add their own in a module given to ``--import`` (``casedb mutants --import my_bugs.py``)::

    from casedb.mutation.mutants import mutant

    @mutant("halved", kind="output")
    def halved(y):
        \"\"\"Outputs halved: a scale applied twice.\"\"\"
        return y / 2 if y.is_floating_point() else y
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from casedb.mutation.harness import CONTROL, is_floating, overlapping, copy_input, like, map_tensors, mutant, tensors, ulp

TILE = 64                  # the padding mutant's tile width
LARGE = 2**16              # elements from which the large-tensor mutant's tiling applies
CORES = 8                  # ... over this many cores
ULP_ERROR = 16             # the k of the k-ULP error
REL_ERROR = 1e-3           # the relative error mutant's error
ACC_BLOCK = 64             # elements summed exactly before the low-precision accumulator rounds


# ------------------------------------------------------------------------------------ the bugs

@mutant(CONTROL, kind="output")
def none(y):
    """No bug: the base backend as it is (the control)."""
    return y


@mutant("padding", kind="output")
def padding(y):
    """Wrong values where a dim is not a multiple of the tile: when the last dim is not a
    multiple of 64, the last element of every row (the end of the partial tile) is written as 0
    — a masked store or a padded tail off by one."""
    if y.dim() == 0 or y.numel() == 0 or y.shape[-1] % TILE == 0:
        return y
    out = y.clone()
    out[..., -1] = 0
    return out


@mutant("large_tensor", kind="output")
def large_tensor(y):
    """Wrong values for large tensors (multi-core tiling): a tensor of 64 Ki elements or more is
    split over 8 cores, and the last core writes the previous core's slice (a wrong tile
    offset)."""
    n = y.numel()
    if n < LARGE:
        return y
    flat = y.contiguous().reshape(-1).clone()
    chunk = -(-n // CORES)
    start = chunk * (CORES - 1)
    flat[start:] = flat[start - chunk: start - chunk + (n - start)]
    return like(y, flat.reshape(y.shape))


@mutant("broadcast", kind="call")
def broadcast(call, args):
    """Wrong values on broadcast of size-1 dims: an input broadcast along a dim of size 1 (or a
    missing leading dim) is replicated into the first slice of the output only; the other slices
    read zeros instead of the broadcast values."""
    y = _first_output(call.gm)
    if y is None:
        return None
    for i, x in enumerate(args):
        if not isinstance(x, torch.Tensor) or x.numel() >= y.numel() or y.dim() == 0:
            continue
        try:
            if torch.broadcast_shapes(x.shape, y.shape) != y.shape:
                continue
        except RuntimeError:
            continue
        shape = [1] * (y.dim() - x.dim()) + list(x.shape)
        dims = [d for d in range(y.dim()) if shape[d] == 1 and y.shape[d] > 1]
        if not dims:
            continue
        d = dims[-1]
        zeroed = [copy_input(a) for a in args]
        zeroed[i] = copy_input(x, zeroed=True)
        y0 = tensors(call(*zeroed))[0]
        out = call(*args)
        first = tensors(out)[0]
        mixed = first.clone()
        mixed.narrow(d, 1, y.shape[d] - 1).copy_(y0.narrow(d, 1, y.shape[d] - 1))
        done = [False]

        def swap(t):
            if t is first and not done[0]:
                done[0] = True
                return mixed
            return t

        return map_tensors(out, swap)
    return None


def _first_output(gm):
    """The graph's first tensor output as dynamo traced it (a fake tensor: shape only), or None
    (None too without a graph: the tensor-level base)."""
    if getattr(gm, "graph", None) is None:
        return None
    node = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if node is None:
        return None
    found = []
    torch.fx.node.map_arg(node.args, lambda n: found.append(n.meta.get("example_value")) or n)
    return next((v for v in found if isinstance(v, torch.Tensor)), None)


@mutant("noncontiguous", kind="input")
def noncontiguous(args):
    """A non-contiguous input read as contiguous: the kernel ignores the strides and reads the
    storage row-major from the tensor's offset (a transposed or sliced view misread)."""
    new, hit = list(args), False
    for i, x in enumerate(args):
        if not isinstance(x, torch.Tensor) or x.is_contiguous() or x.numel() < 2 or overlapping(x):
            continue
        if x.untyped_storage().nbytes() // x.element_size() - x.storage_offset() < x.numel():
            continue
        misread = x.as_strided(x.shape, torch.empty(x.shape, device="meta").stride(), x.storage_offset())
        new[i] = like(x, misread)
        hit = True
    return new if hit else None


@mutant("inplace_lost", kind="call")
def inplace_lost(call, args):
    """An in-place result not written back: the op computes into a temporary and never copies
    it into the tensor it should update (a functionalized copy-back dropped)."""
    return call(*[copy_input(a) for a in args])


@mutant("lost_sign", kind="output")
def lost_sign(y):
    """Lost sign: negative results come out positive (a sign bit dropped, signed data read as
    unsigned magnitude)."""
    if y.dtype == torch.bool or not (y.is_floating_point() or y.is_signed()):
        return y
    return y.abs()


@mutant("nan_inf", kind="output")
def nan_inf(y):
    """NaN/Inf not propagated: NaN becomes 0 and ±inf the largest finite value (fast-math,
    saturating arithmetic, a max/clamp that drops NaN)."""
    return torch.nan_to_num(y, nan=0.0) if is_floating(y) else y


@mutant("low_precision_acc", kind="call")
def low_precision_acc(call, args):
    """A reduction accumulated in low precision: sums, means, norms, softmax and matmuls keep
    their running sum in bfloat16 (float16 for float16 data) instead of float32, rounding after
    every block of 64 elements."""
    mode = _LowPrecisionAccumulation()
    copies = [copy_input(a) for a in args]  # args stay untouched until the bug is known to apply
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in copies]
    with mode:
        out = call.gm(*copies)
    if not mode.hits:
        return None
    for a, c, v in zip(args, copies, versions):
        if isinstance(c, torch.Tensor) and c is not a and c._version != v:
            a.copy_(c)
    return out


@mutant("fp32_as_bf16", kind="call")
def fp32_as_bf16(call, args):
    """float32 computed in bfloat16: float32 inputs are rounded to bfloat16 before the op and
    float32 results after it (a backend without a float32 path, or a silent downcast)."""
    def rounded(t):
        return like(t, t.to(torch.bfloat16).to(t.dtype)) if t.dtype == torch.float32 else t

    new = [rounded(a) if isinstance(a, torch.Tensor) else map_tensors(a, rounded) for a in args]
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in new]
    out = call(*new)
    for a, n, v in zip(args, new, versions):  # what the call wrote, written back rounded
        if isinstance(n, torch.Tensor) and n._version != v:
            a.copy_(n.to(torch.bfloat16) if n.dtype == torch.float32 else n)
    return map_tensors(out, lambda t: t.to(torch.bfloat16).to(t.dtype) if t.dtype == torch.float32 else t)


@mutant("ulp_error", kind="output")
def ulp_error(y):
    """An error of 16 ULPs of the output dtype on every nonzero element, away from zero (a
    poor approximation of a transcendental, a wrong rounding mode in a long chain)."""
    if not is_floating(y) or y.numel() == 0:
        return y
    y64 = y.to(torch.float64)
    moved = y64 + torch.sign(y64) * ULP_ERROR * ulp(y)
    return torch.where(torch.isfinite(y64), moved, y64).to(y.dtype)


@mutant("rel_error", kind="output")
def rel_error(y):
    """A relative error of 0.1 % on every floating element (a wrong constant, a scale computed
    at reduced precision)."""
    return y * (1 + REL_ERROR) if is_floating(y) else y


@mutant("zeros", kind="output")
def zeros(y):
    """All-zero output: a kernel that never writes its result (an output buffer returned as
    allocated, zero-initialised)."""
    return torch.zeros_like(y)


@mutant("index_off_by_one", kind="input")
def index_off_by_one(args):
    """Index off by one: integer inputs (indices, ids, positions) are read one further: i + 1,
    or i - 1 at the largest index (so the index stays in the range the case uses)."""
    new, hit = list(args), False
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor) and x.numel() and not x.is_floating_point() and not x.is_complex() \
                and x.dtype != torch.bool:
            new[i] = like(x, torch.where(x < x.max(), x + 1, x - 1))
            hit = True
    return new if hit else None


# ------------------------------------------------------------------------------------ low precision

_LOW = {torch.float32: torch.bfloat16, torch.bfloat16: torch.bfloat16, torch.float16: torch.float16}


def _acc_sum(x: torch.Tensor, dims, keepdim: bool, out_dtype) -> torch.Tensor:
    """Sum of ``x`` over ``dims``, accumulated in x's low-precision accumulator dtype."""
    low = _LOW[x.dtype]
    nd = x.dim()
    dims = sorted({d % nd for d in dims}) if dims else list(range(nd))
    rest = [d for d in range(nd) if d not in dims]
    moved = x.permute(*rest, *dims)
    flat = moved.reshape(*[x.shape[d] for d in rest], -1)
    acc = torch.zeros(flat.shape[:-1], dtype=low)
    for block in flat.split(ACC_BLOCK, dim=-1):
        acc = (acc.float() + block.float().sum(-1)).to(low)
    out = acc.to(out_dtype)
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d)
    return out


def _acc_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (2-d or batched 3-d), accumulated over K in the low-precision accumulator dtype."""
    low = _LOW[a.dtype]
    k = a.shape[-1]
    acc = torch.zeros((*a.shape[:-1], b.shape[-1]), dtype=low)
    for k0 in range(0, k, ACC_BLOCK):
        part = a[..., k0:k0 + ACC_BLOCK].float() @ b[..., k0:k0 + ACC_BLOCK, :].float()
        acc = (acc.float() + part).to(low)
    return acc.to(a.dtype)


class _LowPrecisionAccumulation(TorchDispatchMode):
    """Runs reductions with a low-precision accumulator (see low_precision_acc); counts hits."""

    def __init__(self):
        super().__init__()
        self.hits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self._low(func, args, kwargs)
        if out is None:
            return func(*args, **kwargs)
        self.hits += 1
        return out

    def _low(self, func, args, kwargs):
        aten = torch.ops.aten
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dtype not in _LOW or x.device.type != "cpu":
            return None
        if func in (aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            dtype = kwargs.get("dtype") or x.dtype
            if not dtype.is_floating_point:
                return None
            s = _acc_sum(x, dims, keep, torch.float32)
            if func in (aten.mean.default, aten.mean.dim):
                s = s / max(1, x.numel() // max(1, s.numel()))
            return s.to(dtype)
        if func in (aten.mm.default, aten.bmm.default) and args[1].dtype == x.dtype:
            return _acc_mm(x, args[1])
        if func in (aten.addmm.default, aten.baddbmm.default) and args[1].dtype in _LOW:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            return (beta * x.float() + alpha * _acc_mm(args[1], args[2]).float()).to(args[1].dtype)
        if func in (aten._softmax.default, aten._log_softmax.default):
            dim = args[1]
            z = x.float() - x.float().amax(dim, keepdim=True)
            s = _acc_sum(z.exp().to(x.dtype), [dim], True, torch.float32)
            out = z - s.log() if func is aten._log_softmax.default else z.exp() / s
            return out.to(x.dtype)
        if func is aten.native_layer_norm.default:
            shape, weight, bias, eps = args[1], args[2], args[3], args[4]
            dims = list(range(x.dim() - len(shape), x.dim()))
            n = math.prod(shape)
            mean = _acc_sum(x, dims, True, torch.float32) / n
            var = _acc_sum((x.float() - mean).square().to(x.dtype), dims, True, torch.float32) / n
            rstd = torch.rsqrt(var + eps)
            y = (x.float() - mean) * rstd
            if weight is not None:
                y = y * weight.float()
            if bias is not None:
                y = y + bias.float()
            # the CPU kernel returns mean and rstd in the input's dtype (CUDA's in float32)
            return y.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)
        return None


# ------------------------------------------------------------------------------------ rounding and range

_WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def truncate(wide: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``wide`` converted to ``dtype`` rounding toward zero: round to nearest, then one step back
    toward zero wherever that rounded away from it."""
    near = wide.to(dtype)
    away = near.to(torch.float64).abs() > wide.to(torch.float64).abs()
    return torch.where(away & torch.isfinite(near), torch.nextafter(near, torch.zeros_like(near)), near)


@mutant("truncation", kind="call")
def truncation(call, args):
    """Round-toward-zero where round-to-nearest is required: the op computes in the next wider
    dtype (bf16/fp16 in float32, float32 in float64) and a conversion unit truncates each result
    into the output dtype — about half the elements one ULP smaller in magnitude, never larger,
    each within 1 ULP."""
    def widen(t):
        return t.to(_WIDER[t.dtype]) if isinstance(t, torch.Tensor) and t.dtype in _WIDER else t

    wide_args = [widen(a) if isinstance(a, torch.Tensor) else map_tensors(a, widen) for a in args]
    if all(w is a for w, a in zip(wide_args, args)):
        return None  # no floating input to compute wider
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in wide_args]
    try:
        wide = call.gm(*wide_args)
    except Exception:  # the op takes no wider dtype here: the bug cannot apply
        return None
    if any(isinstance(w, torch.Tensor) and w._version != v for w, v in zip(wide_args, versions)):
        return None  # writes into its inputs: the truncated result would have to be written back
    out = call(*args)
    flat_out, flat_wide = tensors(out), tensors(wide)
    if len(flat_out) != len(flat_wide):
        return None
    swap = {id(o): like(o, truncate(w, o.dtype)) for o, w in zip(flat_out, flat_wide)
            if o.dtype in _WIDER and w.dtype == _WIDER[o.dtype] and o.shape == w.shape}
    return map_tensors(out, lambda t: swap.get(id(t), t))


@mutant("softmax_overflow", kind="call")
def softmax_overflow(call, args):
    """Softmax without subtracting the maximum: softmax, log_softmax and logsumexp exponentiate
    the raw logits (in float32, in float16 for float16 data), so logits above ~88 (float32,
    bfloat16) or ~11 (float16) overflow to inf and the result to NaN."""
    mode = _NaiveSoftmax()
    copies = [copy_input(a) for a in args]
    with mode:
        out = call.gm(*copies)
    return out if mode.hits else None


class _NaiveSoftmax(_LowPrecisionAccumulation):
    """Runs softmax-like ops without the max subtracted (see softmax_overflow); counts hits."""

    def _low(self, func, args, kwargs):
        aten = torch.ops.aten
        x = args[0] if args else None
        if func not in (aten._softmax.default, aten._log_softmax.default, aten.logsumexp.default) or \
                not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return None
        dim = args[1]
        work = x.float() if x.dtype == torch.bfloat16 else x  # fp16 overflows at its own range
        if func is aten.logsumexp.default:
            keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            return work.exp().sum(dim, keepdim=keep).log().to(x.dtype)
        e = work.exp()
        s = e.sum(dim, keepdim=True)
        out = e.log() - s.log() if func is aten._log_softmax.default else e / s
        return out.to(torch.float32 if args[2] and x.dtype != torch.float32 else x.dtype)
