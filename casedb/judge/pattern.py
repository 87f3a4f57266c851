"""What a wrong output looks like, in a few words: the hint a failure row and a repro print.

A backend engineer reading "412 of 2880 elements exceed atol" still has to dig; "all zeros",
"NaN where the reference is finite", "sign flipped", "scaled by 0.5", "wrong in column 10 of the
last dim only" points at the bug. :func:`describe` tries the patterns in that order on one
floating or integer output and its reference (same shape) and returns the first that holds;
failing all, it says how much is wrong ("wrong at 3.2 % of elements (92 of 2,880), off by up to
40 ULP"). None only when nothing is wrong.
"""

from __future__ import annotations

import torch

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

# share of the differing elements a pattern must explain to be named
_SHARE = 0.95
# what a fitted scale may leave unexplained, as a share of the error (its norm)
_RESIDUAL = 0.1


def describe(ref: torch.Tensor, out: torch.Tensor, *, rtol: float, atol: float) -> str | None:
    """The pattern of ``out``'s error against ``ref``, or None when no simple one holds."""
    if ref.shape != out.shape or ref.numel() == 0 or ref.is_complex() or out.is_complex():
        return None
    r = ref.detach().to("cpu", torch.float64)
    o = out.detach().to("cpu", torch.float64)
    bad = ~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    finite_ref = torch.isfinite(r)
    if bool((~torch.isfinite(o) & finite_ref).any()):
        return "NaN or inf where the reference is finite"
    if bool((o == 0).all()) and bool((r != 0).any()):
        return "all zeros"
    return (_sign(r[bad], o[bad], n_bad) or _scale(r, o, bad, rtol, atol) or _one_slice(bad)
            or _spread(ref, r, o, bad))


def _sign(r: torch.Tensor, o: torch.Tensor, n_bad: int) -> str | None:
    nz = r != 0
    if int(nz.sum()) < max(1, _SHARE * n_bad):
        return None
    ratio = o[nz] / r[nz]
    if bool((ratio - -1).abs().le(1e-2).float().mean() >= _SHARE):
        return "sign flipped"
    return None


def _scale(r: torch.Tensor, o: torch.Tensor, bad: torch.Tensor, rtol: float, atol: float) -> str | None:
    """``scaled by k`` only when the output is the reference times k: k fitted by least squares
    over every finite element, what k leaves (the residual) a small part of the error, and k times
    the reference within tolerance where the output is wrong. Outputs merely a little off, each by
    its own amount, have ratios near one another but are no scale."""
    both = torch.isfinite(r) & torch.isfinite(o)
    rr, oo = r[both], o[both]
    denom = float((rr * rr).sum())
    if denom == 0:
        return None
    k = float((oo * rr).sum()) / denom
    error = float((oo - rr).norm())
    if k == 1 or abs(k) <= 1e-6 or error == 0 or float((oo - k * rr).norm()) > _RESIDUAL * error:
        return None
    explained = torch.isclose(o[bad], k * r[bad], rtol=rtol, atol=atol, equal_nan=True)
    if float(explained.float().mean()) < _SHARE:
        return None
    return f"scaled by {_digits(k)}"


def _spread(ref: torch.Tensor, r: torch.Tensor, o: torch.Tensor, bad: torch.Tensor) -> str:
    """What the error is when no simple pattern holds: how many elements, and how far off (in
    ULPs of the output's dtype where it is floating, else in value)."""
    share = 100 * int(bad.sum()) / bad.numel()
    where = f"wrong at {_percent(share)} of elements ({int(bad.sum()):,} of {bad.numel():,})"
    diff = (o[bad] - r[bad]).abs()
    if ref.is_floating_point():
        # the spacing at the larger of the two magnitudes: at a reference of 0 its own is subnormal
        in_dtype = torch.maximum(r[bad].abs(), o[bad].abs()).to(ref.dtype)
        spacing = (torch.nextafter(in_dtype, torch.full_like(in_dtype, float("inf"))) - in_dtype).abs().double()
        ulps = diff / spacing
        ulps = ulps[torch.isfinite(ulps)]
        if ulps.numel():
            return f"{where}, off by up to {_count(float(ulps.max()))} ULP"
    return f"{where}, off by up to {float(diff.max()):.3g}"


def _percent(share: float) -> str:
    return f"{share:.2g} %" if share < 10 else f"{share:.0f} %"


def _count(ulps: float) -> str:
    return f"{ulps:,.0f}" if ulps < 1e6 else f"{ulps:.2g}"


def _digits(k: float) -> str:
    """k with 3 significant digits, more where 3 would read as 1 (a softmax 0.5 % off: 1.005)."""
    for digits in range(3, 8):
        text = f"{k:.{digits}g}"
        if float(text) != 1:
            return text
    return f"{k:.8g}"


def _one_slice(bad: torch.Tensor) -> str | None:
    """The wrong elements all lie in one index of one dim (a column, a row, a channel)."""
    if bad.dim() == 0 or int(bad.sum()) < 2:
        return None
    idx = bad.nonzero()
    for dim in reversed(range(bad.dim())):
        values = idx[:, dim].unique()
        if values.numel() == 1 and bad.shape[dim] > 1:
            where = "the last dim" if dim == bad.dim() - 1 else f"dim {dim}"
            return f"wrong only at index {int(values)} of {where}"
    return None


def describe_output(ref, out, *, rtol: float, atol: float) -> str | None:
    """:func:`describe` of the first tensor of an output (a tensor; tuples, lists and dicts of
    them) whose error has a pattern; where there are several, the part is named
    (``output[1]: all zeros``)."""
    pairs = list(_tensor_pairs(ref, out, "output"))
    for path, r, o in pairs:
        said = describe(r, o, rtol=rtol, atol=atol)
        if said:
            return said if len(pairs) == 1 else f"{path}: {said}"
    return None


def _tensor_pairs(ref, out, path):
    if isinstance(ref, torch.Tensor) and isinstance(out, torch.Tensor):
        yield path, ref, out
    elif isinstance(ref, (tuple, list)) and isinstance(out, (tuple, list)) and len(ref) == len(out):
        for i, (r, o) in enumerate(zip(ref, out)):
            yield from _tensor_pairs(r, o, f"{path}[{i}]")
    elif isinstance(ref, dict) and isinstance(out, dict):  # an execution's parts: output, mutated inputs
        for key in ref:
            if key in out:
                yield from _tensor_pairs(ref[key], out[key], key if path == "output" else f"{path}[{key!r}]")
