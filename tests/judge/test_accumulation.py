"""What a correct GPU does differently from the CPU and must not fail on (casedb.judge.accumulation,
casedb.judge.ties), measured on an H100: each target here is built on the CPU the way the GPU
computes, next to a wrong one that must still fail."""

import pytest
import torch

from casedb.judge import accumulation, ties
from casedb.judge.compare import compare
from casedb.judge.numerics import Policy
from casedb.judge.verdict import judge
from casedb.run.execute import run_case
from casedb.cases.materialize import materialize


def case(op, *inputs, **attrs):
    return {"op": op, "inputs": list(inputs), "attrs": attrs, "signature": "0" * 64, "seed": 11}


def T(shape, dtype="float32", init="randn", **init_args):
    spec = {"shape": shape, "dtype": dtype, "init": init}
    if init_args:
        spec["init_args"] = init_args
    return {"tensor": spec}


def verdict(c, ex, target):
    ex.target = {**ex.target, "output": target}
    for key in ex.mutated:
        ex.target[key] = target
    ex._cache.clear()
    occ = {"model": "m", "name": "c", "defaults": {}}
    return judge(ex, tolerances=Policy().tolerances(occ, c, ex.dtypes()), judge="both")


def measured(c, hi=True):
    ex = run_case(c, high_precision=hi)
    assert ex.ref_error is None and (ex.reference_hi is not None or not hi)
    return ex, materialize(c, "cpu")[0]


def reversed_ties(values, idx):
    """A valid unstable order: the indices of equal values descending (what CUDA's sort gives
    instead of the CPU's ascending ones)."""
    n = idx.shape[-1]
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[1:] = values[1:] != values[:-1]
    run = torch.cumsum(starts.to(torch.int64), 0)
    key = torch.sort(run * n + (n - 1 - idx)).values
    return n - 1 - (key - run * n)


def unstable_sort(gm, example_inputs):
    """A dynamo backend whose sort puts equal values' indices in descending order."""
    def run(*args):
        values, idx = gm(*args)
        return values, reversed_ties(values, idx)
    return run


def test_sort_indices_of_equal_values_in_another_order_pass_and_wrong_ones_fail():
    c = case("torch.sort", T([2560], "int64", "randint", low=0, high=72))
    ex = run_case(c, backend=unstable_sort)
    assert ex.target_error is None
    assert verdict(c, ex, ex.target["output"]).outcome == "passed"
    x = materialize(c, "cpu")[0][0]
    values, idx = torch.sort(x, stable=True)
    other = reversed_ties(values, idx)
    assert not torch.equal(other, idx) and torch.equal(x[other], values)  # valid: it selects the sorted values
    repeated = other.clone()
    repeated[1] = repeated[0]             # an index twice (one missing): selects the same values
    assert torch.equal(x[repeated], values)
    v = verdict(c, ex, ties.canonical("torch.sort", (values, repeated), (x,), {}))
    assert (v.outcome, v.where) == ("failed", "output[1]")
    wrong = other.clone()
    wrong[[0, -1]] = wrong[[-1, 0]]       # selects other values
    assert verdict(c, ex, ties.canonical("torch.sort", (values, wrong), (x,), {})).outcome == "failed"


def test_ties_canonical_covers_argsort_topk_and_dims_and_leaves_stable_sorts_alone():
    x = torch.tensor([[3, 1, 3, 1, 2], [5, 5, 5, 0, 0]])
    ref = ties.canonical("torch.argsort", torch.argsort(x, dim=1, stable=True), (x, 1), {})
    assert ref.tolist() == [[1, 3, 4, 0, 2], [3, 4, 0, 1, 2]]
    flipped = torch.tensor([[3, 1, 4, 2, 0], [4, 3, 2, 1, 0]])
    assert torch.equal(ties.canonical("torch.argsort", flipped, (x, 1), {}), ref)
    # dim 0, through a Tensor method's values/indices pair
    y = x.t().contiguous()
    out = ties.canonical("torch.Tensor.sort", torch.sort(y, dim=0, stable=True), (y, 0), {})
    assert torch.equal(ties.canonical("torch.Tensor.sort", (out.values, flipped.t()), (y, 0), {})[1], out.indices)
    top = torch.topk(torch.tensor([1.0, 7.0, 7.0, 2.0]), 2)
    assert ties.canonical("torch.topk", top, (torch.tensor([1.0, 7.0, 7.0, 2.0]), 2), {}).indices.tolist() == [1, 2]
    # asked for a stable sort: its order is part of the result
    assert torch.equal(ties.canonical("torch.sort", (x, flipped), (x,), {"stable": True, "dim": 1})[1], flipped)


def atomic_index_add(x, index, src, seed=0):
    """index_add as GPU atomics do it: every add rounded to the output dtype, in any order."""
    out = x.clone()
    order = torch.randperm(index.numel(), generator=torch.Generator().manual_seed(seed))
    for j in order.tolist():
        out[index[j]] = (out[index[j]].float() + src[j].float()).to(out.dtype)
    return out


def test_bf16_index_add_in_another_order_passes_and_a_lost_add_fails():
    c = case("torch.Tensor.index_add", T([64, 256], "bfloat16"), {"value": 0},
             T([640], "int64", "randint", low=0, high=64), T([640, 256], "bfloat16"))
    ex, (x, _, index, src) = measured(c)
    assert accumulation.terms("torch.Tensor.index_add", (x, 0, index, src), {}, x) > 10
    gpu = atomic_index_add(x, index, src)
    assert not compare(ex.reference["output"], gpu, rtol=1.6e-2, atol=1e-5).passed  # a per-element tolerance fails it
    assert verdict(c, ex, gpu).outcome == "passed"
    lost = gpu.clone()
    lost[index[0]] = (lost[index[0]].float() - src[0].float()).to(lost.dtype)
    assert verdict(c, ex, lost).outcome == "failed"


def test_an_in_place_index_add_gets_its_scale_from_inputs_it_has_not_written():
    c = case("torch.Tensor.index_add_", T([16, 64], "bfloat16"), {"value": 0},
             T([96], "int64", "randint", low=0, high=16), T([96, 64], "bfloat16"))
    ex, (x, _, index, src) = measured(c)
    assert ex.mutated == ["args[0]"] and set(ex.reference_mag) == {"output", "args[0]"}
    expected = x.float().abs().index_add(0, index, src.float().abs()) * accumulation.terms(
        "torch.Tensor.index_add_", (x, 0, index, src), {}, x) ** 0.5
    assert torch.allclose(ex.reference_mag["output"].float(), expected)
    assert verdict(c, ex, atomic_index_add(x, index, src, seed=3)).outcome == "passed"


def test_a_float32_cumsum_as_a_blocked_scan_passes_and_a_scaled_one_fails():
    c = case("torch.cumsum", T([64, 256]), dim=1)
    ex, (x,) = measured(c)
    # a GPU scan: sums of blocks of 32, then the blocks' running totals added to each
    blocks = x.view(64, 8, 32)
    within = blocks.cumsum(-1)
    carried = torch.cat([torch.zeros(64, 1), within[..., -1][:, :-1].cumsum(-1)], dim=1)
    gpu = (within + carried.unsqueeze(-1)).view(64, 256)
    assert not torch.equal(gpu, ex.reference["output"])
    assert verdict(c, ex, gpu).outcome == "passed"
    assert verdict(c, ex, gpu * 1.001).outcome == "failed"


def test_softmax_with_another_normaliser_order_passes_and_an_unnormalised_one_fails():
    c = case("torch.nn.functional.softmax", T([32, 320], "bfloat16"), dim=-1, dtype="torch.float32")
    ex, (x,) = measured(c)
    e = torch.exp(x.float() - x.float().amax(-1, keepdim=True))
    pairwise = e.view(32, 10, 32).sum(-1).sum(-1, keepdim=True)  # a tree of partial sums
    gpu = e / pairwise
    assert verdict(c, ex, gpu).outcome == "passed"
    assert verdict(c, ex, e / (pairwise * 1.0001)).outcome == "failed"


@pytest.mark.slow
def test_a_conv_whose_bias_is_added_after_rounding_passes_and_a_lost_bias_fails():
    c = case("torch.nn.functional.conv1d", T([1, 512, 64], "bfloat16"), T([512, 1, 4], "bfloat16"),
             T([512], "bfloat16"), padding=3, groups=512)
    ex, (x, w, b) = measured(c)
    product = torch.nn.functional.conv1d(x.float(), w.float(), None, padding=3, groups=512).to(torch.bfloat16)
    gpu = (product.float() + b.float().view(1, -1, 1)).to(torch.bfloat16)  # inductor's conv + bias
    assert verdict(c, ex, gpu).outcome == "passed"
    assert verdict(c, ex, product).outcome == "failed"


@pytest.mark.parametrize("op, n", [("torch.matmul", 96), ("torch.nn.functional.softmax", 320), ("torch.neg", None)])
def test_terms_and_kind(op, n):
    x = torch.ones(4, 320 if "softmax" in op else 96)
    args = (x, torch.ones(96, 8)) if op == "torch.matmul" else (x, -1) if "softmax" in op else (x,)
    assert accumulation.kind(op) == {"torch.matmul": "float32", "torch.nn.functional.softmax": "normalize"}.get(op)
    if n is not None:
        assert accumulation.terms(op, args, {}, None) == n


def test_a_kernel_the_cpu_lacks_is_judged_against_the_call_on_widened_inputs():
    # CUDA counts int32 expert ids with histc; the CPU has no int histc (granite4h's MoE code
    # converts to float on the CPU): the target is judged against the float64 call
    c = case("torch.histc", T([2560], "int32", "randint", low=0, high=72), bins=72, min=0, max=71)
    spec = {"ref": {"type": "RuntimeError", "match": "histogram_cpu"}}
    ex = run_case(c, high_precision=True)
    assert ex.ref_error is not None and ex.reference_dtype == "float64"
    x = materialize(c, "cpu")[0][0]
    counts = torch.histc(x.double(), bins=72, min=0, max=71)
    assert torch.equal(ex.reference_hi["output"], counts)
    ex.target, ex.target_error = {"output": counts.to(torch.int32)}, None
    occ = {"model": "m", "name": "c", "defaults": {}}
    tols = Policy().tolerances(occ, c, ["int32"])
    assert judge(ex, tolerances=tols, expects_error=spec).outcome == "passed"
    wrong = counts.to(torch.int32)
    wrong[:2] = wrong[:2].flip(0) + torch.tensor([1, 0], dtype=torch.int32)
    ex.target = {"output": wrong}
    ex._cache.clear()
    assert judge(ex, tolerances=tols, expects_error=spec).outcome == "failed"
    # without the high-precision reference (the tolerance judge) nothing to compare: a ref error, as before
    assert run_case(c).reference_hi is None


def test_gpt_oss_topk_of_tied_bf16_logits_may_take_any_tied_expert():
    # bf16 router logits tie often; at the k-th place CUDA took other experts than the CPU (1 % of
    # gpt-oss's indices): any distinct indices that select the top values are right
    x = torch.tensor([[0.5, 2.0, 1.0, 2.0, 1.0, 1.0]], dtype=torch.bfloat16)
    cpu = ties.canonical("torch.topk", torch.topk(x, 3), (x, 3), {})
    assert cpu.indices.tolist() == [[1, 3, 2]]
    gpu = torch.return_types.topk((cpu.values, torch.tensor([[3, 1, 5]])))
    assert torch.equal(ties.canonical("torch.topk", gpu, (x, 3), {}).indices, cpu.indices)
    for wrong in ([[3, 1, 0]], [[1, 1, 5]]):  # selects 0.5 where the value says 1.0; a repeat
        bad = torch.return_types.topk((cpu.values, torch.tensor(wrong)))
        assert not torch.equal(ties.canonical("torch.topk", bad, (x, 3), {}).indices, cpu.indices)
    smallest = ties.canonical("torch.topk", (torch.tensor([[0.5, 1.0]], dtype=torch.bfloat16), torch.tensor([[0, 5]])),
                              (x, 2), {"largest": False})
    assert smallest[1].tolist() == [[0, 2]]


@pytest.mark.slow
def test_a_sum_too_large_to_upcast_is_judged_at_its_terms_magnitude(monkeypatch):
    # inductor's CUDA sum of granite4h's 268 M float32 values (2 GiB in float64: no upcast
    # reference) was 443 elements over rtol at cancelled results, a summation order
    from casedb.judge import numerics
    monkeypatch.setattr(numerics, "HI_REFERENCE_BYTES", 1024)
    c = case("torch.Tensor.sum", T([64, 512]), {"value": -1})
    ex = run_case(c, high_precision=True)
    x = materialize(c, "cpu")[0][0]
    assert ex.reference_hi is None and "high_precision" in ex.notes
    terms = x.abs().sum(-1)
    assert torch.allclose(ex.reference_mag["output"], terms * accumulation.growth(512))
    pairwise = x.view(64, 16, 32).sum(-1).sum(-1)
    assert verdict(c, ex, pairwise + terms * 2.0 ** -22).outcome == "passed"  # ~ 4 ULPs of the terms'
    assert verdict(c, ex, pairwise * 1.001).outcome == "failed"


def test_a_mean_times_the_rounded_reciprocal_passes_and_another_factor_fails():
    """CUDA's mean is the float32 sum times fl(1/n): over 100 to 512 means of 2,880 one-signed float32
    terms an H100 was +0.33 to +0.41 ULP biased, every element scaled by fl(1/2880) * 2880 = 1 + 2.4e-8."""
    c = case("torch.Tensor.mean", T([1, 512, 2880], init="uniform", low=1.5e9, high=6.6e9), {"value": -1}, keepdim=True)
    ex, (x, _) = measured(c)
    assert ex.bias_factor == pytest.approx(1 + 2.42e-8, abs=1e-10)
    n = x.shape[-1]
    total = x.double().sum(-1, keepdim=True).float()  # a float32 tree sum, nearly exact here
    gpu = total * torch.tensor(1.0 / n, dtype=torch.float32)
    assert verdict(c, ex, gpu).outcome == "passed"
    assert verdict(c, ex, gpu * (1 + 2**-21)).outcome == "failed"  # a factor the reciprocal cannot give
    ex.bias_factor = None
    without = verdict(c, ex, gpu)
    assert without.outcome == "failed" and "biased rounding" in without.reason


def test_a_layer_norm_whose_terms_cancel_passes_at_their_magnitude_and_a_bf16_product_fails():
    """Extremal values (one-signed around 4.3e9 for x, weight and bias): w * x_hat and b cancel to 1e5,
    and a correct GPU, whose mean and rstd differ from the CPU's in their last float32 bits, is off
    by thousands there (an H100: 7 bf16 layer_norms failed by tolerance)."""
    big = dict(init="uniform", low=3.3e9, high=5.3e9)
    c = case("torch.nn.functional.layer_norm", T([34, 3, 1024], "bfloat16", **big), {"value": [1024]},
             T([1024], "bfloat16", init="uniform", low=-5e9, high=5e9), T([1024], "bfloat16", **big), {"value": 1e-12})
    ex, (x, _, w, b, _) = measured(c)
    xf = x.float()
    mean = xf.view(102, 32, 32).sum(-1).sum(-1).view(34, 3, 1) / 1024  # a tree, in float32
    var = ((xf - mean) ** 2).view(102, 32, 32).sum(-1).sum(-1).view(34, 3, 1) / 1024
    x_hat = (xf - mean) * torch.rsqrt(var + 1e-12)
    gpu = (x_hat * w.float() + b.float()).to(torch.bfloat16)
    assert ex.reference_mag is not None
    assert verdict(c, ex, gpu).outcome == "passed"
    ex.reference_mag = None
    assert verdict(c, ex, gpu).outcome == "failed"  # judged at the result's magnitude, it cancels
    ex, _ = measured(c)
    rounded = ((x_hat * w.float()).to(torch.bfloat16).float() + b.float()).to(torch.bfloat16)
    assert verdict(c, ex, rounded).outcome == "failed"  # the product rounded to bf16 before the bias


def test_a_cumsum_along_an_outer_dim_summed_sequentially_passes_and_a_scaled_one_fails():
    """CUDA scans an outer dim column by column, a float32 running total (the CPU: float64): over 256
    one-signed terms up to 14.8 ULPs of their magnitude (an H100, and this loop)."""
    c = case("torch.cumsum", T([256, 16384], init="uniform", low=3.7e9, high=4.9e9), dim=0)
    ex, (x,) = measured(c)
    acc, rows = torch.zeros(x.shape[1]), []
    for row in x:
        acc = acc + row
        rows.append(acc)
    gpu = torch.stack(rows)
    assert verdict(c, ex, gpu).outcome == "passed"
    assert verdict(c, ex, gpu * (1 + 2**-19)).outcome == "failed"


@pytest.fixture
def bf16_reduction():
    """torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction, restored after the test (a
    property of torch's cuBLAS module: monkeypatch cannot put it back)."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    yield matmul
    matmul.allow_bf16_reduced_precision_reduction = before


def test_a_cuda_bf16_matmul_failure_names_cublas_reduced_precision_setting(bf16_reduction):
    """An H100's bf16 lm_head was 22.7 ULPs off with PyTorch's default (cuBLAS may sum split-K
    partials in bf16) and passed with it off: a failure on CUDA says which setting was on."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    bf16_reduction.allow_bf16_reduced_precision_reduction = True
    flag = "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"
    assert accumulation.reduced_precision_reduction("torch.nn.functional.linear", cuda, torch.bfloat16) == flag
    assert accumulation.reduced_precision_reduction("torch.nn.functional.linear", cpu, torch.bfloat16) is None
    assert accumulation.reduced_precision_reduction("torch.nn.functional.linear", cuda, torch.float32) is None
    assert accumulation.reduced_precision_reduction("torch.add", cuda, torch.bfloat16) is None
    bf16_reduction.allow_bf16_reduced_precision_reduction = False
    assert accumulation.reduced_precision_reduction("torch.matmul", cuda, torch.bfloat16) is None

    c = case("torch.nn.functional.linear", T([4, 2048], "bfloat16"), T([256, 2048], "bfloat16"))
    ex, (x, w) = measured(c)
    ex.notes["reduced_precision_reduction"] = flag  # what the worker notes on such a CUDA call
    partials = torch.stack([torch.nn.functional.linear(p, q).to(torch.bfloat16)  # split-K partials in bf16
                            for p, q in zip(x.float().split(256, -1), w.float().split(256, -1))])
    summed = partials[0]
    for p in partials[1:]:
        summed = (summed.float() + p.float()).to(torch.bfloat16)
    v = verdict(c, ex, summed)
    assert v.outcome == "failed" and f"({flag} was True: cuBLAS may sum split-K partials" in v.reason
    ex.notes.clear()
    assert "cuBLAS" not in verdict(c, ex, summed).reason


@pytest.mark.slow
def test_inductors_cpu_layer_norm_of_extremal_values_passes():
    """A real inductor (CPU) layer_norm on the extremal variant of a SigLIP case: its mean and variance
    of 1,152 one-signed values around 4.3e9 are float32 sums taken lane by lane, 11 ULPs of the terms'
    magnitude off where w * x_hat and b cancel (the extremal control's one false alarm). Judged at
    log2 growth it failed; at a sequential sum's it passes, and a bf16-rounded result still fails."""
    from casedb.cases.value_ranges import variant

    random = {"op": "torch.nn.functional.layer_norm", "signature": "78a060630edc970a1a0d30bf15e168b2"
              "06c0073fa42dd97a5cfcb3988182c355", "seed": None,
              "inputs": [{"tensor": {"dtype": "bfloat16", "init": "randn", "preset": "strided", "shape": [5, 729, 1152],
                                     "preset_args": {"storage_offset": 0, "stride": [839808, 1, 729]}}},
                         {"value": [1152]}],
              "attrs": {"bias": {"tensor": {"dtype": "bfloat16", "init": "randn", "shape": [1152]}}, "eps": 1e-06,
                        "weight": {"tensor": {"dtype": "bfloat16", "init": "randn", "shape": [1152]}}}}
    c = variant(random, "extremal")
    ex = run_case(c, backend="inductor", high_precision=True)
    assert ex.ref_error is None and ex.target_error is None and ex.reference_mag is not None
    assert verdict(c, ex, ex.target["output"]).outcome == "passed"
    assert verdict(c, ex, (ex.target["output"].float() * (1 + 2**-7)).to(torch.bfloat16)).outcome == "failed"
