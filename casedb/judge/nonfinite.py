"""NaN and infinities: whether two results place them differently (:func:`nan_inf_differ`) and,
given a high-precision reference, whose fault each such element is (:func:`excused`).

The CPU reference is not always right where it gives NaN/inf: x86's bfloat16 and float32
``gelu(inf)`` are NaN, float64's is inf. casedb.run.execute takes a float64 upcast reference for a
result whose NaN/inf the two sides place differently, and casedb.judge.compare lets it decide.
Torch only: `casedb repro` copies it into its scripts with compare.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from casedb.judge.ulp import flat_chunks

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)


def isnan_scalar(x) -> bool:
    """Whether a Python number is NaN (a complex one: either part)."""
    return isinstance(x, (float, complex)) and x != x


def isinf_scalar(x) -> bool:
    """Whether a Python number is infinite (a complex one: either part)."""
    return isinstance(x, (float, complex)) and math.isinf(abs(x))


def unmatched(a: torch.Tensor, b: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """Where one of ``a``, ``b`` is NaN/inf and the other is not the same (``finite``: where both are finite)."""
    return ~finite & (a != b) & ~(torch.isnan(a) & torch.isnan(b))


def nan_inf_differ(ref: Any, out: Any) -> bool:
    """Whether a floating tensor of ``out`` has NaN/inf where the same tensor of ``ref`` has not,
    or the reverse (the two walked together as :func:`compare` walks them)."""
    if isinstance(ref, torch.Tensor) and isinstance(out, torch.Tensor):
        if not (ref.is_floating_point() and out.is_floating_point() and ref.shape == out.shape
                and ref.layout == out.layout == torch.strided):
            return False
        for a, b in flat_chunks(ref, out):
            finite = torch.isfinite(a) & torch.isfinite(b)
            if not bool(finite.all()) and bool(unmatched(a, b, finite).any()):
                return True
        return False
    if isinstance(ref, (list, tuple)) and isinstance(out, (list, tuple)):
        return any(nan_inf_differ(r, o) for r, o in zip(ref, out))
    if isinstance(ref, dict) and isinstance(out, dict):
        return any(nan_inf_differ(ref[k], out[k]) for k in ref if k in out)
    return False


def excused(a: torch.Tensor, b: torch.Tensor, h: torch.Tensor, lost: torch.Tensor, dtype: torch.dtype,
             near) -> tuple[torch.Tensor, torch.Tensor]:
    """(excused, reference faults): the elements of ``lost`` (target ``a`` and CPU reference ``b``
    differ in NaN/inf) where the target agrees with the high-precision reference ``h`` — the same
    NaN, the same infinity (in ``h`` or in ``h`` rounded to the output ``dtype``: an overflow there
    is right), or finite and ``near(x, h)`` — and, of those, where the CPU reference does not (it is
    the one that is wrong: CPU bf16/float32 ``gelu(inf)`` is NaN on x86). All float64."""
    h_low = h.to(dtype).to(torch.float64)

    def agrees(x):
        return ((torch.isnan(x) & torch.isnan(h)) | (torch.isinf(x) & ((x == h) | (x == h_low)))
                | (torch.isfinite(x) & torch.isfinite(h) & near(x, h)))

    t_ok = lost & agrees(a)
    return t_ok, t_ok & ~agrees(b)
