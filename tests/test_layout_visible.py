"""Issue 43 item 1: a tensor input's layout (contiguous, strided, transposed, offset, broadcast)
is worked out from its stored spec and shown wherever inputs are."""

import pytest
import torch

from casedb.cases import presets
from casedb.cases.layout import input_label, tensor_layout


def _spec(shape, preset=None, dtype="float32", **args):
    spec = {"shape": shape, "dtype": dtype, "init": "randn"}
    if preset:
        spec.update(preset=preset, preset_args=args)
    return spec


@pytest.mark.parametrize("spec, word", [
    (_spec([1, 100, 128, 64]), "contiguous"),
    (_spec([4, 8], "noncontig_slice"), "strided"),
    (_spec([4, 8], "noncontig_slice", dim=0, step=3), "strided"),
    (_spec([4, 8], "noncontig_slice", step=1), "contiguous"),
    (_spec([4, 8], "transpose_view"), "transposed"),
    (_spec([2, 4, 8], "transpose_view", dim0=-1, dim1=-2), "transposed"),
    (_spec([1, 8], "transpose_view"), "contiguous"),  # a size-1 dimension's stride means nothing
    (_spec([4, 8], "strided", stride=[8, 1]), "contiguous"),
    (_spec([4, 8], "strided", stride=[8, 1], storage_offset=5), "offset"),
    (_spec([4, 8], "strided", stride=[0, 1]), "broadcast"),
    (_spec([4, 8], "strided", stride=[1, 4]), "transposed"),
    (_spec([4, 8], "strided", stride=[16, 1]), "strided"),
    (_spec([2, 3, 4], "strided", stride=[12, 1, 3], storage_offset=2), "transposed"),
    (_spec([0, 8], "strided", stride=[0, 1]), "contiguous"),
    (_spec([], "strided", stride=[]), "contiguous"),
])
def test_layout_word(spec, word):
    assert tensor_layout(spec) == word


@pytest.mark.parametrize("spec", [
    _spec([4, 8], "noncontig_slice"), _spec([3, 5, 7], "noncontig_slice", dim=1, step=4),
    _spec([4, 8], "transpose_view"), _spec([2, 4, 8], "transpose_view", dim0=0, dim1=2),
    _spec([4, 8], "strided", stride=[0, 1]), _spec([4, 8], "strided", stride=[8, 1], storage_offset=3),
    _spec([5], "noncontig_slice", step=2),
])
def test_layout_agrees_with_the_tensor_the_preset_builds(spec):
    # the word is computed without torch; the tensor the run builds must read the same way
    args = spec.get("preset_args") or {}
    t = presets.PRESETS[spec["preset"]].fn(torch.randn(spec["shape"]), **args)
    word = tensor_layout(spec)
    assert (word in ("contiguous", "offset")) == t.is_contiguous()
    assert (word == "broadcast") == (0 in t.stride())
    assert (word == "offset") == (t.storage_offset() > 0)
    assert presets.layout(spec) == (list(t.stride()), t.storage_offset())


def test_input_label_spells_dtype_and_shape_as_listings_do():
    assert input_label(_spec([1, 11, 2880], dtype="bfloat16")) == "bf16[1, 11, 2880]"
    assert input_label(_spec([1, 100, 128, 64], "strided", stride=[819200, 64, 6400, 1])) == \
        "fp32[1, 100, 128, 64] transposed"
    assert input_label(_spec([4, 8], "noncontig_slice")) == "fp32[4, 8] strided"
    assert input_label(_spec([4, 8], "strided", stride=[0, 1])) == "fp32[4, 8] broadcast"
