"""casedb.judge.pattern: the few words that say what a wrong output looks like."""

from __future__ import annotations

import pytest
import torch

from casedb.judge.pattern import describe

REF = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) + 3  # no zeros, one sign


@pytest.mark.parametrize("wrong, said", [
    (torch.zeros_like(REF), "all zeros"),
    (REF.clone().index_fill_(1, torch.tensor([2]), float("nan")), "NaN or inf where the reference is finite"),
    (-REF, "sign flipped"),
    (REF * 0.5, "scaled by 0.5"),
    (REF * 1.005, "scaled by 1.005"),  # a softmax 0.5 % off: three digits would read "scaled by 1"
    (REF.clone().index_fill_(1, torch.tensor([5]), 0.0), "wrong only at index 5 of the last dim"),
    (REF.clone().index_fill_(0, torch.tensor([1]), 7.0), "wrong only at index 1 of dim 0"),
])
def test_a_wrong_output_is_named_by_its_pattern(wrong, said):
    assert describe(REF, wrong, rtol=1e-5, atol=1e-5) == said


def test_no_pattern_for_a_right_output_only_a_measure_for_scattered_noise():
    assert describe(REF, REF + 1e-7, rtol=1e-5, atol=1e-5) is None
    noise = REF + torch.randn(REF.shape, generator=torch.Generator().manual_seed(1))
    assert describe(REF, noise, rtol=1e-5, atol=1e-5).startswith("wrong at 100 % of elements (24 of 24)")


def test_the_part_of_an_execution_is_named_when_there_are_several():
    from casedb.judge.pattern import describe_output

    ref = {"output": (REF, REF), "arg0 (mutated)": REF}
    out = {"output": (REF, torch.zeros_like(REF)), "arg0 (mutated)": REF}
    assert describe_output(ref, out, rtol=1e-5, atol=1e-5) == "output[1]: all zeros"
    assert describe_output({"output": REF}, {"output": -REF}, rtol=1e-5, atol=1e-5) == "sign flipped"
