"""Valid inputs for value-sensitive operators: one op-aware registry of input constraints.

A case recorded from shapes alone says nothing about values, and the default random data
(``randint`` in [0, 10) for integer tensors, 50 % True for bool) makes an index, an offset or a
mask invalid for the op, so the op raises for the wrong reason. Each rule here looks at one
call's inputs (RFC input items) and sets ``init``/``init_args`` — or ``init: data`` with
``data`` — on the value-sensitive ones, so the CPU eager reference accepts them.

Rules never override a tensor that already declares ``init``. A tensor spec may carry the real
values the scanner saw under the private key ``_values`` (only small CPU control tensors);
a rule may turn them into ``init: data``. :func:`strip_values` removes the key afterwards.

The rules live in :mod:`casedb.cases.index_rules` (valid indexes, offsets, divisors),
:mod:`casedb.cases.value_rules` (informative values, reference limits) and
:mod:`casedb.cases.size_rules` (split / view / reshape sizes that fit their input); the registry and the
constraints they set in :mod:`casedb.cases.input_rules`. To add a rule: write ``f(call)`` and
register it with ``@rule("torch.x", "torch.ops.aten.x")``.
An ATen rule registered without an overload (``torch.ops.aten.gather``) covers every overload;
``torch.x_`` and ``operator.x`` spellings find the ``torch.Tensor.x_`` / ``torch.x`` rule.

The same rules check a stored case: :func:`problems` lists the index inputs whose values can
fall outside the range a rule would give them (e.g. ``randint`` up to 1000 into a dim of 32),
or sizes that cannot fit their input (a split whose sizes do not sum to the split dim), without
changing anything — the case's own fault, not the backend's. It hears the valid range
through ``randint``/``index_into``; a rule that picks index values itself (``_index_copy``)
calls ``index_into`` instead while ``RECORD`` is set; a rule that judges a whole call records its
message (a string) there.
"""

from __future__ import annotations

import copy
import math

from casedb import names
from casedb.cases import dtypes
from casedb.cases import index_rules, size_rules, value_rules  # noqa: F401 (imported for their @rule registrations)
from casedb.cases.input_rules import RECORD, VALUES, Call, is_integer, rule_for


def wants_values(op: str) -> bool:
    """Whether the rule for `op` uses captured values."""
    return getattr(rule_for(op), "reads_values", False)


def apply(case: dict) -> dict:
    """A copy of `case` whose value-sensitive inputs are constrained to valid values."""
    fn = rule_for(case["op"])
    if fn is None:
        return case
    case = copy.deepcopy(case)
    fn(Call(case))
    return case


def apply_raw(case):
    """:func:`apply` to a case record as a file gave it (any op spelling, possibly malformed):
    unchanged when no rule applies or the rule cannot read it (normalizing reports what is wrong)."""
    if not isinstance(case, dict) or not isinstance(case.get("op"), str):
        return case
    try:
        op = names.op_path(case["op"])
        if rule_for(op) is None:
            return case
        work = copy.deepcopy({**case, "op": op})
        for spec in _specs(work):
            _chosen(spec)
        fn = rule_for(op)
        fn(Call(work))
        return {**case, "inputs": work.get("inputs"), **({"attrs": work["attrs"]} if "attrs" in case else {})}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return case


def _specs(case: dict):
    for item in list(case.get("inputs") or []) + list((case.get("attrs") or {}).values()):
        if isinstance(item, dict):
            for spec in [item.get("tensor")] + list(item.get("tensor_list") or []):
                if isinstance(spec, dict):
                    yield spec


def _chosen(spec: dict) -> None:
    """A spec that gives its init's arguments or data without naming the init (an exported default
    ``randint`` with its bounds) has chosen its values: name the init so no rule replaces them."""
    if "init" in spec or not (spec.get("init_args") or "data" in spec):
        return
    if "data" in spec:
        spec["init"] = "data"
        return
    try:  # the default init normalizing gives (casedb.cases.input_specs)
        kind = dtypes.canonical(spec["dtype"]) if "dtype" in spec else "float32"
    except dtypes.UnknownDtype:
        return
    spec["init"] = "randint" if kind in dtypes.INTEGER else "rand" if kind == "bool" else "randn"


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
    token = RECORD.set(record)
    try:
        fn(Call(work))
    except (KeyError, IndexError, TypeError, ValueError):  # a call the rule cannot read: nothing to say
        return []
    finally:
        RECORD.reset(token)
    negative_ok = getattr(fn, "negative_indices", False) or "index_fill" in case["op"]
    out = [entry for entry in record if isinstance(entry, str)]  # whole-call messages (size_rules)
    out += _zero_divisors(work, [entry[0] for entry in record if len(entry) == 2])
    for spec, low, high, indexed in (entry for entry in record if len(entry) == 4):
        try:
            if spec is None or not is_integer(spec):
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


def _zero_divisors(case: dict, specs: list) -> list[str]:
    """Integer divisors whose drawn values can be 0 (integer division by zero raises)."""
    out = []
    for spec in specs:
        values = _value_range(spec)
        if values is not None and values[0] <= 0 <= values[1]:
            out.append(f"{_path(case, spec)} ({_describe_init(spec)}) is an integer divisor of {case['op']} "
                       f"and can be 0; give it init_args {{low: 1, high: 10}}")
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
