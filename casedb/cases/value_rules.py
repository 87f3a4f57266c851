"""Input rules that make a call's output informative, and that record what the CPU reference
cannot run. Registered in :mod:`casedb.cases.input_rules`.

A case whose reference output is all zeros or one value cannot catch a bug: a target returning
that passes (execute.Execution.vacuous). Random values make some calls so: a comparison with a
literal the random values never reach, a mask ANDed with a random 0-d False, a floor division
by 10 of values below 10. These rules choose values that make the output depend on the inputs;
they do not constrain validity, so problems() ignores them.
"""

from __future__ import annotations

import math

from casedb.cases.input_rules import MASK_DATA_LIMIT, Call, informative, is_integer, numel, rule


def _operands(c: Call) -> tuple:
    return c.tensor(0, "input") or c.tensor(0, "self"), c.tensor(1, "other")


@rule("torch.Tensor.__eq__", "torch.Tensor.eq", "torch.eq", "torch.Tensor.__ne__", "torch.Tensor.ne", "torch.ne")
def _equality(c: Call):
    a, b = _operands(c)
    literal = c.value(1, "other")
    if not is_integer(a):
        return
    if isinstance(literal, int) and not isinstance(literal, bool):
        # values around the literal: about a third are equal to it (a token id, a pad value ...)
        if numel(a) <= 1:
            informative(a, "randint", {"low": literal, "high": literal + 1})
        else:
            informative(a, "randint", {"low": literal - 1, "high": literal + 2})
    elif is_integer(b) and min(numel(a), numel(b)) <= 1:
        informative(a, "randint", {"low": 0, "high": 3})
        informative(b, "randint", {"low": 0, "high": 3})


@rule("torch.Tensor.gt", "torch.gt", "torch.Tensor.__gt__", "torch.Tensor.greater", "torch.greater",
      "torch.Tensor.ge", "torch.ge", "torch.Tensor.__ge__", "torch.Tensor.greater_equal", "torch.greater_equal",
      "torch.Tensor.lt", "torch.lt", "torch.Tensor.__lt__", "torch.Tensor.less", "torch.less",
      "torch.Tensor.le", "torch.le", "torch.Tensor.__le__", "torch.Tensor.less_equal", "torch.less_equal")
def _ordering(c: Call):
    # a broadcast scalar against a tensor of positions: the scalar in the middle of their range
    a, b = _operands(c)
    if not (is_integer(a) and is_integer(b)) or min(numel(a), numel(b)) > 1 or numel(a) == numel(b):
        return
    scalar = a if numel(a) <= 1 else b
    informative(scalar, "randint", {"low": 5, "high": 6})  # the default randint values are 0..9


@rule("torch.Tensor.__and__", "torch.Tensor.__rand__", "torch.logical_and", "torch.Tensor.logical_and",
      "torch.bitwise_and", "torch.Tensor.bitwise_and")
def _conjunction(c: Call):
    # a mask ANDed with a single random bool is all False half the time: the single one True
    _single_bools(c, "ones")


@rule("torch.Tensor.__or__", "torch.Tensor.__ror__", "torch.logical_or", "torch.Tensor.logical_or",
      "torch.bitwise_or", "torch.Tensor.bitwise_or")
def _disjunction(c: Call):
    _single_bools(c, "zeros")


def _single_bools(c: Call, init: str) -> None:
    """The call's single-element bool operands take `init` (ones, zeros)."""
    for spec in _operands(c):
        if spec is not None and spec.get("dtype") == "bool" and numel(spec) <= 1:
            informative(spec, init)


@rule("torch.all", "torch.Tensor.all")
def _all(c: Call):
    # all() of random bools is False: an all-True mask (a batch without padding), so the call
    # answers True, unless it reduces a dim (then rows alternate)
    x = c.tensor(0, "input") or c.tensor(0, "self")
    if x is None or x.get("dtype") != "bool":
        return
    if c.value(1, "dim") is None:
        informative(x, "ones")
    elif x["shape"] and c.value(1, "dim") in (-1, len(x["shape"]) - 1) and numel(x) <= MASK_DATA_LIMIT:
        width = x["shape"][-1]
        informative(x, "data", data=[not (i // width % 2 and i % width == width - 1) for i in range(numel(x))])


@rule("torch.nn.functional.multi_head_attention_forward")
def _attention_projections(c: Call):
    # Projection weights at their initialised scale (std 1/sqrt(embed_dim)). At std 1 the
    # attention logits reach thousands, the softmax is one-hot, and which key wins flips with
    # one rounding: the bf16 CPU reference itself was 4096 ULPs off float32 (inductor 764 abs
    # err "wrong" against it) — a case that cannot tell a right backend from a wrong one.
    embed = c.value(3, "embed_dim_to_check")
    if not isinstance(embed, int) or embed <= 0:
        return
    for pos, name in ((5, "in_proj_weight"), (11, "out_proj_weight"), (None, "q_proj_weight"),
                      (None, "k_proj_weight"), (None, "v_proj_weight")):
        w = c.tensor(pos, name)
        if w is not None and not is_integer(w):
            informative(w, "randn", {"std": 1 / math.sqrt(embed)})


# --------------------------------------------------------------------------- reference limits
# Real calls the CPU eager reference has no kernel for: on a non-CPU device the model code takes
# another branch (e.g. transformers' MoE feeds histc int32 counts off the CPU). The case stays —
# the device must run it — and declares that the reference (and a CPU target) raises.


@rule("torch.histc", "torch.Tensor.histc", "torch.ops.aten.histc")
def _histc(c: Call):
    x = c.tensor(0, "input") or c.tensor(0, "self")
    if is_integer(x) and "expects_error" not in c.case:
        # RuntimeError: eager raises NotImplementedError, a compiled target dynamo's
        # TorchRuntimeError; both are RuntimeErrors and both name the kernel.
        no_kernel = {"type": "RuntimeError", "match": "histogram_cpu"}
        c.case["expects_error"] = {"ref": no_kernel, "cpu": dict(no_kernel)}
