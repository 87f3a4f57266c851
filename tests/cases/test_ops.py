"""casedb.cases.ops: op-name resolution and classification (writes / random output)."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

from casedb.cases.ops import UnknownOpError, get_arg, op_info, resolve_op


@pytest.mark.parametrize("name, expected", [
    ("torch.add", torch.add),
    ("torch.nn.functional.softmax", F.softmax),
    ("F.gelu", F.gelu),
    ("torch.special.erf", torch.special.erf),
    ("torch.ops.aten.add.Tensor", torch.ops.aten.add.Tensor),
    ("torch.ops.aten.view", torch.ops.aten.view),
    ("aten::add.Tensor", torch.ops.aten.add.Tensor),
    ("aten::mm", torch.ops.aten.mm),
    ("aten.add.Tensor", torch.ops.aten.add.Tensor),
    ("torch.view", torch.Tensor.view),
    ("torch.contiguous", torch.Tensor.contiguous),
    ("torch.to", torch.Tensor.to),
    ("torch.float", torch.Tensor.float),
    ("torch.Tensor.mul", torch.Tensor.mul),
    ("torch.Tensor.__rsub__", torch.Tensor.__rsub__),
    ("torch.getitem", operator.getitem),
    ("operator.getitem", operator.getitem),
    ("torch.invert", operator.invert),
])
def test_resolves(name, expected):
    assert resolve_op(name) is expected


def test_resolved_callables_work():
    x = torch.arange(6.0).reshape(2, 3)
    assert resolve_op("torch.view")(x, [3, 2]).shape == (3, 2)
    assert torch.equal(resolve_op("torch.Tensor.__rsub__")(x, 1.0), 1.0 - x)
    assert resolve_op("torch.getitem")(x, (Ellipsis, None, slice(None))).shape == (2, 1, 3)
    y = x.clone()
    assert resolve_op("torch.setitem")(y, (0, 1), 7.0) is None and y[0, 1] == 7.0
    assert torch.equal(resolve_op("torch.invert")(torch.tensor([True, False])), torch.tensor([False, True]))
    assert resolve_op("torch.ops.aten.view")(x, [6]).shape == (6,)


def test_resolution_is_cached():
    assert op_info("torch.add") is op_info("torch.add")


@pytest.mark.parametrize("name, message", [
    ("torch.addd", "did you mean add"),
    ("torch.nn.functional.sofmax", "did you mean softmax"),
    ("torch.ops.aten.not_an_op", "torch.ops.aten has no op"),
    ("torch.ops.aten.add.NoSuch", "overloads: "),
    ("torch.ops.not_loaded_ns.op", "import the module that registers it"),
    ("numpy.add", "ops are written"),
    ("", "non-empty"),
])
def test_unknown_ops(name, message):
    with pytest.raises(UnknownOpError, match=message):
        resolve_op(name)


def _writes(name, args=(), kwargs=None):
    return op_info(name).mutated(list(args), kwargs or {})


def test_writes():
    x = object()
    assert _writes("torch.add", [x, x]) == []
    assert _writes("torch.Tensor.add_", [x, x]) == ["args[0]"]
    assert _writes("torch.ops.aten.add_.Tensor", [x, x]) == ["args[0]"]
    assert _writes("torch.ops.aten.add_", [x, x]) == ["args[0]"]
    assert _writes("torch.ops.aten.add.out", [x, x], {"out": x}) == ["kwargs[out]"]
    assert _writes("torch.add", [x, x], {"out": x}) == ["kwargs[out]"]
    assert _writes("torch.setitem", [x, 0, 1.0]) == ["args[0]"]
    assert _writes("torch.Tensor.__setitem__", [x, 0, 1.0]) == ["args[0]"]
    assert _writes("operator.iadd", [x, x]) == ["args[0]"]
    assert _writes("torch.Tensor.masked_fill_", [x, x, 0.0]) == ["args[0]"]
    assert _writes("torch.nn.functional.relu", [x], {"inplace": True}) == ["args[0]"]
    assert _writes("torch.nn.functional.relu", [x, True]) == ["args[0]"]
    assert _writes("torch.nn.functional.relu", [x]) == []
    assert _writes("torch.Tensor.__rsub__", [x, 1.0]) == []
    key = _writes("torch.Tensor.copy_", [x, x])[0]
    assert get_arg([1, 2], {}, key) == 1 and get_arg([], {"out": 3}, "kwargs[out]") == 3


@pytest.mark.parametrize("name, args, kwargs, metadata_only", [
    ("torch.add", [1, 2], {}, False),
    ("torch.rand", [[2, 3]], {}, True),
    ("torch.empty_like", ["x"], {}, True),
    ("torch.Tensor.new_empty", ["x", [2]], {}, True),
    ("torch.ops.aten.empty.memory_format", [[2]], {}, True),
    ("torch.Tensor.uniform_", ["x"], {}, True),
    ("torch.randn_like", ["x"], {}, True),
    ("torch.nn.functional.dropout", ["x"], {}, True),                 # training defaults to True
    ("torch.nn.functional.dropout", ["x"], {"training": False}, False),
    ("torch.nn.functional.dropout", ["x", 0.0], {}, False),
    ("torch.dropout", ["x", 0.1, False], {}, False),
    ("torch.dropout", ["x", 0.1, True], {}, True),
    ("torch.ops.aten.native_dropout.default", ["x", 0.5, True], {}, True),
    ("torch.nn.functional.alpha_dropout", ["x"], {}, False),          # training defaults to False
    ("torch.nn.functional.scaled_dot_product_attention", ["q", "k", "v"], {}, False),
    ("torch.nn.functional.scaled_dot_product_attention", ["q", "k", "v"], {"dropout_p": 0.1}, True),
    ("torch.nn.functional.rrelu", ["x"], {}, False),
    ("torch.nn.functional.rrelu", ["x"], {"training": True}, True),
])
def test_metadata_only(name, args, kwargs, metadata_only):
    assert op_info(name).metadata_only(args, kwargs) is metadata_only
