"""Signature normalization rules (see casedb/cases/signature.py)."""

import pytest

from casedb.cases.spec import normalize_case
from casedb.errors import InputError
from casedb.cases.signature import data_seed


def sig(case, defaults=None):
    return normalize_case(case, defaults or {}).signature


BASE = {"op": "torch.add", "inputs": [{"tensor": {"shape": [4, 64], "dtype": "fp16"}}, {"value": 1}]}


@pytest.mark.parametrize("variant", [
    {"op": "torch.add", "inputs": [{"tensor": {"shape": [4, 64], "dtype": "float16"}}, {"value": 1}]},
    {"op": " torch.add ", "inputs": [{"tensor": {"shape": [4, 64], "dtype": "torch.float16"}}, {"value": 1}]},
    {"op": "torch.add", "inputs": [{"tensor": {"shape": [4, 64], "dtype": "half", "init": "randn"}}, {"value": 1}]},
    {"op": "torch.add", "inputs": [{"tensor": {"shape": [4, 64]}}, {"value": 1}], "dtype": "fp16"},
    {"name": "other", "description": "x", "rtol": 0.5, "atol": 1, "marks": ["foo"], "op": "torch.add",
     "inputs": [{"tensor": {"shape": [4, 64], "dtype": "fp16"}}, {"value": 1}],
     "skip_if": {"expr": "device == 'cpu'", "reason": "r"}, "expects_error": {"type": "RuntimeError"}},
])
def test_same_execution_same_key(variant):
    assert sig(variant) == sig(BASE)


def test_default_dtype_is_in_the_key():
    no_dtype = {"op": "torch.add", "inputs": [{"tensor": {"shape": [4, 64]}}, {"value": 1}]}
    assert sig(no_dtype, {"dtype": "fp16"}) == sig(BASE)
    assert sig(no_dtype, {"dtype": "bf16"}) != sig(BASE)


@pytest.mark.parametrize("change", [
    {"op": "torch.sub"},
    {"inputs": [{"tensor": {"shape": [4, 65], "dtype": "fp16"}}, {"value": 1}]},
    {"inputs": [{"tensor": {"shape": [4, 64], "dtype": "fp16"}}, {"value": 1.0}]},
    {"inputs": [{"tensor": {"shape": [4, 64], "dtype": "fp16", "init": "rand"}}, {"value": 1}]},
    {"inputs": [{"tensor": {"shape": [4, 64], "dtype": "fp16", "preset": "transpose_view"}}, {"value": 1}]},
    {"inputs": [{"tensor": {"shape": [4, 64], "dtype": "fp16"}}, {"py": "1"}]},
    {"attrs": {"alpha": 2}},
    {"seed": 7},
])
def test_what_is_executed_changes_the_key(change):
    assert sig({**BASE, **change}) != sig(BASE)


def test_aten_spellings_normalize():
    a = {"op": "aten::mm", "inputs": []}
    b = {"op": "torch.ops.aten.mm", "inputs": []}
    assert sig(a) == sig(b)
    assert normalize_case({"op": "aten.add.Tensor", "inputs": []}, {}).op == "torch.ops.aten.add.Tensor"


def test_data_seed():
    key = sig(BASE)
    assert data_seed(key, None) == int(key[:8], 16)
    assert data_seed(key, 5) == 5


def test_errors_name_the_case():
    with pytest.raises(InputError, match="case 'bad': inputs\\[0\\]: shape \\[-1\\] has negative dimension"):
        normalize_case({"name": "bad", "op": "torch.relu", "inputs": [{"tensor": {"shape": [-1]}}]}, {},
                       where="m.yaml:3")
