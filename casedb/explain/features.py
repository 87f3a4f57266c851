"""A case's features, from its stored op, inputs, attrs and dtype: what a condition over failing
and passing cases is written in (:mod:`casedb.explain.conditions`).

Each feature is a name and a plain value: ``op``, ``dtype`` (the case's), ``dtype:inN`` (each tensor
input's), ``layout:inN`` (:func:`casedb.cases.layout.tensor_layout`), ``noncontiguous`` (an input
is not contiguous), ``broadcast`` (an input is broadcast: by its layout or by its shape against
the others), ``rank`` (the output's, else the largest input's), the sizes ``batch``, ``last`` and
``K`` (:func:`casedb.explain.dims.roles`), ``numel`` (the output's elements when its shape is
known, else the largest input's) and ``values`` (the run's value mode).
"""

from __future__ import annotations

import math

from casedb.cases.layout import tensor_layout
from casedb.cases.marks import iter_tensors
from casedb.explain import dims as dims_mod

SIZES = ("K", "last", "batch")


def of_case(case: dict, values: str | None = "random") -> dict:
    """{feature: value} of one case (a dict with op, inputs, attrs, dtype)."""
    tensors = list(iter_tensors(case["inputs"], case.get("attrs") or {}))
    f: dict = {"op": dims_mod.base_name(case["op"]), "dtype": case["dtype"], "values": values or "random"}
    layouts = []
    for n, (_, spec) in enumerate(dims_mod.tensor_inputs(case)):
        f[f"dtype:in{n}"] = spec["dtype"]
        layouts.append(_layout(spec))
        f[f"layout:in{n}"] = layouts[-1]
    f["noncontiguous"] = any(w != "contiguous" for w in layouts)
    d = dims_mod.of_case(case)
    f["broadcast"] = "broadcast" in layouts or (d is not None and d.family == "pointwise" and _shape_broadcast(case))
    if d is not None:
        f["rank"] = len(d.out_shape)
        for role, dim in dims_mod.roles(d).items():
            f[role] = dim.size
        f["numel"] = dims_mod.numel(d)
    else:
        f["rank"] = max((len(t["shape"]) for t in tensors), default=0)
        f["numel"] = max((math.prod(t["shape"]) for t in tensors), default=0)
    return f


def _layout(spec: dict) -> str:
    try:
        return tensor_layout(spec)
    except (KeyError, ValueError, TypeError):  # a preset this reading does not know: not contiguous
        return "strided"


def _shape_broadcast(case: dict) -> bool:
    shapes = [list(t["shape"]) for _, t in dims_mod.tensor_inputs(case)]
    full = dims_mod.of_case(case).out_shape
    return any(s != full for s in shapes)
