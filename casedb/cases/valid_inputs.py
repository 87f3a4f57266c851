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
An ATen rule registered without an overload (``torch.ops.aten.gather``) covers every overload;
``torch.x_`` and ``operator.x`` spellings find the ``torch.Tensor.x_`` / ``torch.x`` rule.

The same rules check a stored case: :func:`problems` lists the index inputs whose values can
fall outside the range a rule would give them (e.g. ``randint`` up to 1000 into a dim of 32),
without changing anything — the case's own fault, not the backend's. It hears the valid range
through ``_randint``/``_index_into``; a rule that picks index values itself (``_index_copy``)
calls ``_index_into`` instead while ``_RECORD`` is set.
"""

from __future__ import annotations

import copy
import math
from contextvars import ContextVar
from typing import Callable

from casedb.cases import dtypes

VALUES = "_values"
RULES: dict[str, Callable] = {}
# Set by problems(): the rules' index constraints are collected here instead of applied.
_RECORD: ContextVar[list | None] = ContextVar("casedb_valid_inputs_record", default=None)


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


def wants_values(op: str) -> bool:
    """Whether the rule for `op` uses captured values."""
    return getattr(rule_for(op), "reads_values", False)


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


# ---------------------------------------------------------------------------------- checking

def problems(case: dict) -> list[str]:
    """Why a case's index inputs are invalid for its op: one message per input (pure).

    ``case`` is normalized (``op``, ``inputs``, ``attrs``, as stored). An integer input that a
    rule constrains is a problem when the values its init can produce leave the valid range:
    [0, size) of the indexed dim — [-size, size) for ops that accept negative indices
    (indexing, ``take_along_dim``, ``index_fill``). Values given as data or a file are the
    model's own and are not checked.
    """
    fn = rule_for(case["op"])
    if fn is None:
        return []
    work = copy.deepcopy({"op": case["op"], "inputs": case.get("inputs") or [], "attrs": case.get("attrs") or {}})
    record: list = []
    token = _RECORD.set(record)
    try:
        fn(Call(work))
    except (KeyError, IndexError, TypeError, ValueError):  # a call the rule cannot read: nothing to say
        return []
    finally:
        _RECORD.reset(token)
    negative_ok = fn in (_getitem, _aten_index, _take_along_dim) or "index_fill" in case["op"]
    out = []
    for spec, low, high, indexed in record:
        try:
            if spec is None or not _is_integer(spec):
                continue
        except dtypes.UnknownDtype:
            continue
        values = _value_range(spec)
        if values is None:
            continue
        lo, hi = values
        valid_lo = -high if negative_ok and low == 0 else low
        if valid_lo <= lo and hi < high:
            continue
        what = f"{_path(work, spec)} ({_describe_init(spec)})"
        if indexed is not None:
            target, dim = indexed
            where = f"it indexes dim {dim} (size {high}) of {_path(work, target)}"
        else:
            where = f"for {case['op']}"
        out.append(f"{what} must lie in [{valid_lo}, {high}): {where}; "
                   f"give it init_args {{low: {max(low, 0)}, high: {high}}}")
    return out


def _path(case: dict, spec) -> str:
    for i, item in enumerate(case["inputs"]):
        if isinstance(item, dict):
            if item.get("tensor") is spec:
                return f"inputs[{i}]"
            for j, t in enumerate(item.get("tensor_list") or []):
                if t is spec:
                    return f"inputs[{i}][{j}]"
    for k, item in case["attrs"].items():
        if isinstance(item, dict) and item.get("tensor") is spec:
            return f"attrs.{k}"
    return "an input"


def _value_range(spec: dict) -> tuple[int, int] | None:
    """(smallest, largest) value an integer tensor spec can hold; None when the values are given."""
    if math.prod(spec.get("shape") or []) == 0 and spec.get("shape"):
        return None
    init = spec.get("init") or "randint"
    args = spec.get("init_args") or {}
    if init == "randint":
        low = args.get("low", 0)
        return int(low), int(args.get("high", 10)) - 1
    if init in ("rand", "randn"):
        return 0, 9  # integer tensors draw randint [0, 10) (casedb.cases.materialize)
    if init == "uniform":
        low = math.floor(args.get("low", 0.0))
        return low, max(math.ceil(args.get("high", 1.0)), low + 1) - 1
    if init in ("zeros", "ones"):
        return (0, 0) if init == "zeros" else (1, 1)
    if init == "arange":
        start, step = args.get("start", 0), args.get("step", 1)
        last = start + step * (math.prod(spec.get("shape") or []) - 1)
        return math.floor(min(start, last)), math.ceil(max(start, last))
    return None  # data, file: the model's own values


def _describe_init(spec: dict) -> str:
    init = spec.get("init") or "randint"
    args = spec.get("init_args") or {}
    if init == "randint":
        return f"{spec['dtype']} randint in [{args.get('low', 0)}, {args.get('high', 10)})"
    if init == "arange":
        lo, hi = _value_range(spec)
        return f"{spec['dtype']} arange {lo}..{hi}"
    return f"{spec['dtype']} {init}"


# ----------------------------------------------------------------------------- constraints

def _is_integer(spec: dict | None) -> bool:
    # a spec without a dtype takes the case's (floating) default
    return spec is not None and "dtype" in spec and dtypes.canonical(spec["dtype"]) in dtypes.INTEGER


def _randint(spec: dict | None, low: int, high: int) -> None:
    """Integer values in [low, high), unless the spec already chose its values."""
    record = _RECORD.get()
    if record is not None:
        record.append((spec, int(low), max(int(high), int(low) + 1), None))
        return
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
        record = _RECORD.get()
        if record is not None:
            record.append((index, 0, size, (target, dim)))
            return
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
      "torch.index_fill", "torch.Tensor.index_fill", "torch.Tensor.index_fill_", "torch.ops.aten.index_fill",
      "torch.ops.aten.index_fill_")
def _dim_index(c: Call):
    # (self, dim, index, ...)
    _index_into(c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self"), c.value(1, "dim"))


@rule("torch.index_copy", "torch.Tensor.index_copy", "torch.Tensor.index_copy_", "torch.ops.aten.index_copy",
      "torch.ops.aten.index_copy_")
@reads_values
def _index_copy(c: Call):
    """(self, dim, index, source): distinct positions along ``dim`` — a static KV cache writes each
    new token once. With a repeated index the result depends on which write lands last, so a
    device could differ from the reference for no fault of its own. The first positions, in order
    (the real cache positions depend on how full the cache is)."""
    index, target = c.tensor(2, "index"), c.tensor(0, "input") or c.tensor(0, "self")
    if _RECORD.get() is not None:  # problems() asks for the valid range, not for this rule's choice
        return _index_into(index, target, c.value(1, "dim"))
    size = _dim_size(target, c.value(1, "dim"))
    if index is None or "init" in index or not _is_integer(index) or not size or len(index["shape"]) > 1:
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
    # x[idx] / x[idx] = v with an integer tensor idx addresses dim 0; x[i0, i1, ...] (a tuple of
    # tensors, e.g. a padding mask read at broadcast batch and position indices) addresses dims 0, 1, ...
    target, item = c.tensor(0), c.item(1)
    mask = c.tensor(1)
    if mask is not None and mask.get("dtype") == "bool":  # a random mask can select all or nothing
        _alternating(mask)
        return
    if isinstance(item, dict) and "tensor_list" in item:
        for dim, spec in enumerate(item["tensor_list"]):
            if spec is not None and spec.get("dtype") != "bool":
                _index_into(spec, target, dim)
        return
    index, size = c.tensor(1), _dim_size(target, 0)
    if (c.op == "torch.setitem" and c.tensor(2) is not None and _is_integer(index) and "init" not in index
            and size and 1 <= _numel(index) <= size and _RECORD.get() is None):
        # a tensor written through repeated indices: which write wins is unspecified, and eager and
        # inductor differ (moe.py's `inv_perm[perm] = arange(n)`, perm a permutation, had 3 % of
        # its elements "wrong" on inductor). Distinct indices, in reverse order.
        index.pop(VALUES, None)
        index["init"] = "arange"
        index["init_args"] = {"start": size - 1, "step": -1}
        return
    _index_into(index, target, 0)


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
@reads_values
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
    # integer division by zero raises (floating division gives inf): divisors in [1, 10); a
    # dividend below a literal divisor makes every quotient 0: dividends reach 10 quotients
    _nonzero_int(c.tensor(1, "other"))
    divisor = c.value(1, "other")
    if isinstance(divisor, int) and not isinstance(divisor, bool) and abs(divisor) > 1:
        _informative(c.tensor(0), "randint", {"low": 0, "high": 10 * abs(divisor)})


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


# ------------------------------------------------------------------------ informative values
# A case whose reference output is all zeros or one value cannot catch a bug: a target returning
# that passes (execute.Execution.vacuous). Random values make some calls so: a comparison with a
# literal the random values never reach, a mask ANDed with a random 0-d False, a floor division
# by 10 of values below 10. These rules choose values that make the output depend on the inputs;
# they do not constrain validity, so problems() ignores them.

_MASK_DATA_LIMIT = 4096  # masks up to this many elements get written-out values


def _informative(spec: dict | None, init: str, init_args: dict | None = None, data: list | None = None) -> None:
    if _RECORD.get() is not None or spec is None or "init" in spec:
        return
    spec.pop(VALUES, None)
    spec["init"] = init
    if init_args:
        spec["init_args"] = init_args
    if data is not None:
        spec["data"] = data


def _numel(spec: dict) -> int:
    return math.prod(spec["shape"])


def _alternating(mask: dict) -> None:
    """True, False, True ...: a mask that selects some and leaves some."""
    n = _numel(mask)
    if 2 <= n <= _MASK_DATA_LIMIT:
        _informative(mask, "data", data=[i % 2 == 0 for i in range(n)])


def _operands(c: Call) -> tuple:
    return c.tensor(0, "input") or c.tensor(0, "self"), c.tensor(1, "other")


@rule("torch.Tensor.__eq__", "torch.Tensor.eq", "torch.eq", "torch.Tensor.__ne__", "torch.Tensor.ne", "torch.ne")
def _equality(c: Call):
    a, b = _operands(c)
    literal = c.value(1, "other")
    if not _is_integer(a):
        return
    if isinstance(literal, int) and not isinstance(literal, bool):
        # values around the literal: about a third are equal to it (a token id, a pad value ...)
        if _numel(a) <= 1:
            _informative(a, "randint", {"low": literal, "high": literal + 1})
        else:
            _informative(a, "randint", {"low": literal - 1, "high": literal + 2})
    elif _is_integer(b) and min(_numel(a), _numel(b)) <= 1:
        _informative(a, "randint", {"low": 0, "high": 3})
        _informative(b, "randint", {"low": 0, "high": 3})


@rule("torch.Tensor.gt", "torch.gt", "torch.Tensor.__gt__", "torch.Tensor.greater", "torch.greater",
      "torch.Tensor.ge", "torch.ge", "torch.Tensor.__ge__", "torch.Tensor.greater_equal", "torch.greater_equal",
      "torch.Tensor.lt", "torch.lt", "torch.Tensor.__lt__", "torch.Tensor.less", "torch.less",
      "torch.Tensor.le", "torch.le", "torch.Tensor.__le__", "torch.Tensor.less_equal", "torch.less_equal")
def _ordering(c: Call):
    # a broadcast scalar against a tensor of positions: the scalar in the middle of their range
    a, b = _operands(c)
    if not (_is_integer(a) and _is_integer(b)) or min(_numel(a), _numel(b)) > 1 or _numel(a) == _numel(b):
        return
    scalar = a if _numel(a) <= 1 else b
    _informative(scalar, "randint", {"low": 5, "high": 6})  # the default randint values are 0..9


@rule("torch.Tensor.__and__", "torch.Tensor.__rand__", "torch.logical_and", "torch.Tensor.logical_and",
      "torch.bitwise_and", "torch.Tensor.bitwise_and")
def _conjunction(c: Call):
    # a mask ANDed with a single random bool is all False half the time: the single one True
    for spec in _operands(c):
        if spec is not None and spec.get("dtype") == "bool" and _numel(spec) <= 1:
            _informative(spec, "ones")


@rule("torch.Tensor.__or__", "torch.Tensor.__ror__", "torch.logical_or", "torch.Tensor.logical_or",
      "torch.bitwise_or", "torch.Tensor.bitwise_or")
def _disjunction(c: Call):
    for spec in _operands(c):
        if spec is not None and spec.get("dtype") == "bool" and _numel(spec) <= 1:
            _informative(spec, "zeros")


@rule("torch.all", "torch.Tensor.all")
def _all(c: Call):
    # all() of random bools is False: an all-True mask (a batch without padding), so the call
    # answers True, unless it reduces a dim (then rows alternate)
    x = c.tensor(0, "input") or c.tensor(0, "self")
    if x is None or x.get("dtype") != "bool":
        return
    if c.value(1, "dim") is None:
        _informative(x, "ones")
    elif x["shape"] and c.value(1, "dim") in (-1, len(x["shape"]) - 1) and _numel(x) <= _MASK_DATA_LIMIT:
        width = x["shape"][-1]
        _informative(x, "data", data=[not (i // width % 2 and i % width == width - 1) for i in range(_numel(x))])


@rule("torch.nn.functional.multi_head_attention_forward")
def _attention_projections(c: Call):
    # Projection weights at their initialised scale (std 1/sqrt(embed_dim)). At std 1 the
    # attention logits reach thousands, the softmax is one-hot, and which key wins flips with
    # one rounding: the bf16 CPU reference itself was 4096 ULPs off float32 (inductor 764 abs
    # err "wrong" against it) — a case that cannot tell a right backend from a wrong one.
    embed = c.value(3, "embed_dim_to_check")
    if not isinstance(embed, int) or embed <= 0:
        return
    for pos, name in ((5, "in_proj_weight"), (11, "out_proj_weight"), (None, "q_proj_weight"),
                      (None, "k_proj_weight"), (None, "v_proj_weight")):
        w = c.tensor(pos, name)
        if w is not None and not _is_integer(w):
            _informative(w, "randn", {"std": 1 / math.sqrt(embed)})


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
