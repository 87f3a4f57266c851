"""Trace cases keep the values and dtypes the model used (issue 44 item 3): a Python number an op
was called with is a value of its Python type, never a random 0-d float64/int64 tensor; Kineto's
Tensor[] elements (cat's list, whose dtype it does not record) take the dtype the model's tensors
show; an unrecorded device is what ET records. So the same calls from a Kineto and an ET trace
are the same cases.

Fixtures: tests/data/traces/tiny_bf16_forward.{kineto,et}.json, written by hand in the shape of
torch 2.13's profiler output (checked against a real profile of ``x * 0.5``, ``torch.add(x, 2)``,
``torch.cat``: neither profiler records the value of a Python number passed to a Tensor argument).
The calls of a bf16 model: linear, ``x * 0.5``, ``x + 1``, ``add(x, y, alpha=2)``, ``x.float()``,
a bf16 cat nothing later reads, a float32 rotary cat read by a float32 cos, ``fill_(1.5)``.
"""

import json
import sqlite3

import pytest

from importers import execution_trace, kineto
from tests.conftest import DATA

KINETO = DATA / "traces" / "tiny_bf16_forward.kineto.json"
ET = DATA / "traces" / "tiny_bf16_forward.et.json"


def cases(records):
    return {r["case"]["op"] + " " + json.dumps(r["case"]["inputs"][:1]): r["case"] for r in records
            if r["type"] == "case"}


def by_op(records, op):
    return [r["case"] for r in records if r["type"] == "case" and r["case"]["op"] == op]


@pytest.mark.parametrize("mod, path, source", [(kineto, KINETO, "Kineto"), (execution_trace, ET, "the Execution Trace")])
def test_a_python_number_is_a_value_of_its_type_never_a_float64_tensor(mod, path, source):
    records = list(mod.parse(path))
    (mul,) = by_op(records, "torch.ops.aten.mul.Scalar")
    # x * 0.5: a float, its value not recorded: mul's identity, said in the description
    assert mul["inputs"][1] == {"value": 1.0} and type(mul["inputs"][1]["value"]) is float
    assert f"{source} does not record the value of the Python number other=1.0: a neutral value" in mul["description"]
    (add,) = by_op(records, "torch.ops.aten.add.Scalar")
    assert add["inputs"][1:] == [{"value": 1}, {"value": 1}] and type(add["inputs"][1]["value"]) is int
    # recorded Python numbers keep their value and type: alpha=2, fill_(1.5)
    (add_tensors,) = by_op(records, "torch.ops.aten.add.Tensor")
    assert add_tensors["attrs"] == {"alpha": 2}
    assert by_op(records, "torch.ops.aten.fill_.Scalar")[0]["inputs"][1] == {"value": 1.5}
    zero_dim = [i for c in cases(records).values() for i in c["inputs"]
                if i.get("tensor", {}).get("shape") == [] and i["tensor"].get("dtype") in ("float64", "int64")]
    assert zero_dim == []


def test_a_recorded_python_number_keeps_its_value(tmp_path):
    """A trace that writes the number (Concrete Inputs of the 0-d argument) keeps it."""
    doc = json.loads(KINETO.read_text())
    mul = next(e for e in doc["traceEvents"] if e["name"] == "aten::mul")
    mul["args"]["Concrete Inputs"] = ["", "0.125"]
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(doc))
    (case,) = by_op(kineto.parse(path), "torch.ops.aten.mul.Scalar")
    assert case["inputs"][1] == {"value": 0.125} and "neutral" not in case["description"]


def test_a_bf16_models_cat_list_imports_as_bf16_and_a_float32_one_as_float32():
    cat, rotary = by_op(kineto.parse(KINETO), "torch.ops.aten.cat.default")
    assert {t["dtype"] for t in cat["inputs"][0]["tensor_list"]} == {"bf16"}
    assert cat["description"].endswith("(Kineto does not record Tensor[] element dtypes: bf16, "
                                       "the dominant floating dtype of the trace's tensors)")
    # the rotary embedding's cat is float32 in a bf16 model: the cos that reads it says so
    assert {t["dtype"] for t in rotary["inputs"][0]["tensor_list"]} == {"fp32"}
    assert "fp32, the dtype of the next call taking its result (aten::cos, event 8)" in rotary["description"]


def test_import_dtype_sets_the_cat_dtype_no_call_shows(cli, db_path):
    assert cli("import", KINETO, "--model", "m", "--dtype", "nonsense").exit_code == 2
    cli.json("import", KINETO, "--model", "m", "--dtype", "fp16")
    con = sqlite3.connect(db_path)
    try:
        lists = [json.loads(r[0])[0]["tensor_list"] for r in con.execute("SELECT inputs FROM cases WHERE op LIKE '%cat%'")]
    finally:
        con.close()
    assert sorted(t["dtype"] for tl in lists for t in tl) == ["float16", "float16", "float32", "float32"]


def test_an_unrecorded_device_is_what_et_records():
    for mod, path in ((kineto, KINETO), (execution_trace, ET)):
        (to_copy,) = by_op(mod.parse(path), "torch.ops.aten._to_copy.default")
        assert to_copy["attrs"]["device"] is None  # the device follows the tensor


def test_the_same_calls_from_kineto_and_et_are_the_same_cases(cli, db_path):
    k = cli.json("import", KINETO, "--model", "tiny")
    e = cli.json("import", ET, "--model", "tiny")
    assert k["totals"]["new_cases"] == 9
    assert (e["totals"]["records"], e["totals"]["new_cases"], e["totals"]["duplicates"]) == (9, 0, 9)
    # and they run: eager against the CPU reference, no float64 operand anywhere
    run = cli.json("run", "--model", "tiny", "--device", "cpu", "--backend", "eager", "-m", "", "--no-shipped-triage")
    assert (run["passed"], run["failed"], run["errors"]) == (9, 0, 0)
