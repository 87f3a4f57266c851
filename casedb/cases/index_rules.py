"""Input rules that keep a call's index, offset, mask and divisor inputs valid for its op: an
embedding's indices within its table, gather's within the gathered dim, grouped_mm's offsets
non-decreasing, an integer divisor non-zero. Registered in :mod:`casedb.cases.input_rules`.
"""

from __future__ import annotations

import math

from casedb.cases.input_rules import (
    RECORD,
    VALUES,
    Call,
    alternating,
    dim_size,
    index_into,
    informative,
    is_integer,
    negative_indices,
    generated,
    nonzero_int,
    numel,
    randint,
    reads_values,
    rule,
)


@rule("torch.nn.functional.embedding", "torch.embedding")
def _embedding(c: Call):
    # F.embedding(input, weight, padding_idx, ...)
    weight = c.tensor(1, "weight")
    if weight is not None:
        randint(c.tensor(0, "input"), 0, weight["shape"][0])


@rule("torch.ops.aten.embedding")
def _aten_embedding(c: Call):
    # aten.embedding(weight, indices, padding_idx, ...)
    weight = c.tensor(0, "weight")
    if weight is not None:
        randint(c.tensor(1, "indices"), 0, weight["shape"][0])


@rule("torch.index_select", "torch.Tensor.index_select", "torch.ops.aten.index_select",
      "torch.index_add", "torch.Tensor.index_add", "torch.Tensor.index_add_", "torch.ops.aten.index_add",
      "torch.ops.aten.index_add_",
      "torch.index_fill", "torch.Tensor.index_fill", "torch.Tensor.index_fill_", "torch.ops.aten.index_fill",
      "torch.ops.aten.index_fill_")
def _dim_index(c: Call):
    # (self, dim, index, ...)
    index_into(c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self"), c.value(1, "dim"))


@rule("torch.index_copy", "torch.Tensor.index_copy", "torch.Tensor.index_copy_", "torch.ops.aten.index_copy",
      "torch.ops.aten.index_copy_")
@reads_values
def _index_copy(c: Call):
    """(self, dim, index, source): distinct positions along ``dim`` — a static KV cache writes each
    new token once. With a repeated index the result depends on which write lands last, so a
    device could differ from the reference for no fault of its own. The first positions, in order
    (the real cache positions depend on how full the cache is)."""
    index, target = c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self")
    if RECORD.get() is not None:  # problems() asks for the valid range, not for this rule's choice
        return index_into(index, target, c.value(1, "dim"))
    size = dim_size(target, c.value(1, "dim"))
    if index is None or "init" in index or not is_integer(index) or not size or len(index["shape"]) > 1:
        return
    count = index["shape"][0] if index["shape"] else 1
    if count > size:
        return  # more writes than positions: no distinct choice exists, leave the case as recorded
    values = index.pop(VALUES, None)
    if isinstance(values, list) and len(set(values)) == len(values) and all(0 <= v < size for v in values):
        index["init"] = "data"
        index["data"] = values
    else:
        index["init"] = "arange"


@rule("torch.gather", "torch.Tensor.gather", "torch.ops.aten.gather",
      "torch.scatter", "torch.Tensor.scatter", "torch.Tensor.scatter_", "torch.ops.aten.scatter",
      "torch.ops.aten.scatter_",
      "torch.scatter_add", "torch.Tensor.scatter_add", "torch.Tensor.scatter_add_", "torch.ops.aten.scatter_add",
      "torch.ops.aten.scatter_add_",
      "torch.scatter_reduce", "torch.Tensor.scatter_reduce", "torch.Tensor.scatter_reduce_",
      "torch.ops.aten.scatter_reduce", "torch.ops.aten.scatter_reduce_")
def _gather_scatter(c: Call):
    # (self, dim, index, ...): every index value addresses `dim` of self
    index_into(c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self"), c.value(1, "dim"))


@rule("torch.take_along_dim", "torch.Tensor.take_along_dim")
@negative_indices
def _take_along_dim(c: Call):
    # (input, indices, dim=None): without dim the input is flattened
    target = c.tensor(0, "input")
    dim = c.value(2, "dim")
    if target is not None and dim is None:
        randint(c.tensor(1, "indices"), 0, max(1, math.prod(target["shape"])))
    else:
        index_into(c.tensor(1, "indices"), target, dim)


@rule("torch.getitem", "torch.setitem")
@negative_indices
def _getitem(c: Call):
    # x[idx] / x[idx] = v with an integer tensor idx addresses dim 0; x[i0, i1, ...] (a tuple of
    # tensors, e.g. a padding mask read at broadcast batch and position indices) addresses dims 0, 1, ...
    target, item = c.tensor(0), c.item(1)
    mask = c.tensor(1)
    if mask is not None and mask.get("dtype") == "bool":  # a random mask can select all or nothing
        alternating(mask)
        return
    if isinstance(item, dict) and "tensor_list" in item:
        for dim, spec in enumerate(item["tensor_list"]):
            if spec is not None and spec.get("dtype") != "bool":
                index_into(spec, target, dim)
        return
    index, size = c.tensor(1), dim_size(target, 0)
    if (c.op == "torch.setitem" and c.tensor(2) is not None and is_integer(index) and "init" not in index
            and size and 1 <= numel(index) <= size and RECORD.get() is None):
        # a tensor written through repeated indices: which write wins is unspecified, and eager and
        # inductor differ (moe.py's `inv_perm[perm] = arange(n)`, perm a permutation, had 3 % of
        # its elements "wrong" on inductor). Distinct indices, in reverse order.
        index.pop(VALUES, None)
        index["init"] = "arange"
        index["init_args"] = {"start": size - 1, "step": -1}
        return
    index_into(index, target, 0)


@rule("torch.ops.aten.index", "torch.ops.aten._unsafe_index", "torch.ops.aten.index_put",
      "torch.ops.aten.index_put_", "torch.ops.aten._index_put_impl_", "torch.ops.aten._unsafe_index_put")
@negative_indices
def _aten_index(c: Call):
    # (self, indices: list of tensors, one per leading dim, ...)
    target = c.tensor(0, "self")
    item = c.item(1, "indices")
    if target is None or not isinstance(item, dict):
        return
    for dim, spec in enumerate(item.get("tensor_list", [])):
        index_into(spec, target, dim)


@rule("torch.nn.functional.one_hot", "torch.ops.aten.one_hot")
def _one_hot(c: Call):
    classes = c.value(1, "num_classes", -1)
    if isinstance(classes, int) and classes > 0:
        randint(c.tensor(0, "input") or c.tensor(0, "self"), 0, classes)


@rule("torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss")
def _class_targets(c: Call):
    # (input [N, C, ...] or [C], target, ...): class indices in [0, C)
    logits = c.tensor(0, "input")
    if logits is not None and logits["shape"]:
        classes = logits["shape"][1] if len(logits["shape"]) > 1 else logits["shape"][0]
        randint(c.tensor(1, "target"), 0, classes)


@rule("torch._grouped_mm", "torch.nn.functional.grouped_mm", "torch.ops.aten._grouped_mm")
def _grouped_mm(c: Call):
    """``offs`` are the cumulative group ends: non-decreasing, the last within the grouped dim.

    Rows are split as evenly as possible between the groups (the real split depends on routing).
    """
    a, b = c.tensor(0, "mat_a") or c.tensor(0, "self"), c.tensor(1, "mat_b") or c.tensor(1, "mat2")
    offs = c.tensor(2, "offs")
    if a is None or b is None or offs is None or len(offs["shape"]) != 1:
        return
    record = RECORD.get()
    if "init" in offs and not (record is not None and generated(offs)):
        return
    groups = offs["shape"][0]
    if len(a["shape"]) == 2 and len(b["shape"]) == 3:
        total = a["shape"][0]       # rows of mat_a, grouped by expert
    elif len(a["shape"]) == 3 and len(b["shape"]) == 2:
        total = b["shape"][1]       # columns of mat_b
    elif len(a["shape"]) == 2 and len(b["shape"]) == 2:
        total = a["shape"][1]       # the shared K dimension
    else:
        return
    data = [((g + 1) * total) // groups for g in range(groups)]
    if record is not None:  # drawn offsets are not cumulative group ends (rows left unwritten)
        record.append(f"offs ({offs.get('dtype')} {offs.get('init') or 'randint'}) must be non-decreasing "
                      f"group ends within {total} for {c.op}; give it init: data, data: {data}")
        return
    offs.pop(VALUES, None)
    offs["init"] = "data"
    offs["data"] = data


@rule("torch.Tensor.masked_scatter", "torch.Tensor.masked_scatter_", "torch.masked_scatter",
      "torch.ops.aten.masked_scatter", "torch.ops.aten.masked_scatter_")
@reads_values
def _masked_scatter(c: Call):
    """The mask may select at most as many elements as ``source`` has: the real mask when the
    scanner saw it, else all False when a random mask could select too many."""
    target, mask, source = c.tensor(0, "self") or c.tensor(0, "input"), c.tensor(1, "mask"), c.tensor(2, "source")
    if target is None or mask is None or source is None:
        return
    selectable = math.prod(_broadcast(target["shape"], mask["shape"]))
    if selectable <= math.prod(source["shape"]):
        return  # any mask is valid
    record = RECORD.get()
    if record is not None:
        if generated(mask) and mask.get("init") != "zeros":
            record.append(f"mask ({mask.get('init') or 'rand'}) may select up to {selectable} elements, but source "
                          f"has {math.prod(source['shape'])} for {c.op}; give it init: zeros or its real values")
        return
    if "init" in mask:
        return
    values = mask.pop(VALUES, None)
    if values is not None and "preset" not in mask:
        mask["init"] = "data"
        mask["data"] = _flat(values)
    else:
        mask["init"] = "zeros"


def _flat(values) -> list:
    """Nested lists flattened (a data tensor's shape is given by its spec)."""
    if not isinstance(values, list):
        return [values]
    return [x for v in values for x in _flat(v)]


def _broadcast(a: list, b: list) -> list:
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    return [max(x, y) for x, y in zip(a, b)]


@rule("torch.Tensor.__floordiv__", "torch.Tensor.__mod__", "torch.floor_divide", "torch.Tensor.floor_divide",
      "torch.remainder", "torch.Tensor.remainder", "torch.fmod", "torch.Tensor.fmod",
      "torch.ops.aten.floor_divide", "torch.ops.aten.remainder", "torch.ops.aten.fmod")
def _integer_divisor(c: Call):
    # integer division by zero raises (floating division gives inf): divisors in [1, 10); a
    # dividend below a literal divisor makes every quotient 0: dividends reach 10 quotients
    nonzero_int(c.tensor(1, "other"))
    divisor = c.value(1, "other")
    if isinstance(divisor, int) and not isinstance(divisor, bool) and abs(divisor) > 1:
        informative(c.tensor(0), "randint", {"low": 0, "high": 10 * abs(divisor)})


@rule("torch.Tensor.__rfloordiv__", "torch.Tensor.__rmod__")
def _reflected_integer_divisor(c: Call):
    nonzero_int(c.tensor(0))


@rule("torch.div", "torch.Tensor.div", "torch.Tensor.div_", "torch.ops.aten.div")
def _div(c: Call):
    if c.value(None, "rounding_mode") is not None:
        nonzero_int(c.tensor(1, "other"))
