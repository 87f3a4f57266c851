"""Valid inputs for value-sensitive operators: one op-aware registry of input constraints.

A case recorded from shapes alone says nothing about values, and the default random data
(``randint`` in [0, 10) for integer tensors, 50 % True for bool) makes an index, an offset or a
mask invalid for the op, so the op raises for the wrong reason. Each rule here looks at one
call's inputs (RFC input items) and sets ``init``/``init_args`` — or ``init: data`` with
``data`` — on the value-sensitive ones, so the CPU eager reference accepts them.

Rules never override a tensor that already declares ``init``. A tensor spec may carry the real
values the scanner saw under the private key ``_values`` (only small CPU control tensors);
a rule may turn them into ``init: data``. :func:`strip_values` removes the key afterwards.

To add a rule: write ``f(call)`` and register it with ``@rule("torch.x", "torch.ops.aten.x")``.
An ATen rule registered without an overload (``torch.ops.aten.gather``) covers every overload.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

from casedb import dtypes

VALUES = "_values"
RULES: dict[str, Callable] = {}


def rule(*ops: str):
    def register(fn):
        for op in ops:
            RULES[op] = fn
        return fn

    return register


class Call:
    """Positional/keyword access to one case's inputs (both as RFC input items)."""

    def __init__(self, case: dict):
        self.case = case
        self.op = case["op"]
        self.inputs = case.get("inputs") or []
        self.attrs = case.get("attrs") or {}

    def item(self, pos: int | None, name: str | None = None):
        if pos is not None and pos < len(self.inputs):
            return self.inputs[pos]
        if name is not None and name in self.attrs:
            v = self.attrs[name]
            return v if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("tensor", "tensor_list", "value", "py") \
                else {"value": v}
        return None

    def tensor(self, pos: int | None, name: str | None = None) -> dict | None:
        item = self.item(pos, name)
        return item.get("tensor") if isinstance(item, dict) else None

    def value(self, pos: int | None, name: str | None = None, default=None):
        item = self.item(pos, name)
        if isinstance(item, dict) and "value" in item:
            return item["value"]
        return default


def rule_for(op: str) -> Callable | None:
    if op in RULES:
        return RULES[op]
    if op.startswith("torch.ops."):  # torch.ops.aten.gather.default -> torch.ops.aten.gather
        return RULES.get(op.rsplit(".", 1)[0])
    return None


def apply(case: dict) -> dict:
    """A copy of `case` whose value-sensitive inputs are constrained to valid values."""
    fn = rule_for(case["op"])
    if fn is None:
        return case
    case = copy.deepcopy(case)
    fn(Call(case))
    return case


def strip_values(case: dict) -> dict:
    """Remove the scanner's private captured values from every tensor spec (in place)."""
    for item in list(case.get("inputs") or []) + list((case.get("attrs") or {}).values()):
        if not isinstance(item, dict):
            continue
        specs = [item["tensor"]] if "tensor" in item else item.get("tensor_list", [])
        for spec in specs:
            spec.pop(VALUES, None)
    return case


# ----------------------------------------------------------------------------- constraints

def _is_integer(spec: dict | None) -> bool:
    # a spec without a dtype takes the case's (floating) default
    return spec is not None and "dtype" in spec and dtypes.canonical(spec["dtype"]) in dtypes.INTEGER


def _randint(spec: dict | None, low: int, high: int) -> None:
    """Integer values in [low, high), unless the spec already chose its values."""
    if spec is None or "init" in spec or not _is_integer(spec):
        return
    spec.pop(VALUES, None)
    spec["init"] = "randint"
    spec["init_args"] = {"low": int(low), "high": max(int(high), int(low) + 1)}


def _dim_size(spec: dict | None, dim) -> int | None:
    if spec is None or not isinstance(dim, int):
        return None
    shape = spec["shape"]
    if not shape:
        return 1
    if not -len(shape) <= dim < len(shape):
        return None
    return shape[dim]


def _index_into(index: dict | None, target: dict | None, dim) -> None:
    """Index values valid along `dim` of `target` (negative indices are valid too; we stay >= 0)."""
    size = _dim_size(target, dim)
    if size:
        _randint(index, 0, size)


@rule("torch.nn.functional.embedding", "torch.embedding")
def _embedding(c: Call):
    # F.embedding(input, weight, padding_idx, ...)
    weight = c.tensor(1, "weight")
    if weight is not None:
        _randint(c.tensor(0, "input"), 0, weight["shape"][0])


@rule("torch.ops.aten.embedding")
def _aten_embedding(c: Call):
    # aten.embedding(weight, indices, padding_idx, ...)
    weight = c.tensor(0, "weight")
    if weight is not None:
        _randint(c.tensor(1, "indices"), 0, weight["shape"][0])


@rule("torch.index_select", "torch.Tensor.index_select", "torch.ops.aten.index_select",
      "torch.index_add", "torch.Tensor.index_add", "torch.Tensor.index_add_", "torch.ops.aten.index_add",
      "torch.ops.aten.index_add_",
      "torch.index_copy", "torch.Tensor.index_copy", "torch.Tensor.index_copy_", "torch.ops.aten.index_copy",
      "torch.ops.aten.index_copy_",
      "torch.index_fill", "torch.Tensor.index_fill", "torch.Tensor.index_fill_", "torch.ops.aten.index_fill",
      "torch.ops.aten.index_fill_")
def _dim_index(c: Call):
    # (self, dim, index, ...)
    _index_into(c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self"), c.value(1, "dim"))


@rule("torch.gather", "torch.Tensor.gather", "torch.ops.aten.gather",
      "torch.scatter", "torch.Tensor.scatter", "torch.Tensor.scatter_", "torch.ops.aten.scatter",
      "torch.ops.aten.scatter_",
      "torch.scatter_add", "torch.Tensor.scatter_add", "torch.Tensor.scatter_add_", "torch.ops.aten.scatter_add",
      "torch.ops.aten.scatter_add_",
      "torch.scatter_reduce", "torch.Tensor.scatter_reduce", "torch.Tensor.scatter_reduce_",
      "torch.ops.aten.scatter_reduce", "torch.ops.aten.scatter_reduce_")
def _gather_scatter(c: Call):
    # (self, dim, index, ...): every index value addresses `dim` of self
    _index_into(c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self"), c.value(1, "dim"))


@rule("torch.take_along_dim", "torch.Tensor.take_along_dim")
def _take_along_dim(c: Call):
    # (input, indices, dim=None): without dim the input is flattened
    target = c.tensor(0, "input")
    dim = c.value(2, "dim")
    if target is not None and dim is None:
        _randint(c.tensor(1, "indices"), 0, max(1, math.prod(target["shape"])))
    else:
        _index_into(c.tensor(1, "indices"), target, dim)


@rule("torch.getitem", "torch.setitem")
def _getitem(c: Call):
    # x[idx] / x[idx] = v with an integer tensor idx addresses dim 0
    _index_into(c.tensor(1), c.tensor(0), 0)


@rule("torch.ops.aten.index", "torch.ops.aten._unsafe_index", "torch.ops.aten.index_put",
      "torch.ops.aten.index_put_", "torch.ops.aten._index_put_impl_", "torch.ops.aten._unsafe_index_put")
def _aten_index(c: Call):
    # (self, indices: list of tensors, one per leading dim, ...)
    target = c.tensor(0, "self")
    item = c.item(1, "indices")
    if target is None or not isinstance(item, dict):
        return
    for dim, spec in enumerate(item.get("tensor_list", [])):
        _index_into(spec, target, dim)


@rule("torch.nn.functional.one_hot", "torch.ops.aten.one_hot")
def _one_hot(c: Call):
    classes = c.value(1, "num_classes", -1)
    if isinstance(classes, int) and classes > 0:
        _randint(c.tensor(0, "input") or c.tensor(0, "self"), 0, classes)


@rule("torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss")
def _class_targets(c: Call):
    # (input [N, C, ...] or [C], target, ...): class indices in [0, C)
    logits = c.tensor(0, "input")
    if logits is not None and logits["shape"]:
        classes = logits["shape"][1] if len(logits["shape"]) > 1 else logits["shape"][0]
        _randint(c.tensor(1, "target"), 0, classes)


@rule("torch._grouped_mm", "torch.nn.functional.grouped_mm", "torch.ops.aten._grouped_mm")
def _grouped_mm(c: Call):
    """``offs`` are the cumulative group ends: non-decreasing, the last within the grouped dim.

    Rows are split as evenly as possible between the groups (the real split depends on routing).
    """
    a, b = c.tensor(0, "mat_a") or c.tensor(0, "self"), c.tensor(1, "mat_b") or c.tensor(1, "mat2")
    offs = c.tensor(2, "offs")
    if a is None or b is None or offs is None or "init" in offs or len(offs["shape"]) != 1:
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
    offs.pop(VALUES, None)
    offs["init"] = "data"
    offs["data"] = [((g + 1) * total) // groups for g in range(groups)]


@rule("torch.Tensor.masked_scatter", "torch.Tensor.masked_scatter_", "torch.masked_scatter",
      "torch.ops.aten.masked_scatter", "torch.ops.aten.masked_scatter_")
def _masked_scatter(c: Call):
    """The mask may select at most as many elements as ``source`` has: the real mask when the
    scanner saw it, else all False when a random mask could select too many."""
    target, mask, source = c.tensor(0, "self") or c.tensor(0, "input"), c.tensor(1, "mask"), c.tensor(2, "source")
    if target is None or mask is None or source is None or "init" in mask:
        return
    if math.prod(_broadcast(target["shape"], mask["shape"])) <= math.prod(source["shape"]):
        return  # any mask is valid
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
    # integer division by zero raises (floating division gives inf): divisors in [1, 10)
    _nonzero_int(c.tensor(1, "other"))


@rule("torch.Tensor.__rfloordiv__", "torch.Tensor.__rmod__")
def _reflected_integer_divisor(c: Call):
    _nonzero_int(c.tensor(0))


@rule("torch.div", "torch.Tensor.div", "torch.Tensor.div_", "torch.ops.aten.div")
def _div(c: Call):
    if c.value(None, "rounding_mode") is not None:
        _nonzero_int(c.tensor(1, "other"))


def _nonzero_int(spec: dict | None) -> None:
    if spec is not None and "init" not in spec and _is_integer(spec):
        spec.pop(VALUES, None)
        spec["init"] = "randint"
        spec["init_args"] = {"low": 1, "high": 10}


# --------------------------------------------------------------------------- reference limits
# Real calls the CPU eager reference has no kernel for: on a non-CPU device the model code takes
# another branch (e.g. transformers' MoE feeds histc int32 counts off the CPU). The case stays —
# the device must run it — and declares that the reference (and a CPU target) raises.


@rule("torch.histc", "torch.Tensor.histc", "torch.ops.aten.histc")
def _histc(c: Call):
    x = c.tensor(0, "input") or c.tensor(0, "self")
    if _is_integer(x) and "expects_error" not in c.case:
        # RuntimeError: eager raises NotImplementedError, a compiled target dynamo's
        # TorchRuntimeError; both are RuntimeErrors and both name the kernel.
        no_kernel = {"type": "RuntimeError", "match": "histogram_cpu"}
        c.case["expects_error"] = {"ref": no_kernel, "cpu": dict(no_kernel)}
