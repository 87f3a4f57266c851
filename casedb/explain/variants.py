"""Variants of a stored case, each changing one feature: every input contiguous, another dtype,
a broadcast input materialized, one dim at another size (bisection, rounding to a multiple,
shrinking), the values' magnitude scaled. Pure: a case dict in, a new case dict (or None when the
change does not apply) out; :mod:`casedb.explain.rounds` runs them.
"""

from __future__ import annotations

import copy

from casedb.cases import dtypes
from casedb.explain import dims as dims_mod
from casedb.explain.features import of_case as features_of

LOW = ("bfloat16", "float16")


def contiguous(case: dict) -> dict | None:
    """Every tensor input laid out contiguously (its preset dropped)."""
    new = copy.deepcopy(case)
    changed = False
    for _, spec in dims_mod.tensor_inputs(new):
        if spec.pop("preset", None) is not None:
            spec.pop("preset_args", None)
            changed = True
    return new if changed else None


def other_dtype(case: dict, to: str | None = None) -> dict | None:
    """The case's floating inputs in dtype ``to`` (default: float32 for a low-precision case,
    bfloat16 otherwise)."""
    src = case["dtype"]
    if src not in dtypes.FLOATING:
        return None
    to = to or ("float32" if src in LOW else "bfloat16")
    new = copy.deepcopy(case)
    changed = False
    for _, spec in dims_mod.tensor_inputs(new):
        if spec["dtype"] == src:
            spec["dtype"] = to
            changed = True
    new["dtype"] = to
    return new if changed else None


def materialized(case: dict) -> dict | None:
    """Each broadcast input at the full size it is broadcast to (pointwise ops), and each input
    broadcast by its layout (stride 0) stored whole."""
    new = copy.deepcopy(case)
    d = dims_mod.of_case(new)
    changed = False
    for _, spec in dims_mod.tensor_inputs(new):
        if features_of({"op": case["op"], "inputs": [{"tensor": spec}], "attrs": {}, "dtype": spec["dtype"]}
                       ).get("layout:in0") == "broadcast":
            spec.pop("preset", None)
            spec.pop("preset_args", None)
            changed = True
        if d is not None and d.family == "pointwise" and list(spec["shape"]) != d.out_shape:
            spec["shape"] = list(d.out_shape)
            spec.pop("preset", None)
            spec.pop("preset_args", None)
            changed = True
    return new if changed else None


def with_size(case: dict, role: str, size: int) -> dict | None:
    """The case with its ``role`` dim (K, last, batch) at ``size``."""
    d = dims_mod.of_case(case)
    dim = dims_mod.roles(d).get(role) if d else None
    if dim is None or size < 1 or not dim.axes:
        return None
    return dims_mod.resized(case, d, dim, size)


def with_numel(case: dict, numel: int) -> dict | None:
    """The case with its largest output dim resized so the output holds about ``numel`` elements."""
    d = dims_mod.of_case(case)
    if d is None:
        return None
    outs = [x for x in d.dims if x.out and x.axes]
    if not outs:
        return None
    dim = max(outs, key=lambda x: x.size)
    rest = max(dims_mod.numel(d) // max(dim.size, 1), 1)
    size = max(numel // rest, 1)
    return dims_mod.resized(case, d, dim, size)


def numel_step(case: dict) -> int:
    """How many elements one step of :func:`with_numel` moves the output by."""
    d = dims_mod.of_case(case)
    outs = [x for x in d.dims if x.out and x.axes] if d else []
    if not outs:
        return 1
    dim = max(outs, key=lambda x: x.size)
    return max(dims_mod.numel(d) // max(dim.size, 1), 1)


def rounded(case: dict, role: str, multiple: int, odd_half: bool = False) -> dict | None:
    """The ``role`` dim rounded up to a multiple of ``multiple`` (``odd_half``: to an odd multiple
    of half of it instead: still not a multiple of it)."""
    f = features_of(case)
    size = f.get(role)
    if size is None:
        return None
    if odd_half:
        half = multiple // 2
        n = -(-size // half)
        n += 1 if n % 2 == 0 else 0
        return with_size(case, role, n * half)
    return with_size(case, role, -(-size // multiple) * multiple)


def shrunk(case: dict) -> list[tuple[str, dict]]:
    """Smaller versions of the case: every dim at 1, at 2, quartered and halved at once; each dim
    at 1 and halved on its own."""
    d = dims_mod.of_case(case)
    if d is None:
        return []
    movable = [x for x in d.dims if x.axes and x.size > 1]
    out = []
    if len(movable) > 1:
        for how, size_of in (("every dim at 1", lambda n: 1), ("every dim at 2", lambda n: min(n, 2)),
                             ("every dim quartered", lambda n: max(n // 4, 1)),
                             ("every dim halved", lambda n: max(n // 2, 1))):
            new = case
            for x in movable:
                nd = dims_mod.of_case(new)
                new = dims_mod.resized(new, nd, nd.named(x.name), size_of(x.size))
            out.append((how, new))
    for x in movable:
        for size, how in ((1, "at 1"), (x.size // 2, "halved")):
            if how == "at 1" or x.size > 2:
                out.append((f"{x.name} {how} ({x.size} -> {size})", dims_mod.resized(case, d, x, size)))
    return out


def scaled(case: dict, factor: float) -> dict | None:
    """The floating random inputs' magnitude times ``factor`` (randn's std, uniform's bounds)."""
    new = copy.deepcopy(case)
    changed = False
    for _, spec in dims_mod.tensor_inputs(new):
        init, args = spec.get("init", "randn"), dict(spec.get("init_args") or {})
        if spec["dtype"] not in dtypes.FLOATING:
            continue
        if init == "randn":
            args["std"] = float(args.get("std", 1.0)) * factor
            args["mean"] = float(args.get("mean", 0.0)) * factor
        elif init == "uniform":
            args = {k: float(v) * factor for k, v in args.items()}
        elif init == "rand":
            init, args = "uniform", {"low": 0.0, "high": factor}
        else:
            continue
        spec["init"], spec["init_args"] = init, args
        changed = True
    return new if changed else None
