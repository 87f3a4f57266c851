"""Value ranges: the inputs of a case's *extremal* variant (``casedb run --values extremal``).

Every shipped case draws its floating inputs from ``randn``/``rand``, so bugs that need large
magnitudes never fire: a softmax that does not subtract the maximum overflows only for logits
above ~88 (float32, bfloat16) or ~11 (float16); exp overflows; sums and norms overflow or cancel;
conversions saturate; NaN, ±inf, ±0 and subnormals take paths random data never takes. The
extremal variant of a case is the same call (op, shapes, dtypes, layouts, seed) with its random
floating inputs drawn from the range its op family is at risk in. It runs as its own run and is
stored as separate results of the same case (``results.input_values``), judged as any result is
(NaN and inf must sit where the reference has them).

One rule per op family (:data:`FAMILIES`; :data:`OPS` maps each op, by its bare name, to one):

* ``softmax`` — softmax, log_softmax, logsumexp: the logits (first input) shifted by
  ``log(max) + 8`` (96.7 for float32/bfloat16, 19.1 for float16). The correct result is the
  random one's (softmax is shift-invariant) and finite; without the max subtracted, exp overflows.
* ``attention`` — scaled_dot_product_attention: the query scaled so that the scores reach
  ``log(max) + 8``: a kernel that exponentiates raw scores overflows.
* ``exp`` — exp, expm1, exp2, sinh, cosh: the input uniform in ``[log(max) - 16, log(max) + 4]``:
  results near the dtype's largest, a fifth past it (inf on both sides).
* ``large`` — sums, means, norms, variance, cumsum, matmul, linear, einsum, pow: every random
  floating input around ``max ** 0.25`` (4.29e9 for float32/bfloat16, 16 for float16), one sign,
  spread an eighth of that: squares and products stay in range for a correct kernel, a sum
  accumulated in float16 does not, and a variance taken as E[x²] - E[x]² cancels 6 bits. (Not
  centred: a cancelling sum in another order is correct, yet off by more than the dtype's rtol.)
* ``specials`` — elementwise ops that define NaN, ±inf, ±0 and subnormals (add, mul, where,
  maximum, clamp, activations, rsqrt, conversions ...): every eighth element of each random floating
  input is one of :func:`special_values` (cycled; the dtype's largest saturates a narrowing
  conversion), the rest stay random.

Only tensors whose values are random are changed: data, blobs, and the indices, masks and
offsets :mod:`casedb.cases.valid_inputs` constrains keep their values. An op without a rule has no
extremal variant: :func:`variant` returns None and the run skips it (the variant would repeat the
random one). To add a family: a function ``f(spec, dtype) -> None`` that rewrites one tensor
spec, an entry in FAMILIES and the ops in OPS.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch

from casedb.cases import dtypes

VARIANTS = ("random", "extremal")
SPECIALS = "_specials"  # private tensor-spec key: materialize sprinkles special_values() over the tensor
SPECIAL_STRIDE = 8      # every this many elements, one is special
_RANDOM_INITS = (None, "randn", "rand", "uniform")


def _log_max(dtype: torch.dtype) -> float:
    return math.log(torch.finfo(dtype).max)


def _softmax(spec: dict, dtype: torch.dtype) -> None:
    args = spec.setdefault("init_args", {})
    spec["init"] = "randn"
    args["mean"] = args.get("mean", 0) + round(_log_max(dtype) + 8, 1)


def _attention(spec: dict, dtype: torch.dtype) -> None:
    # with unit keys the scores q.k / sqrt(E) are about N(0, std_q^2), and the largest of a few hundred
    # is about 3 std_q: a third of log(max) + 8 puts it where exp overflows
    spec["init"] = "randn"
    spec.setdefault("init_args", {})["std"] = round((_log_max(dtype) + 8) / 3, 1)


def _exp(spec: dict, dtype: torch.dtype) -> None:
    top = _log_max(dtype)
    spec["init"] = "uniform"
    spec["init_args"] = {"low": round(top - 16, 1), "high": round(top + 4, 1)}


def _large(spec: dict, dtype: torch.dtype) -> None:
    # one sign: centred data would cancel, and a correct sum in another order then differs from the
    # reference by more than the dtype's rtol (inductor's float32 mean of 8,192 such values: 7.8e-6)
    s = float(f"{torch.finfo(dtype).max ** 0.25:.3g}")
    spec["init"], spec["init_args"] = "randn", {"mean": s, "std": s / 8}


def _specials(spec: dict, dtype: torch.dtype) -> None:
    spec[SPECIALS] = True


# family -> (which inputs: "first" or "all" random floating tensors, the rewrite of one spec)
FAMILIES: dict[str, tuple[str, Callable]] = {
    "softmax": ("first", _softmax),
    "attention": ("first", _attention),
    "exp": ("first", _exp),
    "large": ("all", _large),
    "specials": ("all", _specials),
}
OPS: dict[str, str] = {
    **dict.fromkeys(("softmax", "log_softmax", "logsumexp", "_softmax", "_log_softmax"), "softmax"),
    **dict.fromkeys(("scaled_dot_product_attention",), "attention"),
    **dict.fromkeys(("exp", "expm1", "exp2", "sinh", "cosh"), "exp"),
    **dict.fromkeys(("sum", "nansum", "mean", "cumsum", "var", "std", "norm", "vector_norm", "layer_norm",
                     "rms_norm", "group_norm", "batch_norm", "matmul", "__matmul__", "mm", "bmm", "linear", "einsum",
                     "addmm", "baddbmm", "pow"), "large"),
    **dict.fromkeys(("add", "sub", "mul", "div", "neg", "abs", "where", "maximum", "minimum", "clamp", "relu",
                     "silu", "sigmoid", "gelu", "tanh", "softplus", "rsqrt", "sqrt", "to", "float", "type_as",
                     "masked_fill", "__add__", "__mul__", "__sub__", "__truediv__"), "specials"),
}


def op_name(op: str) -> str:
    """The bare name a rule is keyed by: ``torch.nn.functional.softmax``, ``torch.Tensor.softmax``,
    ``torch.ops.aten._softmax.default`` -> softmax / _softmax; an in-place ``add_`` -> add."""
    parts = op.split(".")
    if op.startswith("torch.ops.") and len(parts) >= 4:
        name = parts[3]
    else:
        name = parts[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def family(op: str) -> str | None:
    """The value-range family of ``op`` (None: no rule)."""
    return OPS.get(op_name(op))


def variant(case: dict, values: str) -> dict | None:
    """The case to run for ``values``: the case itself for ``random``; for ``extremal`` a copy
    with its random floating inputs rewritten by its op family's rule, or None when the op has
    no rule or the case has no random floating input to change."""
    if values == "random":
        return case
    if values not in VARIANTS:
        raise ValueError(f"values must be one of {', '.join(VARIANTS)}, not {values!r}")
    fam = family(case.get("op") or "")
    if fam is None or (fam == "specials" and _converts_to_integers(case)):
        return None
    which, rewrite = FAMILIES[fam]
    out = copy.deepcopy(case)
    changed = False
    for spec in _tensor_specs(out):
        dtype = _random_floating(spec, out.get("dtype") or "float32")
        if dtype is None:
            continue
        rewrite(spec, dtype)
        changed = True
        if which == "first":
            break
    return out if changed else None


def _converts_to_integers(case: dict) -> bool:
    """Whether a conversion (``to``, ``type_as``) may give integers: NaN and inf have no integer
    value, so what a backend makes of them is its own choice, not a bug."""
    if op_name(case.get("op") or "") not in ("to", "type_as"):
        return False
    attrs = case.get("attrs") or {}
    for item in list(case.get("inputs") or [])[1:] + list(attrs.values()):  # a dtype value, or the other tensor's
        if isinstance(item, dict):
            item = item["tensor"].get("dtype") if isinstance(item.get("tensor"), dict) else item.get("value")
        try:
            if isinstance(item, str) and dtypes.canonical(item) not in dtypes.FLOATING:
                return True
        except dtypes.UnknownDtype:
            continue
    return False


def _tensor_specs(case: dict):
    """The tensor specs of a case's inputs, positional first, then keyword ones by name (the order
    materialize generates them in)."""
    attrs = case.get("attrs") or {}
    items = list(case.get("inputs") or []) + [attrs[k] for k in sorted(attrs)]
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("tensor"), dict):
            yield item["tensor"]


def _random_floating(spec: dict, case_dtype: str) -> torch.dtype | None:
    """The dtype of a tensor spec whose values are random and floating (float16 and wider), else None."""
    if "blob" in spec or spec.get("data") is not None or spec.get("init") not in _RANDOM_INITS:
        return None
    try:
        name = dtypes.canonical(spec.get("dtype") or case_dtype)
    except dtypes.UnknownDtype:
        return None
    if name not in ("float16", "bfloat16", "float32", "float64"):
        return None
    return getattr(torch, name)


def special_values(dtype: torch.dtype) -> list[float]:
    """The values sprinkled over a ``specials`` tensor, in order."""
    info = torch.finfo(dtype)
    return [math.inf, -math.inf, math.nan, 0.0, -0.0, info.tiny / 4, -info.tiny / 4, info.max, -info.max,
            65504.0 * 2]


def sprinkle(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every SPECIAL_STRIDE-th element (flat, row-major) set to :func:`special_values` in turn."""
    if not t.is_floating_point() or t.numel() == 0:
        return t
    flat = t.contiguous().reshape(-1).clone()
    vals = torch.tensor(special_values(t.dtype), dtype=torch.float64)
    idx = torch.arange(0, flat.numel(), SPECIAL_STRIDE)
    flat[idx] = vals[torch.arange(idx.numel()) % vals.numel()].to(t.dtype)
    return flat.reshape(t.shape)
