"""casedb.judge.compare: structure, shape, dtype, then values (torch.testing's rule), metadata, bits."""

from __future__ import annotations

import json
import math

import pytest
import torch

from casedb.judge.compare import compare

nan, inf = math.nan, math.inf


def test_equal_tensors_pass_with_zero_errors():
    a = torch.randn(4, 5)
    c = compare(a, a.clone(), rtol=0, atol=0)
    assert c.passed and c.mode == "values" and c.max_abs_err == 0 and c.mismatch_count == 0 and c.numel == 20
    json.dumps(c.to_dict())


def test_tolerance_rule_and_metrics():
    ref = torch.tensor([1.0, 2.0, -4.0, 0.0], dtype=torch.float64)
    # |a - b| <= atol + rtol * |b| with atol 0.1, rtol 0.1: allowed 0.2, 0.3, 0.5, 0.1
    ok = ref + torch.tensor([0.2, -0.3, 0.5, 0.1], dtype=torch.float64)
    c = compare(ref, ok, rtol=0.1, atol=0.1)
    assert c.passed, c.reason
    bad = ref + torch.tensor([0.25, 0.0, -0.6, 0.0], dtype=torch.float64)
    c = compare(ref, bad, rtol=0.1, atol=0.1)
    assert not c.passed and c.mismatch_count == 2 and c.numel == 4
    assert c.max_abs_err == pytest.approx(0.6) and c.max_rel_err == pytest.approx(0.25)
    assert "2 of 4 elements" in c.reason and not c.nan_inf_mismatch


def test_half_precision_is_compared_in_float32():
    ref = torch.tensor([1000.0], dtype=torch.float16)
    out = torch.tensor([1001.0], dtype=torch.float16)
    c = compare(ref, out, rtol=1e-3, atol=0)
    assert c.passed and c.max_abs_err == 1.0 and c.max_rel_err == pytest.approx(1e-3)


def test_nan_and_inf():
    ref = torch.tensor([nan, inf, -inf, 1.0])
    assert compare(ref, ref.clone(), rtol=0, atol=0).passed
    c = compare(ref, torch.tensor([nan, inf, inf, 1.0]), rtol=0, atol=0)
    assert not c.passed and c.nan_inf_mismatch and c.mismatch_count == 1 and c.max_abs_err == 0.0
    c = compare(ref, torch.tensor([0.0, inf, -inf, 1.0]), rtol=1, atol=1)
    assert not c.passed and c.nan_inf_mismatch and c.mismatch_count == 1
    c = compare(torch.tensor([1.0]), torch.tensor([nan]), rtol=0, atol=0)
    assert not c.passed and c.nan_inf_mismatch


def test_where_only_the_reference_has_nan_inf_wrong_the_high_precision_reference_decides():
    # x86's bfloat16 gelu: NaN at inf and inf at 3.3e38, where float64 gives inf and 3.2965e38
    hi = torch.tensor([inf, 3.2965e38, nan, 0.5, 2.0], dtype=torch.float64)
    ref = torch.tensor([nan, inf, nan, 0.5, 2.0], dtype=torch.bfloat16)
    right = hi.to(torch.bfloat16)
    tol = {"rtol": 1.6e-2, "atol": 1e-5}
    for kw in (tol, {"mode": "ulp", **tol}):
        c = compare(ref, right, hi=hi, **kw)
        assert (c.passed, c.ref_faults, c.nan_inf_mismatch, c.mismatch_count) == (True, 2, False, 0), c.reason
        # where the target is wrong too, or NaN where both references are finite, it is the target's fault
        wrong = torch.tensor([-inf, 1e38, nan, nan, 2.0], dtype=torch.bfloat16)
        c = compare(ref, wrong, hi=hi, **kw)
        assert (c.passed, c.ref_faults, c.nan_inf_mismatch, c.mismatch_count) == (False, 0, True, 3), c.reason
    # without the upcast reference, the CPU reference is believed
    c = compare(ref, right, **tol)
    assert (c.passed, c.ref_faults, c.nan_inf_mismatch, c.mismatch_count) == (False, 0, True, 2)


def test_an_overflow_in_the_output_dtype_is_right_and_saturating_is_not():
    hi = torch.tensor([1e39, 1.0], dtype=torch.float64)  # beyond bfloat16: rounds to inf there
    ref = torch.tensor([3.3e38, 1.0], dtype=torch.bfloat16)  # a reference that saturates
    c = compare(ref, torch.tensor([inf, 1.0], dtype=torch.bfloat16), hi=hi, rtol=1.6e-2, atol=1e-5)
    assert (c.passed, c.ref_faults) == (True, 1)
    c = compare(torch.tensor([inf, 1.0], dtype=torch.bfloat16), ref, hi=hi, rtol=1.6e-2, atol=1e-5)
    assert (c.passed, c.ref_faults, c.nan_inf_mismatch) == (False, 0, True)


def test_integers_and_bools_are_exact():
    c = compare(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]), rtol=1, atol=10)
    assert not c.passed and c.mismatch_count == 1 and c.max_abs_err == 1.0 and "exact" in c.reason
    c = compare(torch.tensor([True, False]), torch.tensor([True, True]), rtol=1, atol=1)
    assert not c.passed and c.mismatch_count == 1


def test_shape_and_dtype():
    c = compare(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not c.passed and "shape [3, 2] but reference [2, 3]" in c.reason
    c = compare(torch.zeros(2), torch.zeros(2, dtype=torch.float16))
    assert not c.passed and "dtype float16 but reference float32" in c.reason
    assert compare(torch.zeros(2), torch.zeros(2, dtype=torch.float16), check_dtype=False).passed


def test_structures():
    t = torch.ones(2)
    assert compare((t, [t, None], {"a": 3}), [t, (t, None), {"a": 3}]).passed
    c = compare((t, t), (t,))
    assert not c.passed and "2 items" in c.reason
    c = compare({"output": (t, t)}, {"output": (t, t + 1)}, rtol=0, atol=0)
    assert not c.passed and c.where == "output[1]" and c.reason.startswith("output[1]:")
    c = compare(None, t)
    assert not c.passed and "reference is NoneType" in c.reason
    c = compare({"output": t}, {"output": t, "args[0]": t})
    assert not c.passed and "keys differ" in c.reason
    assert compare(torch.Size([2, 3]), torch.Size([2, 3])).passed
    assert compare(torch.device("cpu"), torch.device("meta")).passed
    assert not compare("a", "b").passed


def test_python_scalars():
    assert compare(1.0, 1.0005, rtol=1e-3, atol=0).passed
    c = compare(1.0, 1.1, rtol=1e-3, atol=0)
    assert not c.passed and c.max_abs_err == pytest.approx(0.1)
    assert not compare(3, 4, rtol=1, atol=1).passed
    assert not compare(3, 3.0).passed and compare(3, 3.0, check_dtype=False).passed
    assert compare(nan, nan).passed and not compare(nan, 1.0).passed
    assert compare(True, True).passed and not compare(True, False).passed


def test_metadata_mode():
    a = torch.randn(3, 4)
    c = compare(a, torch.randn(3, 4), mode="metadata")
    assert c.passed and c.mode == "metadata" and "metadata only" in c.reason and c.max_abs_err is None
    c = compare(a, torch.randn(4, 3).t(), mode="metadata")
    assert not c.passed and "strides" in c.reason
    # strides of size-1 dimensions do not matter
    assert compare(torch.empty(1, 4), torch.empty(4, 1).t(), mode="metadata").passed
    assert not compare(a, a.half(), mode="metadata").passed


def test_complex_values():
    ref = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    c = compare(ref, ref + 0.5j, rtol=0, atol=0.1)
    assert not c.passed and c.max_abs_err == pytest.approx(0.5)
    assert compare(ref, ref + 0.05, rtol=0, atol=0.1).passed


def test_bits():
    a = torch.tensor([0.0, nan, 1.0])
    assert compare(a, a.clone(), mode="bits").passed
    c = compare(a, torch.tensor([-0.0, nan, 1.0]), mode="bits")
    assert not c.passed and c.mismatch_count == 1
    assert not compare(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7]), mode="bits").passed
    assert compare((torch.tensor([1, 2]), 3), (torch.tensor([1, 2]), 3), mode="bits").passed


def test_noncontiguous_and_empty():
    a = torch.randn(4, 6)
    assert compare(a.t(), a.t().contiguous(), rtol=0, atol=0).passed
    c = compare(torch.zeros(0, 3), torch.zeros(0, 3))
    assert c.passed and c.numel == 0


# ---------------------------------------------------------------- objects that are not tensors

class _Plain:
    """No __eq__ of its own: == would be identity."""


class _Valued:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _Valued) and self.v == other.v

    __hash__ = None


class _Raising:
    def __eq__(self, other):
        raise RuntimeError("no comparison")


def test_objects_without_value_equality_are_not_comparable_never_failed():
    enter = torch.amp.autocast_mode._UnmanagedAutocast
    for ref, out in [(enter("cpu", enabled=False), enter("cpu", enabled=False)), (torch.no_grad(), torch.no_grad()),
                     (_Plain(), _Plain()), (_Raising(), _Raising())]:
        c = compare({"output": ref}, {"output": out})
        assert (c.passed, c.comparable, c.opaque, c.numel, c.mismatch_count) == (True, False, ["output"], 0, 0), c
        assert c.reason.startswith(f"not comparable: output (a {type(ref).__module__}.{type(ref).__qualname__}")
        assert compare(ref, out, mode="bits").comparable is False  # nor nondeterministic
    c = compare({"output": _Plain()}, {"output": _Plain()})
    assert c.reason == (f"not comparable: output (a {__name__}._Plain, which has no value equality); "
                        "only their types were checked (they match)")
    c = compare({"output": _Raising()}, {"output": _Raising()})
    assert "whose == gives no answer" in c.reason


def test_devices_are_compared_by_type_only():
    c = compare({"output": torch.device("cpu")}, {"output": torch.device("meta")})
    assert c.passed and not c.comparable and c.opaque == ["output"] and "a device" in c.reason
    c = compare({"output": torch.device("cpu")}, {"output": "cpu"})
    assert not c.passed and c.comparable


def test_objects_with_value_equality_are_compared():
    c = compare({"output": torch.float16}, {"output": torch.float16})
    assert c.passed and c.comparable and c.opaque == []
    c = compare({"output": torch.bfloat16}, {"output": torch.float16})
    assert not c.passed and c.reason == "output: reference torch.bfloat16 != target torch.float16"
    assert compare(torch.channels_last, torch.channels_last).comparable
    assert compare(_Valued(1), _Valued(1)).passed and not compare(_Valued(1), _Valued(2)).passed
    assert compare("tanh", "tanh").comparable


def test_a_type_change_is_a_failure():
    c = compare({"output": _Plain()}, {"output": None})
    assert not c.passed and c.comparable and c.where == "output"
    assert c.reason.startswith("output: reference is _Plain")
    c = compare({"output": _Plain()}, {"output": _Valued(1)})
    assert not c.passed and "reference is _Plain" in c.reason


def test_opaque_parts_beside_tensors_leave_the_result_comparable():
    t = torch.ones(3)
    c = compare({"output": (t, _Plain())}, {"output": (t.clone(), _Plain())}, rtol=0, atol=0)
    assert (c.passed, c.comparable, c.opaque, c.numel) == (True, True, ["output[1]"], 3)
    assert c.reason == ("values match (rtol=0, atol=0); compared by type only: "
                        f"output[1] (a {__name__}._Plain, which has no value equality)")
    c = compare({"output": (t, _Plain())}, {"output": (t + 1, _Plain())}, rtol=0, atol=0)
    assert not c.passed and c.where == "output[0]"
    assert compare({"output": None}, {"output": None}).comparable  # an op that returns nothing: nothing differs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.complex64, torch.int32, torch.bool])
def test_measured_in_chunks_as_whole(monkeypatch, dtype):
    # a large output is measured CHUNK elements at a time (float64 temporaries of the whole took a
    # worker past its memory): every figure must be what one pass over the whole gives
    import casedb.judge.ulp as cmp

    g = torch.Generator().manual_seed(0)
    hi = (torch.randn(6, 50, generator=g, dtype=torch.float64) * torch.logspace(-3, 2, 50, dtype=torch.float64))
    if dtype == torch.bool:
        ref = hi > 0
        out = ref.clone()
        out[3, 7] = ~out[3, 7]
    elif dtype == torch.int32:
        ref = (hi * 100).to(dtype)
        out = ref.clone()
        out[5, 49] += 3
    else:
        ref = hi.to(dtype)
        out = (hi * (1 + 1e-3 * torch.rand(6, 50, generator=g, dtype=torch.float64))).to(dtype)
        out[0, 1], ref[0, 1] = math.nan, math.nan
        out[2, 3] = math.inf
        out = out.t().contiguous().t()  # non-contiguous: flattened in logical order on both sides
    kinds = [dict(rtol=1e-4, atol=1e-5)]
    if dtype.is_floating_point:
        kinds.append(dict(mode="ulp", hi=hi))
    for kw in kinds:
        whole = compare(ref, out, **kw).to_dict()
        monkeypatch.setattr(cmp, "CHUNK", 7)
        chunked = compare(ref, out, **kw).to_dict()
        monkeypatch.setattr(cmp, "CHUNK", 1 << 24)
        assert chunked == whole
        assert not whole["passed"] and whole["mismatch_count"] > 0


def test_ulp_judge_with_an_all_zero_high_precision_result_falls_back_to_tolerance():
    hi = torch.zeros(64)
    ref = torch.zeros(64, dtype=torch.bfloat16)
    residue = torch.full((64,), 1e-30, dtype=torch.bfloat16)  # a correct target's rounding residue
    c = compare(ref, residue, mode="ulp", hi=hi, rtol=1.6e-2, atol=1e-5)
    assert c.passed and c.ulp_err is None, c.reason
    c = compare(ref, torch.ones(64, dtype=torch.bfloat16), mode="ulp", hi=hi, rtol=1.6e-2, atol=1e-5)
    assert not c.passed and c.mismatch_count == 64
