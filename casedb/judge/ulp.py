"""Errors in ULPs (units in the last place) of an output's dtype, measured against a
high-precision reference, and the chunked walk over large tensors that every measure of
:mod:`casedb.judge.compare` and :mod:`casedb.judge.bias` takes. Torch only: `casedb repro`
copies it into its scripts with compare."""

from __future__ import annotations

import torch

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

ULP_SCALE_FLOOR = 64  # near-zero elements are measured in ULPs at max|hi| / this


CHUNK = 1 << 24  # elements measured at a time (float64 temporaries of 128 MiB each)


def flat_chunks(*ts: torch.Tensor):
    """Equal flat slices of same-shaped tensors, CHUNK elements at a time: measured whole, the
    float64 temporaries of one 445M-element attention score took a worker past 22 GiB."""
    flat = [t.reshape(-1) for t in ts]
    for i in range(0, flat[0].numel(), CHUNK):
        yield [f[i:i + CHUNK] for f in flat]


def max_of(current: float | None, t: torch.Tensor) -> float | None:
    """The larger of ``current`` and ``t``'s largest element (``current`` when ``t`` is empty)."""
    if t.numel() == 0:
        return current
    m = float(t.max())
    return m if current is None else max(current, m)


def ulp_top(hi: torch.Tensor) -> float:
    """The largest finite magnitude of ``hi`` (0 when none)."""
    top = 0.0
    for (h,) in flat_chunks(hi):
        mag = h.abs()
        top = max_of(top, mag[torch.isfinite(mag)])
    return top


def ulp_scale(h: torch.Tensor, dtype: torch.dtype, top: float, m: torch.Tensor | None = None) -> torch.Tensor:
    """The spacing of ``dtype`` at each element of ``h`` (float64), measured at no less than the
    tensor's largest magnitude ``top`` / ULP_SCALE_FLOOR nor, given ``m``, at ``m`` (the error
    scale of a summing op: casedb.judge.accumulation)."""
    info = torch.finfo(dtype)
    mag = h.abs()
    mag = mag.masked_fill(~torch.isfinite(mag), 1.0)
    if m is not None:
        m = m.to(torch.float64)
        mag = torch.maximum(mag, m.masked_fill(~torch.isfinite(m), 0.0))
    mag = torch.clamp(mag, min=max(top / ULP_SCALE_FLOOR, info.tiny))
    return info.eps * torch.exp2(torch.floor(torch.log2(mag)))


def ulp_of(x: torch.Tensor, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """|x - h| in ULPs (``scale``) over the elements finite on both sides (``h`` float64)."""
    a = x.to(torch.float64)
    return ((a - h).abs() / scale)[torch.isfinite(a) & torch.isfinite(h)]


def hi_chunks(hi: torch.Tensor, mag: torch.Tensor | None, *ts: torch.Tensor):
    """flat_chunks of ``ts``, ``hi`` (as float64) and ``mag`` (None stays None)."""
    for chunk in flat_chunks(*ts, hi, *(() if mag is None else (mag,))):
        yield (*chunk[:len(ts)], chunk[len(ts)].to(torch.float64), chunk[len(ts) + 1] if mag is not None else None)


def ulp_errors(x: torch.Tensor, hi: torch.Tensor, top: float, mag: torch.Tensor | None = None) -> float:
    """The largest |x - hi| over finite elements, in ULPs of x's dtype (``top``, ``mag``: see ulp_scale)."""
    worst = 0.0
    for xc, h, m in hi_chunks(hi, mag, x):
        worst = max_of(worst, ulp_of(xc, h, ulp_scale(h, x.dtype, top, m)))
    return worst
