"""The bias judge (casedb.judge.bias): one-sided rounding that every per-element judge passes."""

import json

import pytest
import torch

from casedb.judge import bias
from casedb.mutation.mutants import truncate
from tests.helpers import rows


def _values(n=4096, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype)


def test_a_biased_and_an_unbiased_sample_of_the_same_spread():
    hi = _values()  # float32: the high-precision reference of a bf16 output
    nearest = hi.to(torch.bfloat16)
    toward_zero = truncate(hi, torch.bfloat16)
    up = torch.where(nearest.float() < hi, torch.nextafter(nearest, torch.full_like(nearest, float("inf"))), nearest)

    def spread(t, toward):  # errors in ULPs of bf16 at each element (toward hi's magnitude, or signed)
        ulp = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(hi.abs().double())))
        e = (t.double() - hi.double()) / ulp
        return float((e * hi.sign() if toward else e).std())

    # the same spread (uniform over one ULP, sigma ~0.29): only the mean tells them apart
    assert spread(toward_zero, True) == pytest.approx(spread(nearest, True), rel=0.1)
    assert spread(up, False) == pytest.approx(spread(nearest, False), rel=0.1)

    ok = bias.measure(nearest, nearest, hi)
    assert (ok.biased, ok.direction, ok.count) == (False, None, 4096)
    assert abs(ok.mean) < 0.05 and abs(ok.toward) < 0.05 and ok.threshold == bias.FLOOR

    # round toward zero: -0.5 ULP toward the magnitude, its plain mean near 0 (data of both signs)
    b = bias.measure(nearest, toward_zero, hi)
    assert (b.biased, b.direction, b.count) == (True, "toward magnitude", 4096)
    assert b.toward == pytest.approx(-0.5, abs=0.05) and abs(b.mean) < 0.05
    assert (b.ref_toward, b.ref_mean) == (pytest.approx(ok.toward), pytest.approx(ok.mean))

    # round toward +inf: +0.5 ULP signed, near 0 toward the magnitude: the other direction
    u = bias.measure(nearest, up, hi)
    assert (u.biased, u.direction) == (True, "signed")
    assert u.mean == pytest.approx(0.5, abs=0.05) and abs(u.toward) < 0.05


def test_a_reference_biased_the_same_way_excuses_the_target_and_small_samples_are_not_judged():
    hi = _values()
    toward_zero = truncate(hi, torch.bfloat16)
    same = bias.measure(toward_zero, toward_zero, hi)
    assert same.toward == pytest.approx(-0.5, abs=0.05) and not same.biased
    # a target correct where the reference is not: not the target's bias
    assert not bias.measure(toward_zero, hi.to(torch.bfloat16), hi).biased
    small = hi[:bias.MIN_COUNT - 1]
    assert bias.measure(small.to(torch.bfloat16), truncate(small, torch.bfloat16), small) is None
    assert bias.measure(small.to(torch.bfloat16), truncate(small, torch.bfloat16), torch.zeros_like(small)) is None


def test_rows_shifted_as_a_whole_are_few_draws_not_many():
    """A fused kernel rounds a per-row normalizer once: every element of a row moves the same way. Over
    4 rows that is 4 draws, not 4 x 1024: the spread of the row means sets the threshold."""
    g = torch.Generator().manual_seed(2)
    hi = torch.rand(4, 1024, generator=g) + 1  # [1, 2): one ULP is 2**-23 everywhere
    shift = torch.tensor([[3.0], [-1.0], [2.0], [0.0]]) * 2**-23   # whole ULPs per row, mean +1
    shifted = hi + shift
    b = bias.measure(hi, shifted, hi.double())
    assert b.toward == pytest.approx(1.0) and not b.biased and b.threshold > 1
    # the same target judged by its elements alone would be biased: 4096 draws of mean 1 and sigma 1.6
    assert 5 * 1.6 / 4096 ** 0.5 < 1.0
    assert bias.measure(hi, shifted - 2**-23 * (torch.rand(4, 1024, generator=g) < 0.5), hi.double()).biased is False
    exact = hi.double() + 2**-23 * torch.rand(4, 1024, generator=g, dtype=torch.float64)  # between float32s
    truncated = bias.measure(exact.float(), truncate(exact, torch.float32), exact)
    assert truncated.biased and truncated.toward == pytest.approx(-0.5, abs=0.05)


def _rows_sum(x: torch.Tensor, order: str) -> torch.Tensor:
    """Row sums of float32 ``x`` accumulated in float32 in another order, or (``truncated``) exactly over
    blocks of 64 with the float32 running sum truncated after each block."""
    if order == "reversed":
        acc = torch.zeros(x.shape[0])
        for j in reversed(range(x.shape[1])):
            acc = acc + x[:, j]
        return acc
    acc = torch.zeros(x.shape[0], dtype=torch.float64)
    for block in x.double().split(64, dim=1):
        acc = truncate(acc + block.sum(1), torch.float32).double()
    return acc.float()


def test_a_correct_accumulating_op_is_not_flagged_and_a_truncated_accumulator_is():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 1024, generator=g)
    ref = x.sum(1)                                   # the CPU reference: torch's own order
    hi = x.double().sum(1)
    # another order: errors of many ULPs where the terms cancel, both ways: a wide spread, no bias
    reordered = bias.measure(ref, _rows_sum(x, "reversed"), hi)
    assert not reordered.biased and reordered.threshold > 1
    truncated = bias.measure(ref, _rows_sum(x, "truncated"), hi)
    assert (truncated.biased, truncated.direction) == (True, "toward magnitude")
    assert truncated.toward < -truncated.threshold
    # terms of one sign: no cancellation, the drift toward zero is plain
    pos = x.abs()
    drift = bias.measure(pos.sum(1), _rows_sum(pos, "truncated"), pos.double().sum(1))
    assert drift.biased and drift.toward < -2 and drift.threshold < 0.5


BF16_ADD = {"op": "torch.add", "signature": "b1a5" * 16, "dtype": "bfloat16",
            "inputs": [{"tensor": {"shape": [64, 96]}}, {"tensor": {"shape": [64, 96]}}]}


def test_the_default_judge_fails_a_truncating_backend_that_every_per_element_judge_passes():
    from casedb.mutation import mutants  # noqa: F401  (registers the backends)
    from casedb.judge import numerics
    from casedb.judge.verdict import judge
    from casedb.run.execute import run_case

    # the bf16 default tolerance, as a run gives it (the policy's, which the ULP judge refines)
    tols = numerics.Policy().tolerances({"name": "add", "model": "m"}, BF16_ADD, ["bfloat16"])
    ex = run_case(BF16_ADD, backend="casedb_mutant_truncation", high_precision=True)
    assert ex.notes["mutant"]["changed"]
    assert judge(ex, tolerances=tols, judge="tolerance").outcome == "passed"
    assert judge(ex, tolerances=tols, judge="ulp").outcome == "failed"  # the ULP judge carries the bias judge too
    v = judge(ex, tolerances=tols, judge="both")
    assert (v.outcome, v.stage) == ("failed", "incorrect result")
    assert v.ulp_err <= 1.0  # each element within a ULP: only the mean gives it away
    assert v.reason.startswith("output: biased rounding: the mean error toward magnitude is -0.")
    assert v.bias_count == 64 * 96 and v.bias_toward < -0.2

    good = judge(run_case(BF16_ADD, backend="eager", high_precision=True), tolerances=tols, judge="both")
    assert good.outcome == "passed" and good.bias_count == 64 * 96 and abs(good.bias_toward) < 0.1


def test_a_run_stores_the_bias_of_each_result(cli, db_path, tmp_path):
    (tmp_path / "m.yaml").write_text("""\
model: biased
cases:
  - name: add
    op: torch.add
    inputs:
      - tensor: {shape: [64, 96], dtype: bf16}
      - tensor: {shape: [64, 96], dtype: bf16}
  - name: tiny
    op: torch.add
    inputs:
      - tensor: {shape: [4], dtype: bf16}
      - tensor: {shape: [4], dtype: bf16}
""")
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    res = cli("run", "--model", "biased", "--device", "cpu", "--backend", "casedb_mutant_truncation",
              "--import", "casedb.mutation.mutants", "-j", "0", "--json")
    assert res.exit_code == 1, res.output
    summary = json.loads(res.stdout)
    assert (summary["failed"], summary["bias"], summary["values"]) == (1, {"measured": 1, "biased": 1}, "random")
    got = rows(db_path, """SELECT mc.name, r.outcome, r.input_values, r.bias_count, r.bias_toward < -0.2 AS leans,
                                  r.bias_mean IS NOT NULL AS has_mean
                           FROM results r JOIN model_cases mc ON mc.signature = r.signature ORDER BY mc.name""")
    assert got == [
        {"name": "add", "outcome": "failed", "input_values": "random", "bias_count": 6144, "leans": 1, "has_mean": 1},
        {"name": "tiny", "outcome": "passed", "input_values": "random", "bias_count": None, "leans": None,
         "has_mean": 0}]


def test_errors_repeated_per_input_value_are_few_draws_not_many():
    """An H100's softmax of bf16 logits shifted by 96.7 (the extremal variant): 16 distinct inputs,
    each exp off by its own fixed amount, -0.155 ULP over 2 M elements. Equal inputs share their
    error: the spread of the per-value means sets the threshold. A truncation stays caught."""
    g = torch.Generator().manual_seed(5)
    values = torch.randint(0, 16, (64, 1024), generator=g).to(torch.float32) / 2  # 16 distinct inputs
    hi = (torch.rand(64, 1024, generator=g, dtype=torch.float64) + 1)  # [1, 2): one float32 ULP is 2**-23
    ref = hi.float()
    per_value = torch.tensor([-0.7, 0.6, -0.5, -0.4, 0.1, -0.6, -0.3, 0.0, -0.5, -0.4, 0.5, -0.3, -0.2, -0.4, 0.2, -0.4])
    assert per_value.mean() == pytest.approx(-0.206, abs=1e-3)
    step = (per_value[(values * 2).long()] * 2**-23).double()
    target = (hi + step).float()
    alone = bias.measure(ref, target, hi)
    assert alone.biased and alone.toward == pytest.approx(-0.206, abs=0.01)  # 65,536 draws by the elements alone
    grouped = bias.measure(ref, target, hi, values=values.reshape(-1))
    assert not grouped.biased and grouped.threshold > 0.15
    truncated = bias.measure(ref, truncate(hi, torch.float32), hi, values=values.reshape(-1))
    assert truncated.biased and truncated.toward == pytest.approx(-0.5, abs=0.05)


def test_a_value_weighs_by_its_share_of_the_elements():
    """Softmax logits near their row's maximum: two values hold 95 % of the elements and 38
    others the rest. The mean error is the two common values' errors, two draws however many
    rare values there are; the rare ones must not shrink the threshold. A truncation stays caught."""
    g = torch.Generator().manual_seed(7)
    n = 65536
    u = torch.rand(n, generator=g)
    rare = 2 + torch.randint(0, 38, (n,), generator=g)
    idx = torch.where(u < 0.5, 0, torch.where(u < 0.95, 1, rare))
    values = idx.to(torch.float32) / 2
    hi = torch.rand(n, generator=g, dtype=torch.float64) + 1  # [1, 2): one float32 ULP is 2**-23
    ref = hi.float()
    per_value = torch.cat([torch.tensor([-0.6, 0.0]), torch.rand(38, generator=g) * 0.2 - 0.1])
    target = (hi + (per_value[idx] * 2**-23).double()).float()
    b = bias.measure(ref, target, hi, values=values)
    assert b.toward == pytest.approx(-0.3, abs=0.02)
    assert not b.biased and b.threshold > 0.5  # unweighted, 40 values as 40 draws: 0.15, and biased
    truncated = bias.measure(ref, truncate(hi, torch.float32), hi, values=values)
    assert truncated.biased and truncated.toward == pytest.approx(-0.5, abs=0.05)


def test_values_of_takes_the_input_shaped_as_the_output():
    x, w = torch.arange(12.0).reshape(3, 4), torch.ones(4)
    assert torch.equal(bias.values_of((w, x), {}, torch.zeros(3, 4)), x.reshape(-1))
    assert bias.values_of((x,), {}, torch.zeros(3)) is None
    assert bias.values_of((torch.arange(12).reshape(3, 4),), {}, torch.zeros(3, 4)) is None  # integers
