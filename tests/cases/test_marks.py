import pytest

from casedb.cases.spec import normalize_case
from casedb.cases.marks import MarkExpression


def derived(inputs, attrs=None, dtype="fp16"):
    return normalize_case({"op": "torch.foo", "inputs": inputs, "attrs": attrs or {}}, {"dtype": dtype}).derived_marks


@pytest.mark.parametrize("inputs, attrs, expected", [
    ([{"tensor": {"shape": [4, 128]}}], {}, []),
    ([{"tensor": {"shape": [1, 2, 3, 64]}}], {}, ["largedimtensor"]),
    ([{"tensor": {"shape": [1, 2, 3, 4, 64]}}], {}, ["largedimtensor"]),
    ([{"tensor": {"shape": [4, 100]}}], {}, ["paddedtensor"]),
    ([{"tensor": {"shape": []}}], {}, []),
    ([{"tensor": {"shape": [64], "dtype": "fp32"}}], {}, ["fp32operation"]),
    ([{"tensor": {"shape": [64], "dtype": "bf16"}}, {"tensor": {"shape": [64], "dtype": "int64"}}], {}, ["bf16operation"]),
    ([{"tensor": {"shape": [64], "dtype": "bf16"}}, {"tensor": {"shape": [64], "dtype": "fp16"}}], {}, ["fp32operation"]),
    ([{"tensor": {"shape": [64]}}, {"value": 3.0}], {}, ["constant"]),
    ([{"tensor": {"shape": [64]}}, {"value": [2, 32]}], {}, ["constant"]),
    ([{"tensor": {"shape": [64]}}, {"py": "(Ellipsis, None)"}], {}, ["constant"]),
    ([{"tensor": {"shape": [64]}}, {"value": None}], {}, []),
    ([{"tensor": {"shape": [64]}}], {"dim": -1}, []),
    ([{"tensor_list": [{"shape": [2, 3]}, {"shape": [2, 64]}]}], {}, ["paddedtensor"]),
    ([{"tensor": {"shape": [2, 64], "dtype": "int64"}}], {"dtype": "torch.bfloat16"}, ["bf16operation"]),
])
def test_derived_marks(inputs, attrs, expected):
    assert derived(inputs, attrs) == expected


def test_hand_written_marks_kept_beside_derived():
    n = normalize_case({"op": "torch.foo", "marks": "slow, constant", "inputs": [{"tensor": {"shape": [64]}}]}, {})
    # `constant` is not derived for this case, so it stays a hand-written mark
    assert (n.derived_marks, n.marks) == (["fp32operation"], ["slow", "constant"])


@pytest.mark.parametrize("expr, marks, expected", [
    ("", ["constant"], True),
    ("not constant", ["constant"], False),
    ("not largedimtensor and not constant", ["paddedtensor"], True),
    ("(a or b) and not c", ["b"], True),
])
def test_mark_expressions(expr, marks, expected):
    assert MarkExpression(expr).matches(marks) is expected


def test_bad_mark_expression():
    with pytest.raises(ValueError, match="only mark names"):
        MarkExpression("foo == 1")
