"""Every front end makes valid cases: the input rules the scanner applies run at import too (any
format), `casedb check` knows every rule, and calls that compute nothing are skipped alike."""

from __future__ import annotations

import json
import sqlite3

import pytest

from casedb.cases.spec import normalize_case
from casedb.ingest import check

BF16, INT = "c10::BFloat16", "int"


def _trace(path, *events):
    """A Kineto trace of the given (name, types, dims, concrete) calls, one after another."""
    out = []
    for i, (name, types, dims, concrete) in enumerate(events):
        out.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 10 * i + 1, "dur": 5,
                    "args": {"External id": i + 1, "Input type": types, "Input Dims": dims,
                             "Input Strides": [[] for _ in types], "Concrete Inputs": concrete or ["" for _ in types]}})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": out}))
    return path


def _inputs(db, op_like):
    con = sqlite3.connect(db)
    try:
        return [json.loads(r[0]) for r in con.execute("SELECT inputs FROM cases WHERE op LIKE ?", (f"%{op_like}%",))]
    finally:
        con.close()


def test_a_traced_grouped_mm_gets_valid_offsets_and_a_correct_backend_passes_it(cli, db_path, tmp_path):
    trace = _trace(tmp_path / "moe.json",
                   ("aten::_grouped_mm", [BF16, BF16, INT, "", ""], [[128, 64], [4, 64, 32], [4], [], []], None))
    report = cli.json("import", trace, "--model", "moe")
    assert report["files"][0]["warnings"] == []
    (inputs,) = _inputs(db_path, "_grouped_mm")
    assert {k: inputs[2]["tensor"][k] for k in ("shape", "dtype", "init")} == {"shape": [4], "dtype": "int32", "init": "data"}
    # random offsets leave rows unwritten (NaN against NaN-free): eager against eager fails then
    checked = cli("check", "--json")
    assert (checked.exit_code, json.loads(checked.stdout)) == (0, [])
    run = cli.json("run", "--model", "moe", "--device", "cpu", "--backend", "eager", "-m", "", "--no-shipped-triage")
    assert (run["passed"], run["failed"], run["errors"]) == (1, 0, 0)


def test_a_traced_integer_divisor_is_never_zero(cli, db_path, tmp_path):
    # An int32 0-d divisor is a tensor the model made; an int64 one is a Python int passed to the
    # op (a wrapped number, issue 44): the floor_divide.Scalar overload with 1, never 0.
    trace = _trace(tmp_path / "div.json",
                   ("aten::floor_divide", ["int", "int"], [[16], []], None),
                   ("aten::floor_divide", ["long int", "long int"], [[16], []], None))
    cli.json("import", trace, "--model", "div")
    tensor, number = _inputs(db_path, "floor_divide")
    assert tensor[1]["tensor"]["init_args"] == {"low": 1, "high": 10}
    assert number[1] == {"value": 1}


MANIFEST = """
model: declared
cases:
  - name: offs_drawn
    op: torch._grouped_mm
    inputs:
      - tensor: {shape: [128, 64], dtype: bf16}
      - tensor: {shape: [4, 64, 32], dtype: bf16}
      - tensor: {shape: [4], dtype: int32, init: randint}
  - name: divisor_drawn
    op: torch.floor_divide
    inputs:
      - tensor: {shape: [16], dtype: int64}
      - tensor: {shape: [], dtype: int64, init: randint}
  - name: mask_drawn
    op: torch.Tensor.masked_scatter
    inputs:
      - tensor: {shape: [8, 4]}
      - tensor: {shape: [8, 4], dtype: bool, init: rand}
      - tensor: {shape: [3]}
"""


def test_check_knows_every_rule_offsets_divisors_and_masks(cli, tmp_path):
    """Values a manifest declares are kept (the author chose them) but checked by the same rules."""
    (tmp_path / "declared.yaml").write_text(MANIFEST)
    report = cli.json("import", tmp_path / "declared.yaml")
    assert sorted(w["case"] for w in report["files"][0]["warnings"]) == ["divisor_drawn", "mask_drawn", "offs_drawn"]
    result = cli("check", "--json")
    assert result.exit_code == 1
    found = {r["case"]: r["problems"] for r in json.loads(result.stdout)}
    assert found == {
        "offs_drawn": ["offs (int32 randint) must be non-decreasing group ends within 128 for torch._grouped_mm; "
                       "give it init: data, data: [32, 64, 96, 128]"],
        "divisor_drawn": ["inputs[1] (int64 randint in [0, 10)) is an integer divisor of torch.floor_divide and "
                          "can be 0; give it init_args {low: 1, high: 10}"],
        "mask_drawn": ["mask (rand) may select up to 32 elements, but source has 3 for torch.Tensor.masked_scatter; "
                       "give it init: zeros or its real values"],
    }


NOTHING = """
model: idle
default: {dtype: bf16}
cases:
  - {op: torch.empty_like, inputs: [{tensor: {shape: [4, 4]}}]}
  - {op: torch.Tensor.detach_, inputs: [{tensor: {shape: [4, 4]}}]}
  - {op: torch.Tensor.to, inputs: [{tensor: {shape: [4, 4]}}, {value: torch.bfloat16}]}
  - {op: torch.Tensor.contiguous, inputs: [{tensor: {shape: [4, 4]}}]}
  - {op: torch.Tensor.to, inputs: [{tensor: {shape: [4, 4]}}, {value: torch.float32}]}
  - {op: torch.Tensor.contiguous, inputs: [{tensor: {shape: [4, 4], preset: transpose_view}}]}
"""


def test_calls_that_compute_nothing_are_skipped_alike_in_a_manifest_and_a_trace(cli, tmp_path):
    (tmp_path / "idle.yaml").write_text(NOTHING)
    manifest = cli.json("import", tmp_path / "idle.yaml")["files"][0]
    trace = _trace(tmp_path / "idle.json",
                   ("aten::empty_like", [BF16, "", "", "", "", ""], [[4, 4], [], [], [], [], []], None),
                   ("aten::detach_", [BF16], [[4, 4]], None),
                   ("aten::lift_fresh", [BF16], [[4, 4]], None),
                   ("aten::mul", [BF16, BF16], [[4, 4], [4, 4]], None))
    traced = cli.json("import", trace, "--model", "idle-trace")["files"][0]
    reasons = [r["reason"].split(":")[0] for r in manifest["skipped_reasons"]]
    assert reasons == ["uninitialized allocation", "alias", "no-op conversion", "no-op conversion"]
    assert (manifest["occurrences"], manifest["skipped"]) == (2, 4)
    assert [r["reason"].split(":")[0] for r in traced["skipped_reasons"]] == ["uninitialized allocation", "alias", "alias"]
    assert (traced["occurrences"], traced["skipped"]) == (1, 3)


@pytest.mark.parametrize("case, problem", [
    ({"op": "torch.floor_divide", "inputs": [{"tensor": {"shape": [4], "dtype": "int64"}},
                                              {"tensor": {"shape": [], "dtype": "int64", "init": "randint",
                                                          "init_args": {"low": 1, "high": 10}}}]}, []),
    ({"op": "torch._grouped_mm", "inputs": [{"tensor": {"shape": [8, 4]}}, {"tensor": {"shape": [2, 4, 4]}},
                                             {"tensor": {"shape": [2], "dtype": "int32", "data": [4, 8]}}]}, []),
])
def test_valid_values_have_no_problems(case, problem):
    assert check.case_problems(normalize_case(case, {"dtype": "bf16"})) == problem
