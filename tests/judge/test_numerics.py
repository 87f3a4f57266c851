"""The numerics policy (which tolerance, where from), the ULP judge, vacuous references and
proof that the target ran: each against a target that is wrong on purpose and a correct one."""

import pytest
import torch

from casedb.run import execute
from casedb.judge.compare import compare
from casedb.judge.verdict import judge
from casedb.run.execute import run_case
from casedb.cases.materialize import materialize
from casedb.judge.numerics import Policy, Rule, Tolerance
from casedb.judge.selectors import case_norms

SIG = "ab" * 32


def case(op, *inputs, dtype="bfloat16", **attrs):
    return {"op": op, "inputs": list(inputs), "attrs": attrs, "signature": SIG, "dtype": dtype, "seed": 7}


def T(shape, dtype="bfloat16", init="randn", **init_args):
    spec = {"shape": shape, "dtype": dtype, "init": init}
    if init_args:
        spec["init_args"] = init_args
    return {"tensor": spec}


def occ(rtol=None, atol=None, defaults=None, model="m", name="c"):
    """An occurrence: its own rtol/atol and its manifest's defaults."""
    return {"model": model, "name": name, "rtol": rtol, "atol": atol, "defaults": defaults or {}}


BF16_MANIFEST = {"dtype": "bfloat16", "rtol": 1.6e-2, "atol": 1e-2}


# ------------------------------------------------------------------------------- the policy

def test_precedence_case_then_rules_then_manifest_default_then_dtype_default():
    c = case("torch.rsqrt", T([4]))
    bf16_manifest = occ(defaults=BF16_MANIFEST)
    plain = Policy(device="cpu", backend="inductor")
    # the manifest default judges tensors of its own dtype only: never a float32 output
    assert plain.tolerance(bf16_manifest, c, "bfloat16") == Tolerance(1.6e-2, 1e-2, "the manifest default for bfloat16")
    assert plain.tolerance(bf16_manifest, c, "float32") == Tolerance(1.3e-6, 1e-5, "the float32 default")
    assert plain.tolerance(bf16_manifest, c, "int64") == Tolerance(0.0, 0.0, "exact (int64)")
    rules = [Rule(**kw, where=f"t.yaml[{i}]", order=i) for i, kw in enumerate([
        {"dtype": "float32", "rtol": 1e-5},                         # dtype
        {"backend": "inductor", "rtol": 2e-5, "atol": 2e-5},        # backend
        {"op": "torch.rsqrt", "rtol": 3e-5},                        # op
        {"op": "torch.rs*", "backend": "inductor", "rtol": 4e-5},   # backend + op pattern
        {"op": "torch.rsqrt", "backend": "inductor", "rtol": 5e-5},  # backend + op, exact
        {"op": "torch.rsqrt", "backend": "inductor", "rtol": 6e-5}])]  # later, equal
    policy = Policy(rules, device="cpu", backend="inductor")
    got = policy.tolerance(bf16_manifest, c, "float32")
    # rtol from the most specific rule (the later of two equal ones); atol: only the backend rule sets it
    assert (got.rtol, got.atol) == (6e-5, 2e-5)
    assert got.source == ("rtol: rule t.yaml[5] (op=torch.rsqrt, backend=inductor); "
                          "atol: rule t.yaml[1] (backend=inductor)")
    # another backend: the backend rules do not apply, the op rule does
    other = Policy(rules, device="cpu", backend="eager").tolerance(bf16_manifest, c, "float32")
    assert (other.rtol, other.atol) == (3e-5, 1e-5)
    # the case's own tolerance beats every rule
    assert policy.tolerance(occ(rtol=0.5, defaults=BF16_MANIFEST), c, "float32").rtol == 0.5
    assert policy.tolerance(occ(rtol=0.5), c, "float32").source.startswith("rtol: the case")


def test_rule_specificity_target_scoped_over_general_exact_over_wildcard():
    general = Rule(op="torch.add", rtol=1.0)
    scoped = Rule(op="torch.add", device="cuda*", rtol=2.0)
    wildcard = Rule(op="torch.*", device="cuda", rtol=3.0)
    assert scoped.specificity() > general.specificity()
    assert general.specificity() > wildcard.specificity()  # the case named exactly beats a pattern
    case = case_norms({"op": "x", "name": "y", "model": "m-1", "signature": "", "dtype": "float32"})
    assert Rule(model="M_1", rtol=1).selector.matches(case, {"device": "cpu", "backend": "b"})


# ------------------------------------------------------------------------------- the judges

def perturbed(monkeypatch, transform):
    """A backend that returns the graph's true result with one bug added."""
    def backend(gm, example_inputs):
        def run(*args):
            out = gm(*args)
            return type(out)(transform(y) for y in out) if isinstance(out, (tuple, list)) else transform(out)
        return run
    return backend


def test_a_tenth_of_a_percent_on_fp32_is_caught_by_every_judge():
    c = case("torch.nn.functional.silu", T([64, 256], "float32"), dtype="float32")
    ex = run_case(c, backend=perturbed(None, lambda y: y * 1.001), high_precision=True)
    tols = Policy().tolerances(occ(defaults=BF16_MANIFEST), c, ex.dtypes())
    for j in ("tolerance", "ulp", "both"):
        v = judge(ex, tolerances=tols, judge=j)
        assert v.outcome == "failed" and v.stage == "incorrect result", j


def test_sixteen_ulps_in_bf16_hidden_by_a_fixed_atol_are_caught_by_the_ulp_judge():
    def sixteen_ulps(y):
        return (y.double() + 16 * torch.finfo(torch.bfloat16).eps * y.double().abs()).to(y.dtype)

    c = case("torch.nn.functional.silu", T([64, 256], init="uniform", low=-0.05, high=0.05))
    ex = run_case(c, backend=perturbed(None, sixteen_ulps), high_precision=True)
    tols = Policy().tolerances(occ(defaults=BF16_MANIFEST), c, ex.dtypes())
    assert judge(ex, tolerances=tols, judge="tolerance").outcome == "passed"  # atol 1e-2 hides it
    v = judge(ex, tolerances=tols, judge="both")
    assert v.outcome == "failed" and "ULPs of bfloat16" in v.reason and v.ulp_err > 16
    assert v.tolerance == "the manifest default for bfloat16" and v.judge == "both"


def test_a_correct_compiled_target_passes_every_judge():
    c = case("torch.nn.functional.softmax", T([8, 512], "float32"), dtype="float32", dim=-1)
    ex = run_case(c, backend="aot_eager", high_precision=True)
    assert ex.reference_dtype == "float64"
    tols = Policy().tolerances(occ(), c, ex.dtypes())
    for j in ("tolerance", "ulp", "both"):
        assert judge(ex, tolerances=tols, judge=j).outcome == "passed", j


def test_an_explicit_tolerance_is_not_overruled_by_the_ulp_judge():
    c = case("torch.nn.functional.silu", T([64, 256], "float32"), dtype="float32")
    ex = run_case(c, backend=perturbed(None, lambda y: y * 1.001), high_precision=True)
    loose = Policy().tolerances(occ(rtol=0.01), c, ex.dtypes())
    v = judge(ex, tolerances=loose, judge="both")
    assert (v.outcome, v.judge) == ("passed", "tolerance")


# --------------------------------------------------------------------- what proves nothing

def test_a_reference_of_zeros_or_one_value_is_vacuous():
    negative = T([4, 64], "float32", init="uniform", low=-2.0, high=-1.0)
    ex = run_case(case("torch.relu", negative, dtype="float32"))
    assert judge(ex, rtol=0, atol=0).vacuous == "zero"
    ex = run_case(case("torch.clamp", negative, dtype="float32", min=3.0, max=3.0))
    assert judge(ex, rtol=0, atol=0).vacuous == "constant"
    # a within-tolerance zero counts: a near-zero reference cannot tell a target from zeros
    tiny = T([4, 64], "float32", init="uniform", low=-1e-7, high=1e-7)
    assert judge(run_case(case("torch.neg", tiny, dtype="float32")), rtol=0, atol=1e-5).vacuous == "zero"
    assert judge(run_case(case("torch.neg", T([4, 64], "float32"), dtype="float32")), rtol=0, atol=0).vacuous is None
    # an op whose output never depends on input values: expected, counted apart
    for c in (case("torch.zeros_like", T([4, 64], "float32"), dtype="float32"), case("torch.zeros", {"value": [2, 8]})):
        assert judge(run_case(c), rtol=0, atol=0).vacuous == "constant op"


def test_a_target_that_never_computed_the_op_is_not_exercised():
    # dynamo evaluates promote_types while tracing: the backend never gets a graph
    c = case("torch.promote_types", {"value": "torch.float16"}, {"value": "torch.float32"})
    ex = run_case(c, backend="aot_eager")
    v = judge(ex, rtol=0, atol=0)
    assert (v.outcome, v.stage, ex.backend_calls) == ("not_exercised", "not exercised", 0)
    # eager on the CPU computes it: exercised
    assert judge(run_case(c), rtol=0, atol=0).outcome == "passed"
    # an output left off the target device
    ex = execute.Execution(op="x", signature=None, device="meta", backend="eager")
    execute._check_exercised(ex, None, torch.ones(2), torch.device("meta"))
    assert not ex.exercised and "not on the target device meta" in ex.not_exercised
    # CPU bookkeeping beside a device result (flash attention's RNG state) is not a miss
    ex = execute.Execution(op="x", signature=None, device="meta", backend="eager")
    execute._check_exercised(ex, None, (torch.ones(2, device="meta"), torch.ones(2)), torch.device("meta"))
    assert ex.exercised


def test_inductor_lowering_is_recorded():
    ex = run_case(case("torch.nn.functional.linear", T([8, 64], "float32"), T([32, 64], "float32"), dtype="float32"),
                  backend="inductor")
    assert ex.lowering["kind"] == "extern" and ex.lowering["extern"] == ["mm"]
    ex = run_case(case("torch.relu", T([8, 64], "float32"), dtype="float32"), backend="inductor")
    assert ex.lowering["kind"] == "generated" and ex.lowering["kernels"] >= 1


@pytest.mark.parametrize("broken, stage", [("trace", "compile: dynamo trace"), ("backend", "compile: backend compiler"),
                                           ("runtime", "runtime")])
def test_failure_stages_of_a_compiled_target(broken, stage):
    def backend(gm, example_inputs):
        if broken == "backend":
            raise RuntimeError("the backend compiler gave up")

        def run(*args):
            raise RuntimeError("the kernel faulted")
        return run if broken == "runtime" else gm

    c = case("torch.relu", T([4], "float32"), dtype="float32")
    if broken == "trace":
        c = case("torch.Tensor.tolist", T([4], "float32"), dtype="float32")  # data-dependent: fullgraph refuses
    v = judge(run_case(c, backend=backend), rtol=0, atol=0)
    assert (v.outcome, v.stage) == ("error", stage)


def test_a_manifest_default_is_the_policys_guess_not_a_decision():
    c = case("torch.nn.functional.silu", T([64, 256]))
    # only rtol in the manifest default: atol comes from the dtype table, the ULP judge still runs
    rtol_only = Policy().tolerance(occ(defaults={"dtype": "bfloat16", "rtol": 0.05}), c, "bfloat16")
    assert rtol_only == Tolerance(0.05, 1e-5, "rtol: the manifest default for bfloat16; atol: the bfloat16 default")
    assert not rtol_only.explicit
    ex = run_case(c, backend=perturbed(None, lambda y: y * 1.02), high_precision=True)
    v = judge(ex, tolerances={"bfloat16": rtol_only}, judge="both")
    assert (v.outcome, v.judge) == ("failed", "both") and "ULPs of bfloat16" in v.reason
    # a default without a dtype is the RFC's float32 default: it judges float32 outputs only
    no_dtype = occ(defaults={"rtol": 1e-3, "atol": 1e-3})
    assert Policy().tolerance(no_dtype, c, "float32") == Tolerance(1e-3, 1e-3, "the manifest default for float32")
    assert Policy().tolerance(no_dtype, c, "bfloat16") == Tolerance(1.6e-2, 1e-5, "the bfloat16 default")


def test_the_upcast_reference_judges_at_the_outputs_tolerance_when_the_cpu_reference_raised():
    ref_hi = {"output": torch.linspace(-3, 3, 256, dtype=torch.float32)}
    rounded = {"output": ref_hi["output"].to(torch.bfloat16)}  # a correct bf16 target: rounding only
    ex = execute.Execution(op="torch.x", signature=None, device="cpu", backend="eager", reference_dtype="float32",
                           reference_hi=ref_hi, target=rounded,
                           ref_error=execute.ErrorInfo("reference", "RuntimeError", "not implemented for 'BFloat16'",
                                                       "", ("RuntimeError",)))
    spec = {"ref": {"type": "RuntimeError", "match": "not implemented"}}
    tols = {"bfloat16": Tolerance(1.6e-2, 1e-5, "the bfloat16 default")}
    v = judge(ex, tolerances=tols, expects_error=spec)
    assert v.outcome == "passed", v.reason
    ex.target = {"output": (ref_hi["output"] * 1.1).to(torch.bfloat16)}
    assert judge(ex, tolerances=tols, expects_error=spec).outcome == "failed"


def test_an_accumulating_op_is_measured_at_its_terms_magnitude():
    # a mean of centred data cancels: another summation order (inductor's on some CPUs: 12 ULPs off
    # at the result's magnitude where eager is 3) must not be a false alarm; under one ULP at the terms'
    c = case("torch.Tensor.mean", T([4, 2880], "float32"), {"value": -1}, dtype="float32")
    ex = run_case(c, backend="inductor", high_precision=True)
    ref, hi, mag = (r["output"] for r in (ex.reference, ex.reference_hi, ex.reference_mag))
    assert mag.shape == (4,) and bool((mag > 16 * hi.abs()).all())
    assert judge(ex, tolerances=Policy().tolerances(occ(), c, ex.dtypes()), judge="both").outcome == "passed"
    # one ULP of the terms' magnitude (what reordering a sum costs), built here rather than taken from
    # this CPU's kernel: > 16 ULPs at the cancelled result's magnitude (the bound there is 4: this
    # reference is the correctly rounded one), within the bound at the terms'
    exact = hi.float()
    reordered = (hi + mag * 2.0 ** -24).float()
    assert not compare(exact, reordered, mode="ulp", hi=hi).passed
    assert compare(exact, reordered, mode="ulp", hi=hi, hi_mag=mag).passed
    # a wrong target is still caught: 0.1 % of the result, or the sum accumulated in bf16
    assert not compare(ref, ref * 1.001, mode="ulp", hi=hi, hi_mag=mag).passed
    x = materialize(c, "cpu")[0][0]
    acc = torch.zeros(4, dtype=torch.bfloat16)
    for j in range(0, 2880, 64):  # partial sums rounded to bf16 at every step
        acc = (acc.float() + x[:, j:j + 64].sum(-1)).bfloat16()
    assert not compare(ref, acc.float() / 2880, mode="ulp", hi=hi, hi_mag=mag).passed
    # the reference on |inputs| is computed for accumulating ops only
    assert run_case(case("torch.neg", T([8], "float32"), dtype="float32"), high_precision=True).reference_mag is None
