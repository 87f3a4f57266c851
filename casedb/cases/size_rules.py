"""Input rules for sizes that must fit their input: the sizes of a ``split`` sum to the split dim,
those of a ``view`` / ``reshape`` hold the input's elements. Registered in
:mod:`casedb.cases.input_rules`.

A size may come as an integer tensor the model computed (Mistral3's tokens per image:
``image_features.split(tokens_per_image)``, ``image_tokens.view(h, w, d)`` with ``h``, ``w``
0-dim tensors of the image sizes). Random values cannot fit, so the rule writes the values the
scanner saw as ``init: data``; :func:`misfits` says why a case's sizes cannot fit (the scanner
drops such a call, ``casedb check`` lists such a case).
"""

from __future__ import annotations

import math

from casedb.cases.input_rules import RECORD, VALUES, Call, is_integer, reads_values, rule

SPLIT_OPS = ("torch.Tensor.split", "torch.split", "torch.Tensor.split_with_sizes", "torch.split_with_sizes",
             "torch.ops.aten.split", "torch.ops.aten.split_with_sizes")
VIEW_OPS = ("torch.Tensor.view", "torch.Tensor.reshape", "torch.reshape", "torch.ops.aten.view",
            "torch.ops.aten.reshape", "torch.ops.aten._unsafe_view")
# keyword names of the sizes (torch.split's, aten's, reshape's)
_SIZE_NAMES = ("split_size", "split_size_or_sections", "split_sizes", "size", "shape")


@rule(*SPLIT_OPS, *VIEW_OPS)
@reads_values
def _fitting_sizes(c: Call):
    """Sizes given as integer tensors take the values the scanner saw; under ``RECORD``
    (:func:`casedb.cases.valid_inputs.problems`) the reasons they cannot fit are recorded."""
    record = RECORD.get()
    if record is not None:
        record.extend(misfits(c.case))
        return
    for _, spec, _ in _size_items(c) or []:
        values = spec.pop(VALUES, None) if isinstance(spec, dict) else None
        if values is not None and "init" not in spec:
            spec["init"] = "data"
            spec["data"] = values if isinstance(values, list) else [values]


def _is_one_of(op: str, names: tuple) -> bool:
    """`op` is one of `names` or an overload of one (torch.ops.aten.split.Tensor)."""
    return any(op == name or op.startswith(name + ".") for name in names)


def _size_items(c: Call) -> list[tuple[str, dict | int, bool]] | None:
    """(label, tensor spec or int, given in a list) of each size: the positional arguments after
    the input (split's first one only: then comes its dim) and the keyword ones; None when one
    of them is no size (``view(dtype)``, a ``py`` literal)."""
    last = 2 if _is_one_of(c.op, SPLIT_OPS) else len(c.inputs)
    items = [(f"inputs[{i}]", item) for i, item in enumerate(c.inputs[1:last], start=1)]
    items += [(f"attrs.{name}", c.attrs[name]) for name in _SIZE_NAMES if name in c.attrs]
    out = []
    for label, item in items:
        if isinstance(item, dict) and "tensor" in item:
            out.append((label, item["tensor"], False))
        elif isinstance(item, dict) and "tensor_list" in item:
            out += [(f"{label}[{j}]", spec, True) for j, spec in enumerate(item["tensor_list"])]
        else:
            value = item.get("value") if isinstance(item, dict) else item
            values = value if isinstance(value, list) else [value]
            if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                return None
            out += [(label, v, isinstance(value, list)) for v in values]
    return out


def misfits(case: dict) -> list[str]:
    """Why the sizes of a split / view / reshape case cannot fit its input (pure): [] when they
    fit, or when they are not all sizes or not all readable (values in a blob)."""
    c = Call(case)
    if not _is_one_of(c.op, SPLIT_OPS + VIEW_OPS):
        return []
    source = c.tensor(0, "self") or c.tensor(0, "input")
    sizes = _size_items(c)
    if source is None or not isinstance(source.get("shape"), list) or not sizes:
        return []
    values, random = [], []
    for label, size, _ in sizes:
        value = size if isinstance(size, int) else _known(size)
        if value is _UNREADABLE:
            return []
        if value is None:
            random.append(label)
        values.append(value)
    if random:
        return [f"{', '.join(random)} of {c.op} {'is a size' if len(random) == 1 else 'are sizes'} with random values, "
                f"which cannot fit inputs[0] {source['shape']}: give the model's values (init: data)"]
    if _is_one_of(c.op, SPLIT_OPS):
        return _split_misfit(c, source["shape"], values, listed=any(listed for _, _, listed in sizes))
    return _view_misfit(c.op, source["shape"], values)


_UNREADABLE = object()  # a size tensor whose values are given but not here (a blob)


def _known(spec: dict):
    """The value of a one-element integer tensor spec, None when it is drawn at random,
    _UNREADABLE when it is given elsewhere or is no integer scalar."""
    if not is_integer(spec) or math.prod(spec.get("shape") or []) != 1:
        return _UNREADABLE
    init, args = spec.get("init"), spec.get("init_args") or {}
    if VALUES in spec or init == "data":
        data = spec.get(VALUES, spec.get("data"))
        while isinstance(data, list) and len(data) == 1:
            data = data[0]
        return data if isinstance(data, int) else _UNREADABLE
    if init in ("zeros", "ones"):
        return int(init == "ones")
    if init in ("arange", "full"):
        value = args.get("start", 0) if init == "arange" else args.get("fill_value")
        return value if isinstance(value, int) else _UNREADABLE
    if init in (None, "randint") and int(args.get("high", 10)) - int(args.get("low", 0)) == 1:
        return int(args.get("low", 0))
    return None


def _split_misfit(c: Call, shape: list, sizes: list[int], listed: bool) -> list[str]:
    dim = c.value(2, "dim", 0)
    if not isinstance(dim, int) or not -max(len(shape), 1) <= dim < max(len(shape), 1):
        return []
    size = shape[dim] if shape else 1
    if not listed and len(sizes) == 1:  # one chunk size: any positive size fits
        return [] if sizes[0] > 0 or size == 0 else [f"{c.op} into chunks of {sizes[0]}: a chunk size must be positive"]
    if sum(sizes) == size and min(sizes) >= 0:
        return []
    return [f"the split sizes {sizes} of {c.op} sum to {sum(sizes)}, not to dim {dim} (size {size}) of inputs[0] "
            f"{shape}"]


def _view_misfit(op: str, shape: list, sizes: list[int]) -> list[str]:
    numel = math.prod(shape)
    known = math.prod(s for s in sizes if s != -1)
    inferred = sizes.count(-1)
    if inferred == 0 and known == numel and min(sizes) >= 0:
        return []
    if inferred == 1 and min(sizes) >= -1 and known > 0 and numel % known == 0:
        return []
    return [f"the {op} sizes {sizes} cannot hold the {numel} elements of inputs[0] {shape}"]
