import math

import pytest

from casedb.cases.safe_eval import UnsafeExpression, canonical_py, evaluate_condition, parse_py_literal


@pytest.mark.parametrize("src, expected", [
    ("(Ellipsis, None, slice(None, None, None))", (Ellipsis, None, slice(None, None, None))),
    ("(..., None, slice(None))", (Ellipsis, None, slice(None))),
    ("[1, -2, 3.5]", [1, -2, 3.5]),
    ("(slice(0, 4, 2), 1)", (slice(0, 4, 2), 1)),
    ("-inf", -math.inf),
    ("(1,)", (1,)),
])
def test_py_literals(src, expected):
    assert parse_py_literal(src) == expected


def test_nan_and_canonical_spelling():
    assert math.isnan(parse_py_literal("nan"))
    assert canonical_py("(..., None, slice(None))") == "(Ellipsis, None, slice(None, None, None))"
    assert canonical_py("(1,)") == "(1,)"
    assert canonical_py(canonical_py("[inf, -inf, nan, 1e-3]")) == "[inf, -inf, nan, 0.001]"


@pytest.mark.parametrize("src", [
    "__import__('os').system('true')", "open('x')", "(lambda: 1)()", "x.y", "[i for i in range(3)]",
    "slice(None, None, None, None)", "1 + 2", "{'a': 1}", "slice(a=1)",
])
def test_py_literals_reject_everything_else(src):
    with pytest.raises(UnsafeExpression):
        parse_py_literal(src)


class Cfg:
    class test_device:
        type = "spyre"


@pytest.mark.parametrize("expr, expected", [
    ("cfg.test_device.type == 'spyre' and dtype_str == 'fp16'", True),
    ("cfg.test_device.type == 'spyre' and dtype_str == 'bf16'", False),
    ("device in ('cuda', 'spyre') or backend == 'eager'", False),
    ("not backend == 'inductor'", False),
    ("not backend == 'eager'", True),
    ("True", True),
])
def test_conditions(expr, expected):
    env = {"cfg": Cfg, "dtype_str": "fp16", "device": "cpu", "backend": "inductor"}
    assert evaluate_condition(expr, env) is expected


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true') == 0", "cfg.__class__", "open('/etc/passwd')", "device[0] == 'c'",
    "os.name == 'posix'", "cfg.test_device.type.upper() == 'SPYRE'", "(lambda: True)()",
])
def test_conditions_reject_calls_and_foreign_names(expr):
    with pytest.raises(UnsafeExpression):
        evaluate_condition(expr, {"cfg": Cfg})
