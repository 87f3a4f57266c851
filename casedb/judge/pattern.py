"""What a wrong output looks like, in a few words: the hint a failure row and a repro print.

A backend engineer reading "412 of 2880 elements exceed atol" still has to dig; "all zeros",
"NaN where the reference is finite", "sign flipped", "scaled by 0.5", "wrong in column 10 of the
last dim only" or "off by about 16 ULP" points at the bug. :func:`describe` tries the patterns in
that order on one floating or integer output and its reference (same shape) and returns the
first that holds, or None.
"""

from __future__ import annotations

import torch

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

# share of the differing elements a pattern must explain to be named
_SHARE = 0.95


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
    return _sign_or_scale(r[bad], o[bad], n_bad) or _one_slice(bad) or None


def _sign_or_scale(r: torch.Tensor, o: torch.Tensor, n_bad: int) -> str | None:
    nz = r != 0
    if int(nz.sum()) < max(1, _SHARE * n_bad):
        return None
    ratio = o[nz] / r[nz]
    if bool((ratio - -1).abs().le(1e-2).float().mean() >= _SHARE):
        return "sign flipped"
    k = float(ratio.median())
    if k != 1 and abs(k) > 1e-6 and bool(((ratio - k).abs() <= 1e-2 * abs(k)).float().mean() >= _SHARE):
        return f"scaled by {_digits(k)}"
    return None


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
