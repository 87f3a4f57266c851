"""The registry of input rules (:mod:`casedb.cases.valid_inputs`): how a rule is registered and
reads a call, and the constraints rules set on a tensor spec (integer ranges, indexes into a
dim, non-zero divisors, informative values).
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Callable

from casedb.cases import dtypes

VALUES = "_values"
RULES: dict[str, Callable] = {}
# Set by valid_inputs.problems(): the rules' index constraints are collected here instead of applied.
RECORD: ContextVar[list | None] = ContextVar("casedb_valid_inputs_record", default=None)


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


def reads_values(fn):
    """Mark a rule that uses the values the scanner captured (``VALUES``): the scanner captures
    values only for the ops of such rules."""
    fn.reads_values = True
    return fn


def negative_indices(fn):
    """Mark a rule whose op also accepts negative indices, in [-size, size) (problems() reads it)."""
    fn.negative_indices = True
    return fn


def rule_for(op: str) -> Callable | None:
    if op in RULES:
        return RULES[op]
    if op.startswith("torch.ops."):  # torch.ops.aten.gather.default -> torch.ops.aten.gather
        return RULES.get(op.rsplit(".", 1)[0])
    parts = op.split(".")
    if len(parts) == 2 and parts[0] in ("operator", "_operator"):  # operator.__getitem__ -> torch.getitem
        return RULES.get("torch." + parts[1].strip("_"))
    if len(parts) == 2 and parts[0] == "torch":  # torch.scatter_ (a Tensor method) -> torch.Tensor.scatter_
        return RULES.get("torch.Tensor." + parts[1])
    return None


def is_integer(spec: dict | None) -> bool:
    # a spec without a dtype takes the case's (floating) default
    return spec is not None and "dtype" in spec and dtypes.canonical(spec["dtype"]) in dtypes.INTEGER


def randint(spec: dict | None, low: int, high: int) -> None:
    """Integer values in [low, high), unless the spec already chose its values."""
    record = RECORD.get()
    if record is not None:
        record.append((spec, int(low), max(int(high), int(low) + 1), None))
        return
    if spec is None or "init" in spec or not is_integer(spec):
        return
    spec.pop(VALUES, None)
    spec["init"] = "randint"
    spec["init_args"] = {"low": int(low), "high": max(int(high), int(low) + 1)}


def dim_size(spec: dict | None, dim) -> int | None:
    if spec is None or not isinstance(dim, int):
        return None
    shape = spec["shape"]
    if not shape:
        return 1
    if not -len(shape) <= dim < len(shape):
        return None
    return shape[dim]


def index_into(index: dict | None, target: dict | None, dim) -> None:
    """Index values valid along `dim` of `target` (negative indices are valid too; we stay >= 0)."""
    size = dim_size(target, dim)
    if size:
        record = RECORD.get()
        if record is not None:
            record.append((index, 0, size, (target, dim)))
            return
        randint(index, 0, size)


GENERATED = ("randint", "rand", "randn", "uniform", "zeros", "ones", "arange")  # inits whose values casedb draws


def generated(spec: dict | None) -> bool:
    """Whether a stored spec's values are drawn by casedb (not the model's own data or file)."""
    return spec is not None and (spec.get("init") or "randint") in GENERATED


def nonzero_int(spec: dict | None) -> None:
    record = RECORD.get()
    if record is not None:
        if spec is not None and is_integer(spec):
            record.append((spec, "nonzero"))
        return
    if spec is not None and "init" not in spec and is_integer(spec):
        spec.pop(VALUES, None)
        spec["init"] = "randint"
        spec["init_args"] = {"low": 1, "high": 10}


MASK_DATA_LIMIT = 4096  # masks up to this many elements get written-out values


def informative(spec: dict | None, init: str, init_args: dict | None = None, data: list | None = None) -> None:
    if RECORD.get() is not None or spec is None or "init" in spec:
        return
    spec.pop(VALUES, None)
    spec["init"] = init
    if init_args:
        spec["init_args"] = init_args
    if data is not None:
        spec["data"] = data


def numel(spec: dict) -> int:
    return math.prod(spec["shape"])


def alternating(mask: dict) -> None:
    """True, False, True ...: a mask that selects some and leaves some."""
    n = numel(mask)
    if 2 <= n <= MASK_DATA_LIMIT:
        informative(mask, "data", data=[i % 2 == 0 for i in range(n)])
