"""Extremal value variants (casedb.cases.value_ranges, ``--values extremal``): the ranges random inputs never reach."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

from casedb.cases import value_ranges
from casedb.cases.materialize import prepare
from tests.helpers import rows

SOFTMAX = {"op": "torch.nn.functional.softmax", "signature": "50f7" * 16, "dtype": "float32",
           "inputs": [{"tensor": {"shape": [4, 300]}}], "attrs": {"dim": -1}}


def _case(op, *inputs, dtype="float32", attrs=None):
    return {"op": op, "signature": "ab12" * 16, "dtype": dtype, "inputs": list(inputs), "attrs": attrs or {}}


def test_each_family_rewrites_the_random_floating_inputs_of_its_ops():
    assert value_ranges.variant(SOFTMAX, "random") is SOFTMAX
    ext = value_ranges.variant(SOFTMAX, "extremal")
    assert ext["inputs"] == [{"tensor": {"shape": [4, 300], "init": "randn", "init_args": {"mean": 96.7}}}]
    assert SOFTMAX["inputs"] == [{"tensor": {"shape": [4, 300]}}]  # the case itself is left alone
    half = value_ranges.variant({**SOFTMAX, "dtype": "float16"}, "extremal")
    assert half["inputs"][0]["tensor"]["init_args"] == {"mean": 19.1}

    exp = value_ranges.variant(_case("torch.Tensor.exp_", {"tensor": {"shape": [8]}}), "extremal")
    assert exp["inputs"][0]["tensor"] == {"shape": [8], "init": "uniform", "init_args": {"low": 72.7, "high": 92.7}}
    mm = value_ranges.variant(_case("torch.ops.aten.mm.default", {"tensor": {"shape": [2, 3]}},
                                    {"tensor": {"shape": [3, 2], "init": "rand"}}), "extremal")
    assert [i["tensor"] for i in mm["inputs"]] == [
        {"shape": [2, 3], "init": "randn", "init_args": {"mean": 4.29e9, "std": 4.29e9 / 8}},
        {"shape": [3, 2], "init": "randn", "init_args": {"mean": 4.29e9, "std": 4.29e9 / 8}}]
    # indices, masks, data and integers keep their values; only the random floating input changes
    where = value_ranges.variant(_case("torch.where", {"tensor": {"shape": [4], "dtype": "bool"}},
                                       {"tensor": {"shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}},
                                       {"tensor": {"shape": [4]}}), "extremal")
    assert [value_ranges.SPECIALS in i["tensor"] for i in where["inputs"]] == [False, False, True]
    sdpa = value_ranges.variant(_case("torch.nn.functional.scaled_dot_product_attention",
                                      *[{"tensor": {"shape": [1, 2, 8, 4]}} for _ in range(3)]), "extremal")
    assert [i["tensor"].get("init_args") for i in sdpa["inputs"]] == [{"std": 32.2}, None, None]


def test_ops_without_a_range_and_conversions_to_integers_have_no_extremal_variant():
    assert value_ranges.variant(_case("torch.cat", {"tensor_list": [{"shape": [2]}]}), "extremal") is None
    to_int = _case("torch.Tensor.to", {"tensor": {"shape": [4]}}, {"value": "torch.int64"})
    assert value_ranges.variant(to_int, "extremal") is None
    to_bf16 = _case("torch.Tensor.to", {"tensor": {"shape": [4]}}, {"value": "torch.bfloat16"})
    assert value_ranges.SPECIALS in value_ranges.variant(to_bf16, "extremal")["inputs"][0]["tensor"]
    only_ints = _case("torch.add", {"tensor": {"shape": [4], "dtype": "int64"}})
    assert value_ranges.variant(only_ints, "extremal") is None
    with pytest.raises(ValueError, match="values must be one of random, extremal"):
        value_ranges.variant(SOFTMAX, "huge")


def test_extremal_inputs_as_generated():
    (x,), _ = prepare(value_ranges.variant(SOFTMAX, "extremal")).place("cpu")
    (r,), _ = prepare(SOFTMAX).place("cpu")
    assert torch.allclose(x, r + 96.7, atol=1e-4)  # the same draw, shifted: the same softmax
    assert torch.allclose(torch.softmax(x, -1), torch.softmax(r, -1), atol=1e-6)
    assert torch.exp(x).isinf().any()  # ... which a softmax without the max cannot compute

    add = value_ranges.variant(_case("torch.add", {"tensor": {"shape": [4, 11]}}, {"tensor": {"shape": [44]}},
                                     dtype="bfloat16"), "extremal")
    (a, b), _ = prepare(add).place("cpu")
    flat = a.reshape(-1)
    specials = [v.item() for v in flat[::value_ranges.SPECIAL_STRIDE]]
    info = torch.finfo(torch.bfloat16)
    want = [math.inf, -math.inf, math.nan, 0.0, -0.0, info.tiny / 4]
    assert [str(v) for v in specials] == [str(float(torch.tensor(w, dtype=torch.bfloat16))) for w in want]
    assert math.copysign(1, specials[4]) == -1 and 0 < specials[5] < info.tiny  # -0 and a subnormal
    assert torch.isfinite(flat[1:8]).all() and b[::8].isinf().sum() == 2


@pytest.mark.slow
def test_a_softmax_overflow_is_caught_only_by_the_extremal_variant():
    from casedb.judge import numerics
    from casedb.mutation import mutants  # noqa: F401  (registers the backends)
    from casedb.judge.verdict import judge
    from casedb.run.execute import run_case

    tols = numerics.Policy().tolerances({"name": "softmax", "model": "m"}, SOFTMAX, ["float32"])

    def verdict(case, backend):
        return judge(run_case(case, backend=backend, high_precision=True), tolerances=tols, judge="both")

    ext = value_ranges.variant(SOFTMAX, "extremal")
    assert verdict(SOFTMAX, "casedb_mutant_softmax_overflow").outcome == "passed"
    caught = verdict(ext, "casedb_mutant_softmax_overflow")
    assert (caught.outcome, caught.nan_inf_mismatch) == ("failed", True)
    assert verdict(ext, "eager").outcome == "passed"  # a correct softmax: no false alarm
    assert verdict(ext, "inductor").outcome == "passed"


MANIFEST = """\
model: ranges
cases:
  - name: softmax
    op: torch.nn.functional.softmax
    attrs: {dim: -1}
    inputs:
      - tensor: {shape: [4, 300]}
  - name: cat
    op: torch.cat
    inputs:
      - tensor_list: [{shape: [2, 3]}, {shape: [2, 3]}]
"""


@pytest.mark.slow
def test_variants_are_separate_results_of_the_same_case(cli, db_path, tmp_path):
    (tmp_path / "m.yaml").write_text(MANIFEST)
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    bad = cli("run", "--model", "ranges", "--values", "huge")
    assert bad.exit_code == 2 and "huge" in bad.output
    runs = {}
    for values in ("random", "extremal"):
        res = cli("run", "--model", "ranges", "--device", "cpu", "--backend", "casedb_mutant_softmax_overflow",
                  "--import", "casedb.mutation.mutants", "-j", "0", "--values", values, "--json")
        s = json.loads(res.stdout)
        runs[values] = (res.exit_code, s["values"], s["passed"], s["failed"], s["skipped"], s["bias"]["measured"])
    # random: the softmax's bias measured (not biased); extremal: NaN rows, nothing finite to measure
    assert runs == {"random": (0, "random", 2, 0, 0, 1), "extremal": (1, "extremal", 0, 1, 1, 0)}
    got = rows(db_path, """SELECT r.run_id, mc.name, r.outcome, r.input_values, r.nan_inf_mismatch
                           FROM results r JOIN model_cases mc ON mc.signature = r.signature ORDER BY r.id""")
    assert got == [
        {"run_id": 1, "name": "softmax", "outcome": "passed", "input_values": "random", "nan_inf_mismatch": 0},
        {"run_id": 1, "name": "cat", "outcome": "passed", "input_values": "random", "nan_inf_mismatch": 0},
        {"run_id": 2, "name": "softmax", "outcome": "failed", "input_values": "extremal", "nan_inf_mismatch": 1}]
    skipped = rows(db_path, "SELECT outcome, reason FROM judgements WHERE run_id = 2 AND result_id IS NULL")
    assert skipped == [{"outcome": "skipped",
                        "reason": "no extremal values for torch.cat (casedb.cases.value_ranges has no rule for it)"}]


def test_the_pytest_front_end_and_casedb_mutants_take_the_option():
    from casedb.run.runspec import RunSpec
    from casedb.run.target import Target

    spec = RunSpec(values="extremal")
    assert "--casedb-values=extremal" in spec.pytest_argv()
    assert Target.from_spec(spec).values == "extremal" and spec.selection()["values"] == "extremal"
    assert "--casedb-values" not in " ".join(RunSpec().pytest_argv())


def test_where_the_cpu_reference_has_nan_inf_wrong_the_float64_reference_decides():
    # casedb_test.gelu_inf_fault has the fault of x86's bfloat16/float32 gelu (NaN at inf) on every
    # CPU; float32, the usual upcast for bfloat16, shares it, so float64 must decide
    from casedb.judge import numerics
    from casedb.judge.verdict import judge
    from casedb.mutation import mutants  # noqa: F401  (registers the backends)
    from casedb.run.execute import run_case
    from tests.run.test_execute import load_custom_ops

    ops = load_custom_ops()
    gelu = _case("torch.nn.functional.gelu", {"tensor": {"shape": [4, 64]}}, dtype="bfloat16")
    case = {**value_ranges.variant(gelu, "extremal"), "op": "torch.ops.casedb_test.gelu_inf_fault"}
    tols = numerics.Policy().tolerances({"name": "gelu", "model": "m"}, case, ["bfloat16"])

    def run(backend):
        ex = run_case(case, backend=backend, high_precision="needed")
        return ex, judge(ex, tolerances=tols)

    ex, right = run(ops.FLOAT64_BACKEND)
    infs = int((ex.target["output"] == math.inf).sum())
    assert infs and ex.reference_dtype == "float64" and "NaN/inf" in ex.notes["high_precision"]
    assert (right.outcome, right.ref_faults, right.nan_inf_mismatch) == ("passed", infs, False)
    assert f"the CPU reference is wrong at {infs} elements" in right.reason
    _, same = run("eager")  # bit-identical to the reference: nothing to decide
    assert (same.outcome, same.ref_faults) == ("passed", None)
    ex, caught = run("casedb_mutant_nan_inf")  # NaN where both references are finite: still the target's
    assert (caught.outcome, caught.nan_inf_mismatch) == ("failed", True) and ex.reference_dtype == "float64"


def test_a_reference_fault_is_reported_in_the_run_and_its_repro(cli, db_path, tmp_path, data_dir, monkeypatch):
    shutil.copy(data_dir / "custom_ops.py", tmp_path / "custom_ops.py")
    monkeypatch.chdir(tmp_path)  # the repro script imports the module where the run did
    (tmp_path / "m.yaml").write_text("""\
model: faults
cases:
  - name: gelu
    op: torch.ops.casedb_test.gelu_inf_fault
    inputs:
      - tensor: {shape: [4], dtype: bfloat16, data: [.inf, 1.0, -2.0, 3.0e+38]}
""")
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    res = cli("run", "--model", "faults", "--device", "cpu", "--backend", "casedb_test_float64", "-j", "0",
              "--import", "custom_ops.py", "--json")
    summary = json.loads(res.stdout)
    assert (res.exit_code, summary["passed"], summary["reference_faults"]) == (0, 1, 1), res.output
    again = cli("run", "--model", "faults", "--device", "cpu", "--backend", "casedb_test_float64", "-j", "0",
                "--import", "custom_ops.py", "--no-progress")
    assert "1 case(s) where the CPU reference's NaN/inf are wrong" in again.output
    got = rows(db_path, """SELECT outcome, nan_inf_mismatch, json_extract(metrics, '$.ref_faults') AS ref_faults,
                                  json_extract(metrics, '$.reference_dtype') AS reference_dtype FROM results""")
    assert got == [{"outcome": "passed", "nan_inf_mismatch": 0, "ref_faults": 1, "reference_dtype": "float64"}] * 2
    reason = rows(db_path, "SELECT reason FROM results")[0]["reason"]
    assert reason.endswith("the CPU reference is wrong at 1 element: its NaN/inf disagree with the float64 "
                           "reference's, which the target's agree with")
    report = json.loads(cli("report", "--run", 1, "--json").stdout)
    assert report["reference_faults"] == [{"op": "torch.ops.casedb_test.gelu_inf_fault", "inputs": "bf16[4]",
                                           "dtype": "bfloat16", "outcome": "passed", "elements": 1, "models": "faults"}]
    assert cli("repro", "faults::gelu", "--run", 1, "--import", "custom_ops.py", "-o", "repro.py").exit_code == 0
    ran = subprocess.run([sys.executable, "repro.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1] == ("note: the CPU reference is wrong at 1 element: its NaN/inf disagree "
                                           "with the upcast reference's, which the target's agree with")
