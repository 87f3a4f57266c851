"""casedb.run.execute and casedb.judge.verdict: run_case + judge, with real torch execution on the CPU."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from casedb.cases.blobs import encode as tensor_bytes
from casedb.judge.execution import Execution
from casedb.judge.verdict import judge
from casedb.run.backend import check_backend
from casedb.run.execute import run_case

DATA = Path(__file__).resolve().parents[1] / "data"
SIG = "5eed" + "cd" * 30


def load_custom_ops():
    """tests/data/custom_ops.py, imported once (it registers ops and a dynamo backend) as
    --import imports it: cases may call the ops of a namespace an --import registered."""
    from casedb.run.target import import_module

    return import_module(str(DATA / "custom_ops.py"))


def T(shape, dtype="float32", init="randn", **kw):
    return {"tensor": {"shape": shape, "dtype": dtype, "init": init, **kw}}


def case(op, *inputs, attrs=None, seed=None, sig=SIG):
    return {"signature": sig, "op": op, "inputs": list(inputs), "attrs": attrs or {}, "dtype": "float32", "seed": seed}


def assert_jsonable(*objs):
    for o in objs:
        json.dumps(o.to_dict(), allow_nan=False)


def test_eager_pass_and_result_rows():
    ex = run_case(case("torch.add", T([4, 128], "float16"), T([4, 128], "float16")))
    v = judge(ex, rtol=1e-3, atol=1e-5)
    assert v.outcome == "passed" and v.compare_mode == "values" and v.max_abs_err == 0 and v.numel == 512
    assert ex.t_ref > 0 and ex.t_exec > 0 and ex.t_compile is None
    assert ex.reference["output"].device.type == "cpu" and ex.target["output"].dtype == torch.float16
    assert_jsonable(ex, v)


def test_judging_again_with_other_tolerances_does_not_rerun(monkeypatch):
    load_custom_ops()
    ex = run_case(case("torch.mul", T([64]), {"value": 3.0}), backend="casedb_test_perturb")

    def no_calls(*a, **k):
        raise AssertionError("judge ran the op")

    monkeypatch.setattr("casedb.run.execute._call", no_calls)
    strict = judge(ex, rtol=1e-6, atol=1e-6)
    loose = judge(ex, rtol=0.05, atol=0.05)
    assert strict.outcome == "failed" and loose.outcome == "passed"
    assert strict.max_abs_err == loose.max_abs_err and strict.mismatch_count == 64 and loose.mismatch_count == 0


def test_deliberate_mismatch_metrics():
    ops = load_custom_ops()
    ex = run_case(case("torch.nn.functional.silu", T([8, 16])), backend=ops.PERTURB_BACKEND)
    v = judge(ex, rtol=1e-5, atol=1e-5)
    ref = ex.reference["output"]
    expected = ops.perturb(ref)
    assert v.outcome == "failed" and v.mismatch_count == ref.numel() == v.numel == 128
    assert v.max_abs_err == pytest.approx(float((expected - ref).abs().max()), rel=1e-5)
    rel = (expected - ref).abs() / ref.abs()
    assert v.max_rel_err == pytest.approx(float(rel[ref != 0].max()), rel=1e-4)
    assert not v.nan_inf_mismatch and "128 of 128 elements" in v.reason
    assert ex.t_compile is not None and ex.t_exec is not None
    assert_jsonable(ex, v)


def test_in_place_op_compares_the_written_argument():
    c = case("torch.Tensor.add_", T([3], init="arange"), {"value": 1.0})
    ex = run_case(c)
    assert ex.mutated == ["args[0]"] and ex.reference["args[0]"].tolist() == [1.0, 2.0, 3.0]
    assert judge(ex, rtol=0, atol=0).outcome == "passed"
    ex = run_case(c, backend="aot_eager", check_determinism=True)
    assert ex.target["args[0]"].tolist() == [1.0, 2.0, 3.0]  # each call got fresh inputs
    assert ex.deterministic is True and judge(ex, rtol=0, atol=0).outcome == "passed"
    ex = run_case(case("torch.setitem", T([2, 3], init="zeros"), {"py": "(Ellipsis, 0)"}, {"value": 5.0}),
                  backend="aot_eager")
    assert ex.reference["output"] is None and ex.target["args[0]"][:, 0].tolist() == [5.0, 5.0]
    assert judge(ex, rtol=0, atol=0).outcome == "passed"


def test_undeclared_write_is_detected(monkeypatch):
    def sneaky_fill(x, v):
        x.fill_(v)
        return x.sum()

    import casedb.cases.ops

    monkeypatch.setattr(torch, "casedb_sneaky_fill", sneaky_fill, raising=False)
    # a torch function the allow-list knows (casedb never calls an arbitrary function under torch)
    monkeypatch.setattr(casedb.cases.ops, "EXTRA_TORCH_FUNCTIONS", casedb.cases.ops.EXTRA_TORCH_FUNCTIONS | {"casedb_sneaky_fill"})
    casedb.cases.ops.op_info.cache_clear()
    ex = run_case(case("torch.casedb_sneaky_fill", T([4]), {"value": 2.0}))
    assert ex.mutated == ["args[0]"] and ex.target["args[0]"].tolist() == [2.0] * 4
    assert judge(ex, rtol=0, atol=0).outcome == "passed"


def test_random_output_is_compared_on_metadata():
    for op in ("torch.empty_like", "torch.rand_like", "torch.nn.functional.dropout"):
        ex = run_case(case(op, T([16, 8])))
        v = judge(ex, rtol=0, atol=0)
        assert ex.compare_mode == "metadata" and v.outcome == "passed" and "metadata only" in v.reason, op
    ex = run_case(case("torch.nn.functional.dropout", T([16, 8]), attrs={"training": False}))
    assert ex.compare_mode == "values"


def test_expected_errors():
    view = case("torch.view", T([2, 3, 8], "float16", preset="noncontig_slice", preset_args={"dim": 1, "step": 2}),
                {"value": [2, 24]})
    expects = {"type": "RuntimeError", "match": "view"}
    v = judge(run_case(view), rtol=0, atol=0, expects_error=expects)
    assert v.outcome == "xfailed" and v.error_type == "RuntimeError" and len(v.traceback) <= 2048
    v = judge(run_case(view, backend="aot_eager"), rtol=0, atol=0, expects_error=expects)
    assert v.outcome == "xfailed" and v.error_phase == "compile"  # dynamo wraps it; still a RuntimeError
    v = judge(run_case(view), rtol=0, atol=0, expects_error={"type": "TypeError"})
    assert v.outcome == "ref_error" and "expected TypeError" in v.reason  # the reference raised something else
    v = judge(run_case(view), rtol=0, atol=0, expects_error={"ref": expects, "cpu": {"type": "TypeError"}})
    assert v.outcome == "error" and "expected TypeError" in v.reason
    v = judge(run_case(view), rtol=0, atol=0)
    assert v.outcome == "ref_error" and "view size" in v.reason
    ok = case("torch.view", T([2, 3, 8]), {"value": [2, 24]})
    v = judge(run_case(ok), rtol=0, atol=0, expects_error=expects)
    assert v.outcome == "xpassed" and "did not raise" in v.reason
    split = {"ref": {"type": "RuntimeError", "match": "view"}, "cpu": {"type": "RuntimeError"}}
    assert judge(run_case(view), rtol=0, atol=0, expects_error=split).outcome == "xfailed"
    # only the reference is expected to fail: the target raising is an error
    v = judge(run_case(view), rtol=0, atol=0, expects_error={"ref": expects})
    assert v.outcome == "error"


def test_case_problems_are_ref_errors():
    v = judge(run_case(case("torch.not_an_op", T([2]))), rtol=0, atol=0)
    assert v.outcome == "ref_error" and v.error_phase == "resolve" and "did you mean" in v.error_message
    v = judge(run_case(case("torch.add", T([2], init="data", blob="00" * 32), T([2]))), rtol=0, atol=0)
    assert v.outcome == "ref_error" and v.error_phase == "materialize"
    v = judge(run_case(case("torch.neg", T([4], preset="transpose_view"))), rtol=0, atol=0)
    assert v.outcome == "ref_error" and "at least two dimensions" in v.error_message
    with pytest.raises(ValueError, match="unknown compile backend"):
        run_case(case("torch.add", T([2]), T([2])), backend="no_such_backend")
    check_backend("eager")


def test_blob_inputs():
    t = torch.tensor([1.0, -2.0, 3.5])
    raw = tensor_bytes(t)
    sha = hashlib.sha256(raw).hexdigest()
    ex = run_case(case("torch.abs", T([3], init="data", blob=sha)), load_blob={sha: raw}.__getitem__)
    assert ex.reference["output"].tolist() == [1.0, 2.0, 3.5] and judge(ex, rtol=0, atol=0).outcome == "passed"


def test_determinism(monkeypatch):
    calls = []

    def drifting(x):
        calls.append(1)
        return x + (1.0 if len(calls) > 2 else 0.0)  # reference, target #1 agree; target #2 drifts

    import casedb.cases.ops

    monkeypatch.setattr(torch, "casedb_drifting", drifting, raising=False)
    monkeypatch.setattr(casedb.cases.ops, "EXTRA_TORCH_FUNCTIONS", casedb.cases.ops.EXTRA_TORCH_FUNCTIONS | {"casedb_drifting"})
    casedb.cases.ops.op_info.cache_clear()
    c = case("torch.casedb_drifting", T([8]))
    ex = run_case(c, check_determinism=True)
    assert ex.deterministic is False and "differ" in ex.determinism_detail
    v = judge(ex, rtol=0, atol=0)
    assert v.outcome == "failed" and v.reason.startswith("nondeterministic")
    ex = run_case(case("torch.add", T([8]), T([8])), check_determinism=True)
    assert ex.deterministic is True and judge(ex, rtol=0, atol=0).outcome == "passed"


def test_upcast_reference():
    c = case("torch.matmul", T([32, 256], "float16"), T([256, 16], "float16"))
    ex = run_case(c, reference_dtype="float64")
    assert ex.reference_hi["output"].dtype == torch.float64 and ex.reference_dtype == "float64"
    v = judge(ex, rtol=1e-2, atol=1e-2)
    assert v.outcome == "passed" and v.max_abs_err == 0
    assert v.max_abs_err_hi > 0 and v.ref_max_abs_err_hi == v.max_abs_err_hi  # the target is the CPU here
    assert ex.t_ref_hi is not None
    assert_jsonable(ex, v)


def test_xfail_occurrence():
    ex = run_case(case("torch.add", T([2]), T([2])))
    assert judge(ex, rtol=0, atol=0, xfail="known bug").outcome == "xpassed"


def test_fresh_dynamo_state_per_case():
    # more distinct compiles than dynamo's recompile limit: none may be skipped or fall back
    limit = torch._dynamo.config.recompile_limit
    for n in range(1, limit + 3):
        ex = run_case(case("torch.neg", T([n])), backend="aot_eager")
        assert ex.target_error is None and ex.t_compile is not None
        assert judge(ex, rtol=0, atol=0).outcome == "passed"


@pytest.mark.slow
def test_custom_ops():
    load_custom_ops()
    ex = run_case(case("torch.ops.casedb_test.sleep", T([4]), {"value": 0.2}))
    assert ex.t_ref >= 0.2 and ex.t_exec >= 0.2 and judge(ex, rtol=0, atol=0).outcome == "passed"
    ex = run_case(case("torch.ops.casedb_test.wrong_on_device", T([4])))
    assert judge(ex, rtol=0, atol=0).outcome == "passed"  # right on the CPU
    code = (f"from casedb.run.target import import_module; import_module({str(DATA / 'custom_ops.py')!r}); "
            "from casedb.run.execute import run_case;"
            "run_case({'signature': '0' * 64, 'op': 'torch.ops.casedb_test.abort',"
            "'inputs': [{'tensor': {'shape': [2], 'dtype': 'float32', 'init': 'zeros'}}]})")
    out = subprocess.run([sys.executable, "-c", code], cwd=DATA.parents[1], capture_output=True, timeout=300)
    assert out.returncode < 0 or out.returncode == 134, out.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_wrong_values_on_a_device():
    load_custom_ops()
    ex = run_case(case("torch.ops.casedb_test.wrong_on_device", T([4])), device="cuda")
    v = judge(ex, rtol=0, atol=0)
    assert v.outcome == "failed" and v.max_abs_err == 1.0


@pytest.mark.slow
def test_inductor_cpu():
    ex = run_case(case("torch.nn.functional.softmax", T([4, 64]), attrs={"dim": -1}), backend="inductor",
                  check_determinism=True)
    v = judge(ex, rtol=1.3e-6, atol=1e-5)
    assert v.outcome == "passed", v.reason
    assert ex.t_compile > ex.t_exec and ex.deterministic is True
    ex = run_case(case("torch.Tensor.mul_", T([8, 8]), {"value": 0.5}), backend="inductor")
    v = judge(ex, rtol=1.3e-6, atol=1e-5)
    assert v.outcome == "passed", v.reason
    assert ex.mutated == ["args[0]"] and ex.t_compile is not None


def test_execution_is_a_plain_dataclass():
    ex = Execution(op="torch.add", signature=None, device="cpu", backend="eager")
    assert judge(ex, rtol=0, atol=0).outcome == "error"
    assert_jsonable(ex)


def test_constant_kind_measured_in_chunks_as_whole(monkeypatch):
    import casedb.judge.ulp as cmp
    from casedb.judge.execution import _constant_kind

    tol = (1.3e-6, 1e-5)
    tensors = {"zero": torch.full((5, 7), 1e-6), "constant": torch.full((5, 7), 3.0),
               None: torch.cat([torch.full((30,), 3.0), torch.tensor([3.5, 3.0, 3.0, 3.0, 3.0])]),
               "nan": torch.tensor([0.0] * 20 + [float("nan")])}
    for chunk in (1 << 24, 3):
        monkeypatch.setattr(cmp, "CHUNK", chunk)
        assert {k: _constant_kind(t, tol) for k, t in tensors.items()} == {
            "zero": "zero", "constant": "constant", None: None, "nan": None}
