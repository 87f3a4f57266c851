"""The bias judge: errors no per-element tolerance sees because each is small, but all lean one way.

A target that rounds toward zero where round-to-nearest is required (a conversion unit
truncating float32 results into bf16) is within 1 ULP on every element, so the tolerance and ULP
judges pass it; over thousands of elements its errors average -0.5 ULP toward the reference's
magnitude, where correct rounding averages about 0. In a model that drift compounds layer after
layer.

:func:`measure` takes one floating output — the CPU reference, the target and the
high-precision reference — and measures the signed error of each element against the
high-precision reference in ULPs of the output dtype at the element's own magnitude (no lower
than the tensor's largest / 64, as the ULP judge: :func:`casedb.judge.ulp.ulp_scale`).
Accumulating ops are measured there too, not at their terms' magnitude as the ULP judge bounds
them: a different summation order is unbiased at any scale (its errors, large where terms
cancel, only raise the threshold through their spread), while a truncated accumulator's drift
toward zero would shrink below the floor at the terms' scale. Two directions: the plain error (toward +inf) and the error toward
the reference's magnitude (``error * sign(hi)``), whose mean stays near 0 for correct rounding
of data of both signs while truncation gives -0.5.

A direction is **biased** when, over ``n`` elements finite on all three sides (at least
``MIN_COUNT``), the target's mean error exceeds ``max(FLOOR, K * sigma / sqrt(n))`` ULPs
(``sigma``: the sample spread of the errors; a t-test with a floor) **and** so does the mean of
the target's error minus the CPU reference's own, with the same sign: a CPU reference biased the
same way (an op whose correct result leans one way at this dtype) excuses the target.
:func:`judge_bias` applies that to every part of a result and returns the part that decides.

Elements computed from equal inputs share their error: a GPU's ``exp`` is up to 2 ULPs off, the
same way each time for the same argument, so a softmax over bf16 logits (a few dozen distinct
values, as the extremal ones around 96.7 are) carries a few dozen errors repeated millions of
times, and their mean is a few draws, not millions (an H100: -0.155 ULP over 2 M elements from
16 distinct values). :func:`values_of` keeps a prefix of the input that has the output's shape;
the standard error over the distinct input values (cluster-robust: each value's errors summed,
so a value weighs by its share of the elements) counts as the rows' does: softmax logits near
their row's maximum put most elements on two or three values, which are then the few draws.

Two correct results differ by a common factor: a mean computed as the sum times ``1/n``
rounded to float32 (CUDA's) is scaled by ``fl(1/n) * n`` (casedb.judge.accumulation
.reciprocal_factor), up to half a float32 ULP on every element, one way (an H100: +0.41 ULP over
100 float32 means of 2,880 terms). Given that factor, a result biased against the reference but
not against the reference times the factor passes.

Why the floor is 0.15 ULP, not 0.1: fused kernels round an intermediate once per row (a
softmax's normalizer, a norm's scale) and so shift every element of the row the same way; with
few rows those errors are correlated, their mean over the tensor wanders by ~0.05 ULP, and
sigma / sqrt(n) over elements underestimates that. Truncation sits at -0.5 where every element
is inexact and at -0.27 for a bf16 add of random data, where 45 % of the sums are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from casedb.judge.ulp import flat_chunks, ulp_scale, ulp_top

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

K = 5.0            # standard errors the mean must exceed
FLOOR = 0.15       # ULPs the mean must exceed whatever the count (see the module docstring)
MIN_COUNT = 64     # elements below which no mean is judged
GROUPS = 16        # blocks a single row is cut into for the spread of block means
MAX_GROUPS = 65536  # more rows than this are taken a few consecutive ones per group
VALUE_PREFIX = 1 << 18  # elements of the input kept to group errors by input value


@dataclass
class Bias:
    """The bias of one floating output (ULPs of its dtype; ``count`` elements measured)."""

    mean: float               # the target's mean signed error (toward +inf)
    toward: float             # its mean error toward the reference's magnitude (truncation: -0.5)
    ref_mean: float           # the CPU reference's own mean signed error
    ref_toward: float         # ... and toward the magnitude
    count: int
    threshold: float          # the larger of FLOOR and K standard errors, of the direction reported
    biased: bool              # the verdict: either direction biased beyond the reference's own
    direction: str | None = None   # "toward magnitude" | "signed" (which one is biased), None when neither
    where: str | None = None       # the part of the result ("output[0]"), set by judge_bias

    def reason(self) -> str:
        what = self.toward if self.direction == "toward magnitude" else self.mean
        ref = self.ref_toward if self.direction == "toward magnitude" else self.ref_mean
        return (f"{self.where or 'output'}: biased rounding: the mean error {self.direction or 'signed'} is "
                f"{what:+.3g} ULPs over {self.count} elements (threshold {self.threshold:.3g}; the CPU "
                f"reference's own {ref:+.3g}): each element may be within tolerance, the sum drifts")


class _Sums:
    """Running sums of a few per-element series: count, means and two standard errors of each mean
    — over elements, and over groups (rows of the last dim) whose elements may share an error."""

    def __init__(self, names, groups: int):
        self.n = 0
        self.s = dict.fromkeys(names, 0.0)
        self.q = dict.fromkeys(names, 0.0)
        self.gs = {k: torch.zeros(groups, dtype=torch.float64) for k in names}
        self.gn = torch.zeros(groups, dtype=torch.float64)
        self.floor_se = dict.fromkeys(names, 0.0)  # standard errors measured another way (per input value)

    def add(self, group: torch.Tensor, **series: torch.Tensor) -> None:
        self.n += group.numel()
        self.gn += torch.bincount(group, minlength=self.gn.numel()).to(torch.float64)
        for k, v in series.items():
            self.s[k] += float(v.sum())
            self.q[k] += float((v * v).sum())
            self.gs[k] += torch.bincount(group, weights=v, minlength=self.gn.numel())

    def mean(self, k: str) -> float:
        return self.s[k] / self.n

    def threshold(self, k: str) -> float:
        n, m = self.n, self.mean(k)
        var = max(self.q[k] / n - m * m, 0.0) * n / max(n - 1, 1)
        se = math.sqrt(var / n)
        full = self.gn > 0
        if int(full.sum()) >= 2:  # rows shifted as a whole (a per-row normalizer) count as one draw each
            means = self.gs[k][full] / self.gn[full]
            se = max(se, float(means.std()) / math.sqrt(means.numel()))
        return max(FLOOR, K * max(se, self.floor_se[k]))

    def by_value(self, inverse: torch.Tensor, **series: torch.Tensor) -> None:
        """Elements grouped by their input value (``inverse``: the group of each): the groups'
        summed residuals bound each series' standard error (see the module docstring)."""
        groups = int(inverse.max()) + 1 if inverse.numel() else 0
        if groups < 2:
            return
        counts = torch.bincount(inverse, minlength=groups).to(torch.float64)
        full = counts > 0
        if int(full.sum()) < 2:
            return
        n, g = float(counts.sum()), int(full.sum())
        for k, v in series.items():
            # cluster-robust: each value's residuals summed, so a value's share of the elements
            # weighs its error (a few common values are a few draws, whatever the rare ones do)
            resid = torch.bincount(inverse, weights=v - v.mean(), minlength=groups)[full]
            self.floor_se[k] = math.sqrt(float((resid * resid).sum()) * g / (g - 1)) / n


def _groups(t: torch.Tensor) -> tuple[int, int]:
    """(groups, elements per group) of the flat order: rows of the last dim (at most MAX_GROUPS);
    a single row (or a vector) in GROUPS blocks."""
    n = t.numel()
    width = t.shape[-1] if t.dim() else 1
    rows = n // max(width, 1)
    if rows >= 2:
        per = width * -(-rows // MAX_GROUPS)  # merged rows keep a group's elements together
        return -(-n // per), per
    per = -(-n // GROUPS)
    return -(-n // per), per


def values_of(args, kwargs, out) -> torch.Tensor | None:
    """The first VALUE_PREFIX elements (flat) of the first floating input shaped as ``out``,
    the values its elements are computed from (elementwise ops, softmax, norms); None if none is."""
    if not isinstance(out, torch.Tensor):
        return None
    for t in (*args, *kwargs.values()):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == out.shape and t.layout == torch.strided:
            # float32 keeps every value of a low-precision input apart (the upcast ones are float64)
            return t.detach().reshape(-1)[:VALUE_PREFIX].to("cpu", torch.float32, copy=True)
    return None


def measure(ref: torch.Tensor, target: torch.Tensor, hi: torch.Tensor, values: torch.Tensor | None = None) -> Bias | None:
    """The bias of ``target`` (see the module docstring); None when it cannot be measured: not
    floating, shapes differ, no scale (``hi`` all zero) or fewer than MIN_COUNT finite elements.
    ``values``: the flat prefix of the input the elements are computed from (:func:`values_of`)."""
    if not (ref.dtype.is_floating_point and target.dtype == ref.dtype and hi.dtype.is_floating_point
            and ref.shape == target.shape == hi.shape and ref.layout == target.layout == hi.layout == torch.strided):
        return None
    if ref.dtype == torch.float64 or ref.numel() < MIN_COUNT:
        return None  # float64: no higher precision measured it
    top = ulp_top(hi)
    if not top > 0:
        return None
    groups, per = _groups(ref)
    sums, offset = _Sums(("t", "tm", "d", "dm"), groups), 0
    for r, t, h in flat_chunks(ref, target, hi):
        group = torch.arange(offset, offset + r.numel()) // per
        offset += r.numel()
        e = _errors(r, t, h, ref.dtype, top)
        if e is not None:
            sums.add(group[e.pop("ok")], **e)
    if sums.n < MIN_COUNT:
        return None
    if values is not None and values.numel():
        n = values.numel()
        first = [x.reshape(-1)[:n] for x in (ref, target, hi)]
        e = _errors(*first, ref.dtype, top)
        if e is not None:
            inverse = torch.unique(values[:first[0].numel()], return_inverse=True)[1][e.pop("ok")]
            sums.by_value(inverse, **e)
    direction = None
    for name, t, d in (("toward magnitude", "tm", "dm"), ("signed", "t", "d")):
        mt, md = sums.mean(t), sums.mean(d)
        if abs(mt) > sums.threshold(t) and abs(md) > sums.threshold(d) and mt * md > 0:
            direction = name
            break
    mean, toward = sums.mean("t"), sums.mean("tm")
    return Bias(mean=mean, toward=toward, ref_mean=mean - sums.mean("d"), ref_toward=toward - sums.mean("dm"),
                count=sums.n, threshold=sums.threshold("tm" if direction != "signed" else "t"),
                biased=direction is not None, direction=direction)


def _errors(r, t, h, dtype, top) -> dict | None:
    """The four series of signed errors (ULPs) over the elements finite on all three sides, and
    ``ok``: which those are."""
    r, t, h = r.to(torch.float64), t.to(torch.float64), h.to(torch.float64)
    ok = torch.isfinite(r) & torch.isfinite(t) & torch.isfinite(h)
    r, t, h = r[ok], t[ok], h[ok]
    if not r.numel():
        return None
    scale = ulp_scale(h, dtype, top)
    e_t, e_r, sign = (t - h) / scale, (r - h) / scale, torch.sign(h)
    return {"ok": ok, "t": e_t, "tm": e_t * sign, "d": e_t - e_r, "dm": (e_t - e_r) * sign}


def _parts(x, path: str = ""):
    """(path, leaf) over a result: tensors and other leaves, through tuples, lists and dicts."""
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _parts(v, f"{path}[{i}]")
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _parts(v, f"{path}.{k}" if path else str(k))
    else:
        yield path, x


def judge_bias(reference, target, hi, *, values: torch.Tensor | None = None,
               factor: float | None = None) -> Bias | None:
    """The bias of a whole result (``{"output": ..., "args[0]": ...}`` as casedb.run.execute keeps
    them): the first biased part, else the measured part with the largest mean toward the
    magnitude; None when no part can be measured (or the structures differ: the other judges
    report that). ``values`` (:func:`values_of`) and ``factor``
    (casedb.judge.accumulation.reciprocal_factor) concern the output: see the module docstring."""
    refs, tgts, his = (list(_parts(x)) for x in (reference, target, hi))
    if not (len(refs) == len(tgts) == len(his)):
        return None
    found = []
    for (path, r), (_, t), (_, h) in zip(refs, tgts, his):
        if not all(isinstance(x, torch.Tensor) for x in (r, t, h)):
            continue
        own = path in ("output", "")
        b = measure(r, t, h, values if own else None)
        if b is not None and b.biased and own and factor is not None:
            scaled = measure(r, t, h * factor, values)  # the mean as the sum times fl(1/n)
            if scaled is not None and not scaled.biased:
                b = scaled
        if b is not None:
            b.where = path
            if b.biased:
                return b
            found.append(b)
    return max(found, key=lambda b: abs(b.toward), default=None)


def decide(execution, verdict, comparison):
    """The judge's hook: measure an Execution's bias (cached on it), record it on ``verdict``
    (``bias_mean``, ``bias_toward``, ``bias_count``) and return the comparison to decide by —
    ``comparison``, or a failing copy of it when it passed but the target is biased."""
    ex = execution
    if ex.reference_hi is None or ex.reference is None or ex.target is None or ex.compare_mode != "values":
        return comparison
    if "bias" not in ex._cache:
        ex._cache["bias"] = judge_bias(ex.reference, ex.target, ex.reference_hi, values=ex.bias_values,
                                       factor=ex.bias_factor)
    b = ex._cache["bias"]
    if b is None:
        return comparison
    verdict.bias_mean, verdict.bias_toward, verdict.bias_count = b.mean, b.toward, b.count
    if not b.biased or not comparison.passed:
        return comparison
    return replace(comparison, passed=False, reason=b.reason(), mode="bias", where=b.where)
