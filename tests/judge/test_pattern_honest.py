"""Issue 43 item 3: "scaled by k" only when the error is a scale; otherwise the pattern says what
it is (how many elements are wrong, by how many ULPs)."""

import torch

from casedb.judge.pattern import describe

G = torch.Generator().manual_seed(0)
REF = torch.randn(64, 45, generator=G) + 4  # no zeros, one sign


def test_outputs_each_a_little_off_are_not_called_a_scale():
    # every element 0.15 % to 0.45 % low, each by its own amount: ratios all within 1 % of their
    # median 0.997, which the old rule read as "scaled by 0.997"
    jitter = 0.003 * (0.5 + torch.rand(REF.shape, generator=G))
    said = describe(REF, REF * (1 - jitter), rtol=1e-5, atol=1e-5)
    assert "scaled" not in said
    assert said.startswith("wrong at 100 % of elements (2,880 of 2,880), off by up to ")
    assert said.endswith(" ULP")


def test_a_layout_misread_says_how_much_is_wrong():
    out = REF.clone()
    out[:, :3] = REF.t().reshape(REF.shape)[:, :3]  # 3 of 45 columns read through the wrong strides
    said = describe(REF, out, rtol=1e-5, atol=1e-5)
    assert said.startswith("wrong at 6.") and "of elements (" in said and "ULP" in said


def test_a_real_scale_is_still_named_even_under_rounding_noise():
    noisy = (REF * 0.99).to(torch.float16).to(torch.float32)  # a scale, then fp16 rounding
    assert describe(REF, noisy, rtol=1e-3, atol=1e-5) == "scaled by 0.99"
    assert describe(REF, REF * 2, rtol=1e-5, atol=1e-5) == "scaled by 2"


def test_ulps_are_counted_in_the_outputs_dtype():
    ref = torch.full((8,), 1.0, dtype=torch.bfloat16)
    out = ref.clone()
    out[::2] = 1.0 + 4 * 2 ** -7  # bf16 spacing at 1.0 is 2^-7: 4 ULP off at half the elements
    out[1::2] = 1.0 - 2 * 2 ** -8  # and 2 ULP (spacing below 1.0 is 2^-8) the other way
    assert describe(ref, out, rtol=0, atol=0) == "wrong at 100 % of elements (8 of 8), off by up to 4 ULP"


def test_integer_outputs_say_the_largest_difference():
    ref = torch.arange(100)
    out = ref.clone()
    out[[3, 50, 70]] += torch.tensor([2, -9, 4])
    assert describe(ref, out, rtol=0, atol=0) == "wrong at 3 % of elements (3 of 100), off by up to 9"
