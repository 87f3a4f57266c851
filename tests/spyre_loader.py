"""casedb's own reader of a v2 model-ops config by the rules of the RFC implementation's runner, to
check what casedb exports the way their runner will see it (their code is not used or copied; each
rule below was read from torch-spyre's tests/models/test_model_ops_v2.py, tests/oot_framework/
oot_test_config_models.py, oot_test_parsing.py, oot_test_utilities.py and tests/models/op_registry.py,
upstream as of commit 8abe959d, 2026-08-18):

- collection: the tests of the file whose ``names`` hold ``TestSpyreModelOps::test_model_ops_db``
  (each with its ``mode``, as their test base's ``_should_run`` reads it: ``skip`` is not run,
  ``xfail`` runs and may pass, ``xfail_strict`` runs and must fail);
  every ``edits.ops.include`` item whose ``name`` is in their op table is a test, any other is
  dropped with a warning (``dropped``); unknown keys are ignored everywhere but in a tensor spec;
- the dtype a test is filed under: its first positional tensor's (first list element's), else
  float16; its tolerance: ``global.supported_dtypes[].precision`` of that dtype, else 5e-3;
- args: one of tensor, tensor_list, cache, module_path, config_path/model_id, value, py per
  element (checked in that order); a ``value`` string starting with ``(`` or ``[`` is read as a
  Python literal; kwargs: a mapping holding a spec key is built like an arg, a string naming a
  dtype becomes the dtype, any other string is read as a literal where it is one;
- tensors: their init table (rand/randint through make_tensor, randn through torch.randn(*shape),
  the rest direct), ``stride``/``storage_offset`` through as_strided over a fresh backing; a
  ``file`` path's ``${TORCH_DEVICE_ROOT}`` is the environment's, a plain path is the working
  folder's; the loaded tensor's shape and dtype must match the spec;
- the call: ``fn(input, *args, **kwargs)`` with their entry's meaning (:data:`METHODS` for entries
  that call a Tensor method, :data:`OPERATORS` for Python operators); an in-place entry is judged
  by its input after the call.
"""

from __future__ import annotations

import ast
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from casedb.read import spyre_calls

TEST_ID = "TestSpyreModelOps::test_model_ops_db"
DEFAULT_TOL = 5e-3
SPEC_KEYS = ("tensor", "tensor_list", "cache", "module_path", "config_path", "model_id", "value", "py")
TENSOR_KEYS = {"shape", "dtype", "device", "init", "init_args", "stride", "storage_offset", "device_layout"}
INITS = {"rand", "randn", "zeros", "ones", "randint", "arange", "xavier", "eye", "full", "file"}
DTYPES = {"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "complex32", "complex64", "complex128", "bool", "half"}
# their entries that call a Tensor method on the first argument (sizes given as varargs or one list)
METHODS = {"torch.contiguous": "contiguous", "torch.Tensor.contiguous": "contiguous", "torch.view": "view",
           "torch.Tensor.view": "view", "torch.aten.view": "view", "torch.view_as": "view_as",
           "torch.transpose": "transpose", "torch.permute": "permute", "torch.squeeze": "squeeze",
           "torch.unsqueeze": "unsqueeze", "torch.expand": "expand", "torch.Tensor.expand": "expand",
           "torch.expand_as": "expand_as", "torch.repeat": "repeat", "torch.repeat_interleave": "repeat_interleave",
           "torch.float": "float", "float": "float", "torch.int": "int", "torch.long": "long", "torch.to": "to",
           "torch.type_as": "type_as", "torch.item": "item", "torch.numel": "numel", "torch.new_ones": "new_ones",
           "torch.Tensor.copy_": "copy_", "torch.scatter_": "scatter_", "torch.index_copy_": "index_copy_",
           "torch.masked_fill_": "masked_fill_", "torch.clamp_": "clamp_", "torch.add_": "add_", "torch.and_": "and_",
           "torch.or_": "or_", "torch.Tensor.truediv": "__truediv__"}
SIZED = {"view", "permute", "expand", "repeat"}
OPERATORS = {"torch.__and__": operator.and_, "torch.__eq__": operator.eq, "torch.eq": operator.eq,
             "torch.le": operator.le, "torch.lt": operator.lt, "torch.ne": operator.ne, "torch.gt": operator.gt,
             "torch.ge": operator.ge, "torch.neg": operator.neg, "torch.truediv": operator.truediv,
             "torch.floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
             "torch.invert": torch.bitwise_not, "torch.getitem": operator.getitem,
             "operator.__getitem__": operator.getitem, "operator.__add__": torch.add, "operator.__sub__": torch.sub,
             "operator.__mul__": torch.mul, "operator.__matmul__": torch.matmul, "torch.Tensor.add": torch.add,
             "torch.Tensor.mul": torch.mul}
SETITEM = ("torch.setitem", "_operator.setitem")


@dataclass
class Test:
    name: str
    op: str
    dtype: torch.dtype
    rtol: float
    atol: float
    item: dict
    mode: str = "mandatory_success"  # their test mode: skip is not run, xfail may fail, xfail_strict must fail


@dataclass
class Collected:
    tests: list = field(default_factory=list)
    dropped: list = field(default_factory=list)  # (op, why)


def collect(path: Path) -> Collected:
    """The tests their runner collects from a config, and the items it drops."""
    suite = yaml.safe_load(Path(path).read_text())["test_suite_config"]
    precision = {_dtype(d["name"]): d.get("precision") or {} for d in (suite.get("global") or {}).get("supported_dtypes") or []}
    out = Collected()
    table = spyre_calls.table()
    for entry in suite.get("files") or []:
        for test in entry.get("tests") or []:
            if TEST_ID not in test.get("names", []):
                continue
            for item in ((test.get("edits") or {}).get("ops") or {}).get("include") or []:
                if item["name"] not in table:
                    out.dropped.append((item["name"], "not in their op table"))
                    continue
                for a in (item.get("sample_inputs_func") or {}).get("args") or []:
                    _check_arg(a)
                dtype = _variant(item)
                prec = precision.get(dtype, {})
                rtol = prec.get("rtol") if prec.get("rtol") is not None else DEFAULT_TOL
                atol = prec.get("atol") if prec.get("atol") is not None else DEFAULT_TOL
                out.tests.append(Test(f"{item['name'].replace('.', '_')}__{len(out.tests)}", item["name"], dtype,
                                      rtol, atol, item, test.get("mode", "mandatory_success")))
    return out


def _dtype(name: str) -> torch.dtype:
    bare = str(name).removeprefix("torch.")
    if bare not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}")
    return getattr(torch, bare)


def _variant(item: dict) -> torch.dtype:
    args = (item.get("sample_inputs_func") or {}).get("args") or []
    first = args[0] if args else {}
    if "tensor" in first:
        return _dtype(first["tensor"]["dtype"])
    if "tensor_list" in first:
        return _dtype(first["tensor_list"][0]["dtype"])
    return torch.float16


def _check_arg(a: dict) -> None:
    specs = [a["tensor"]] if "tensor" in a else a.get("tensor_list") or []
    for t in specs:
        extra = set(t) - TENSOR_KEYS
        if extra:
            raise ValueError(f"tensor spec keys their loader forbids: {sorted(extra)}")
        _dtype(t["dtype"])
        init = t.get("init", "rand")
        if init not in INITS:
            raise ValueError(f"init {init!r} is not one of theirs")
        ia = t.get("init_args") or {}
        needs = {"randint": "high", "full": "fill_value", "file": "path"}.get(init)
        if needs and ia.get(needs) is None:
            raise ValueError(f"init {init} needs init_args.{needs}")
        if init == "randint" and not all(isinstance(ia.get(k, 0), int) for k in ("low", "high")):
            raise ValueError("randint bounds are integers")
        if t.get("stride") is not None and len(t["stride"]) != len(t["shape"]):
            raise ValueError("stride and shape lengths differ")


# ----------------------------------------------------------------------------------- building

def build_tensor(t: dict, seed: int | None) -> torch.Tensor:
    """A tensor as their loader builds one."""
    from torch.testing import make_tensor

    shape, dtype, init = list(t["shape"]), _dtype(t["dtype"]), t.get("init", "rand")
    ia = t.get("init_args") or {}
    if init == "file":
        return _load(t)
    direct = {"arange": lambda: torch.arange(shape[0], dtype=dtype), "eye": lambda: torch.eye(shape[0], dtype=dtype),
              "xavier": lambda: torch.nn.init.xavier_uniform_(torch.empty(shape, dtype=dtype)),
              "full": lambda: torch.full(shape, ia["fill_value"], dtype=dtype),
              "zeros": lambda: torch.zeros(shape, dtype=dtype), "ones": lambda: torch.ones(shape, dtype=dtype)}
    if init in direct:
        return direct[init]()
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        low, high = (0.0, 1.0) if init == "rand" else (ia.get("low", 0), ia.get("high"))
        if init == "randn":
            t_ = torch.randn(*shape, dtype=dtype)  # no size for a 0-d spec: the TypeError their loader meets
        else:
            t_ = make_tensor(*shape, dtype=dtype, device="cpu", low=low, high=high)
        if t.get("stride") is None and not t.get("storage_offset"):
            return t_
        stride = t["stride"] if t.get("stride") is not None else list(t_.stride())
        offset = t.get("storage_offset") or 0
        needed = offset + (sum((s - 1) * st for s, st in zip(shape, stride)) + 1 if shape else 1)
        fresh = torch.randn(needed, dtype=dtype) if init == "randn" else make_tensor(
            needed, dtype=dtype, device="cpu", low=low, high=high)
        return torch.as_strided(fresh, shape, stride, offset)


def _load(t: dict) -> torch.Tensor:
    raw = t["init_args"]["path"]
    root = os.environ.get("TORCH_DEVICE_ROOT")
    if "${TORCH_DEVICE_ROOT}" in raw:
        if root is None:
            raise ValueError("${TORCH_DEVICE_ROOT} is not set")
        raw = raw.replace("${TORCH_DEVICE_ROOT}", root)
    value = torch.load(raw if os.path.isabs(raw) else os.path.join(os.getcwd(), raw), map_location="cpu")
    if list(value.shape) != list(t["shape"]) or value.dtype != _dtype(t["dtype"]):
        raise ValueError(f"{raw}: {list(value.shape)} {value.dtype} is not the spec's")
    return value


def build_args(item: dict, seed: int | None) -> tuple[list, dict]:
    sample = item.get("sample_inputs_func") or {}
    args = []
    for i, a in enumerate(sample.get("args") or []):
        s = None if seed is None else seed + i * 1000
        if "tensor" in a:
            args.append(build_tensor(a["tensor"], s))
        elif "tensor_list" in a:
            args.append([build_tensor(t, None if s is None else s + j * 7) for j, t in enumerate(a["tensor_list"])])
        elif "value" in a:
            v = a["value"]
            args.append(_literal(v) if isinstance(v, str) and v[:1] in "([" else v)
        elif "py" in a:
            args.append(_py(a["py"]))
        else:
            raise ValueError(f"an input kind casedb never exports: {sorted(a)}")
    kwargs = {}
    for k, v in (sample.get("kwargs") or {}).items():
        if isinstance(v, dict) and set(v) & set(SPEC_KEYS):
            built, _ = build_args({"sample_inputs_func": {"args": [v]}}, None)  # their kwargs get no seed
            kwargs[k] = built[0]
        elif isinstance(v, str) and v.removeprefix("torch.") in DTYPES:
            kwargs[k] = _dtype(v)
        elif isinstance(v, str):
            kwargs[k] = _literal(v)
        else:
            kwargs[k] = v
    return args, kwargs


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _py(text: str):
    from casedb.cases import safe_eval

    return safe_eval.parse_py_literal(text)


# ----------------------------------------------------------------------------------- calling

def call(op: str, args: list, kwargs: dict):
    """Their entry's call; an in-place entry's result is its (changed) first argument."""
    if op == "torch.nn.functional.dropout":
        kwargs.setdefault("training", False)  # their entry's pre-hook
    if op in SETITEM:
        args[0][args[1]] = args[2]
        return args[0]
    if op in OPERATORS:
        return OPERATORS[op](*args, **kwargs)
    if op in METHODS:
        name, x, rest = METHODS[op], args[0], list(args[1:])
        if name in SIZED and len(rest) > 1:
            rest = [rest]
        out = getattr(x, name)(*rest, **kwargs)
        return x if name.endswith("_") else out
    fn = torch
    for part in op.split(".")[1:]:
        fn = getattr(fn, part)
    out = fn(*args, **kwargs)
    return args[0] if op.endswith("_") else out


def run_on_cpu(test: Test, seed: int | None) -> None:
    """Their CPU run of one test: the reference call and the "device" call, on the CPU the same
    tensors (their move to the CPU is no copy), compared with the test's tolerance."""
    args, kwargs = build_args(test.item, seed)
    with torch.no_grad():
        ref = call(test.op, args, kwargs)
        got = call(test.op, args, kwargs)
    _close(ref, got, test)


def _close(ref, got, test: Test) -> None:
    if torch.is_tensor(ref):
        torch.testing.assert_close(got, ref, rtol=test.rtol, atol=test.atol, equal_nan=True)
    elif isinstance(ref, (tuple, list)):
        assert len(ref) == len(got)
        for r, g in zip(ref, got):
            _close(r, g, test)
    else:
        assert ref == got or (ref != ref and got != got)
