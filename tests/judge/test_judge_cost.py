"""A judge that costs little (issue 30): the high-precision reference is computed only where a
judge can use it, and the verdicts are the ones the always-computed reference gives."""

from __future__ import annotations

import json

import pytest

from casedb.judge import numerics
from casedb.judge.verdict import judge
from casedb.run.execute import run_case
from tests.helpers import rows
from tests.judge.test_numerics import perturbed

SIG = "ef" * 32


def T(shape, dtype="float32", init="randn"):
    return {"tensor": {"shape": shape, "dtype": dtype, "init": init}}


def case(op, *inputs, dtype="float32"):
    return {"signature": SIG, "op": op, "inputs": list(inputs), "attrs": {}, "dtype": dtype, "seed": 5}


CASES = {
    "bf16 add": case("torch.add", T([64, 96], "bfloat16"), T([64, 96], "bfloat16"), dtype="bfloat16"),
    "fp32 matmul": case("torch.matmul", T([32, 128]), T([128, 16])),
    "fp32 silu": case("torch.nn.functional.silu", T([64, 256])),
    "fp16 softmax": case("torch.softmax", T([8, 300], "float16"), {"value": -1}, dtype="float16"),
}


BACKENDS = {
    "eager": "eager",
    "truncation": "casedb_mutant_truncation",
    "one ulp up": "casedb_mutant_ulp_error",
    "x 1.001": perturbed(None, lambda y: y * 1.001),
}


def verdict(ex, name):
    tols = numerics.Policy().tolerances({"name": "c", "model": "m"}, CASES[name], ex.dtypes())
    return judge(ex, tolerances=tols)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("name", list(CASES))
def test_the_verdict_is_the_one_an_always_computed_reference_gives(name, backend):
    from casedb.mutation import mutants  # noqa: F401  (registers the backends)

    always = run_case(CASES[name], backend=BACKENDS[backend], high_precision=True)
    needed = run_case(CASES[name], backend=BACKENDS[backend], high_precision="needed")
    a, n = verdict(always, name), verdict(needed, name)
    assert (n.outcome, n.stage) == (a.outcome, a.stage)
    identical = always.target is not None and all(
        (x == y).all() for x, y in zip(always.reference.values(), always.target.values()))
    if identical:  # every judge passes it: nothing to measure against
        assert needed.reference_hi is None and needed.reference_dtype is None and n.outcome == "passed"
    else:
        assert needed.reference_hi is not None
        assert (n.reason, n.ulp_err, n.ref_ulp_err, n.bias_toward) == (a.reason, a.ulp_err, a.ref_ulp_err, a.bias_toward)


def test_a_run_computes_no_upcast_reference_for_a_bit_identical_target(cli, db_path, tmp_path):
    (tmp_path / "m.yaml").write_text("""\
model: cheap
cases:
  - name: silu
    op: torch.nn.functional.silu
    inputs: [{tensor: {shape: [64, 33], dtype: bfloat16}}]
""")
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    out = json.loads(cli("run", "--model", "cheap", "--backend", "eager", "--device", "cpu", "-m", "", "-j", "0",
                         "--json", "--no-reference-cache").stdout)
    assert out["passed"] == 1
    (r,) = rows(db_path, "SELECT metrics, judge FROM results WHERE run_id = ?", [out["run_id"]])
    metrics = json.loads(r["metrics"])
    assert r["judge"] == "both" and metrics["reference_dtype"] is None and metrics["t_ref_hi"] is None
    # a reference dtype given is always computed
    ex = run_case(CASES["bf16 add"], reference_dtype="float64", high_precision="needed")
    assert ex.reference_hi["output"].dtype.itemsize == 8
