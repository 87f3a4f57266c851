"""A case's logical dimensions: each size the op ties together across its tensor inputs (the K
of a matmul is the last dim of A and the second to last of B), which ones the output keeps, and
which one is reduced. Worked out from the stored case alone (no torch), for the op families whose
shapes follow known rules: pointwise ops (broadcasting), matmuls and reductions. Changing a dim
(:func:`resized`) changes every input axis that holds it, so the variant stays a valid call.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

MATMULS = ("matmul", "mm", "bmm", "addmm", "linear", "baddbmm")
REDUCTIONS = ("sum", "mean", "amax", "amin", "prod", "nansum", "logsumexp", "norm", "var", "std", "max", "min")
POINTWISE = ("add", "sub", "mul", "div", "maximum", "minimum", "where", "pow", "atan2", "lerp", "relu", "gelu",
             "silu", "sigmoid", "tanh", "exp", "log", "neg", "abs", "sqrt", "rsqrt", "sin", "cos", "clamp",
             "masked_fill", "softplus", "erf", "reciprocal", "square", "hardtanh", "leaky_relu", "elu")


@dataclass
class Dim:
    """One logical size: its name, the (input index, axis) places holding it, whether the output
    keeps it and whether the op sums over it (K)."""

    name: str
    size: int
    axes: list = field(default_factory=list)
    out: bool = True
    reduced: bool = False


@dataclass
class Dims:
    family: str                   # matmul, reduction, pointwise
    dims: list                    # [Dim], in output order (reduced ones last)

    def named(self, name: str) -> Dim | None:
        return next((d for d in self.dims if d.name == name), None)

    @property
    def out_shape(self) -> list[int]:
        return [d.size for d in self.dims if d.out]

    @property
    def k(self) -> Dim | None:
        red = [d for d in self.dims if d.reduced]
        return max(red, key=lambda d: d.size) if red else None


def base_name(op: str) -> str:
    """``torch.ops.aten.mm.default`` -> ``mm``; ``torch.nn.functional.linear`` -> ``linear``."""
    parts = op.split(".")
    if op.startswith("torch.ops.") and len(parts) >= 4:
        return parts[3]
    return parts[-1].rstrip("_")


def tensor_inputs(case: dict) -> list[tuple[int, dict]]:
    """(position, spec) of each plain tensor input of a case."""
    return [(i, s["tensor"]) for i, s in enumerate(case["inputs"]) if isinstance(s, dict) and "tensor" in s]


def of_case(case: dict) -> Dims | None:
    """The case's logical dims, or None when its op's shape rules are not known here."""
    name = base_name(case["op"])
    tensors = tensor_inputs(case)
    if not tensors:
        return None
    try:
        if name in MATMULS:
            return _matmul(name, tensors)
        if name in REDUCTIONS:
            return _reduction(case, tensors)
        if name in POINTWISE or len(tensors) == len(case["inputs"]):
            return _pointwise(tensors)
    except (ValueError, IndexError, TypeError):
        return None
    return None


def _pointwise(tensors) -> Dims | None:
    rank = max(len(t["shape"]) for _, t in tensors)
    dims = []
    for j in range(rank):
        sizes = [(i, len(t["shape"]) - rank + j, t["shape"][len(t["shape"]) - rank + j])
                 for i, t in tensors if len(t["shape"]) - rank + j >= 0]
        size = max(s for _, _, s in sizes)
        if any(s not in (1, size) for _, _, s in sizes):
            raise ValueError("shapes do not broadcast")
        dims.append(Dim(f"d{j}", size, [(i, a) for i, a, s in sizes if s == size and size != 1]))
    return Dims("pointwise", dims)


def _matmul(name: str, tensors) -> Dims | None:
    if name == "linear":
        (xi, x), (wi, w) = tensors[0], tensors[1]
        if len(w["shape"]) != 2 or not x["shape"]:
            return None
        dims = [Dim(f"d{j}", n, [(xi, j)]) for j, n in enumerate(x["shape"][:-1])]
        n_axes = [(wi, 0)] + [(bi, 0) for bi, b in tensors[2:3] if len(b["shape"]) == 1]
        dims.append(Dim("N", w["shape"][0], n_axes))
        dims.append(Dim("K", x["shape"][-1], [(xi, len(x["shape"]) - 1), (wi, 1)], out=False, reduced=True))
        return Dims("matmul", dims)
    bias = tensors[0] if name in ("addmm", "baddbmm") else None
    (ai, a), (bi, b) = tensors[1:3] if bias else tensors[:2]
    ra, rb = len(a["shape"]), len(b["shape"])
    if ra < 2 or rb < 2:
        return None
    batch = _pointwise([(ai, {"shape": a["shape"][:-2]}), (bi, {"shape": b["shape"][:-2]})]).dims if max(ra, rb) > 2 \
        else []
    m, n = Dim("M", a["shape"][-2], [(ai, ra - 2)]), Dim("N", b["shape"][-1], [(bi, rb - 1)])
    if bias:
        ci, c = bias
        shape = c["shape"]
        if shape and shape[-1] == n.size and n.size != 1:
            n.axes.append((ci, len(shape) - 1))
        if len(shape) >= 2 and shape[-2] == m.size and m.size != 1:
            m.axes.append((ci, len(shape) - 2))
    k = Dim("K", a["shape"][-1], [(ai, ra - 1), (bi, rb - 2)], out=False, reduced=True)
    return Dims("matmul", [*batch, m, n, k])


def _reduction(case: dict, tensors) -> Dims | None:
    xi, x = tensors[0]
    rank = len(x["shape"])
    if rank == 0:
        return None
    want = case.get("attrs", {}).get("dim")
    if want is None:
        rest = [s.get("value") for s in case["inputs"][xi + 1:xi + 2] if isinstance(s, dict) and "value" in s]
        want = rest[0] if rest and isinstance(rest[0], (int, list)) else None
    if isinstance(want, dict) and "value" in want:
        want = want["value"]
    reduced = set(range(rank)) if want is None else {int(d) % rank for d in ([want] if isinstance(want, int) else want)}
    dims = [Dim(f"d{j}", n, [(xi, j)], out=j not in reduced, reduced=j in reduced)
            for j, n in enumerate(x["shape"])]
    return Dims("reduction", [d for d in dims if d.out] + [d for d in dims if d.reduced])


def roles(dims: Dims) -> dict:
    """{role: Dim}: ``batch`` (the output's first dim, rank >= 2), ``last`` (the output's last),
    ``K`` (the reduced length)."""
    out = [d for d in dims.dims if d.out]
    found = {}
    if len(out) >= 2:
        found["batch"] = out[0]
    if out:
        found["last"] = out[-1]
    if dims.k is not None:
        found["K"] = dims.k
    return found


def numel(dims: Dims) -> int:
    return math.prod(dims.out_shape)


def resized(case: dict, dims: Dims, dim: Dim, size: int) -> dict:
    """A copy of ``case`` with logical dim ``dim`` at ``size`` in every input that holds it
    (presets that name strides keep them: a smaller extent stays inside the storage)."""
    new = copy.deepcopy(case)
    for i, axis in dim.axes:
        spec = new["inputs"][i]["tensor"]
        old = list(spec["shape"])
        spec["shape"][axis] = int(size)
        if spec.get("preset") == "strided":
            spec["preset_args"] = {**spec["preset_args"], "stride": restride(old, spec["preset_args"]["stride"],
                                                                                  spec["shape"])}
    return new


def restride(old_shape: list, old_stride: list, shape: list) -> list[int]:
    """Strides for ``shape`` laid out as ``old_stride`` lays out ``old_shape``: the same order of
    dims, the same gaps between them, zero strides (broadcast) kept."""
    order = sorted((i for i, s in enumerate(old_stride) if s != 0), key=lambda i: (old_stride[i], -i))
    out = [0] * len(shape)
    step, old_step = 1, 1
    for i in order:
        gap = old_stride[i] // old_step if old_step and old_stride[i] % old_step == 0 else 1
        out[i] = step * max(gap, 1)
        step, old_step = out[i] * max(shape[i], 1), old_stride[i] * max(old_shape[i], 1)
    return out
