"""For a wrong result, how the error grows: with the reduced length K (what an accumulation in
too low a precision looks like: the error grows with K) and with the inputs' magnitude (an error
that scales with it is relative; one that does not is absolute). A chain
(:mod:`casedb.explain.schedule`) of one round.
"""

from __future__ import annotations

import math

from casedb.explain import variants
from casedb.explain.features import of_case as features_of

K_FACTORS = (0.25, 0.5, 1, 2)
MAGNITUDES = (0.01, 1, 100)


def chain(example: dict):
    """Returns {"K": [{K, max_abs_err, ulp_err, outcome}], "magnitude": [...], "text"}."""
    k = features_of(example).get("K")
    ks = sorted({max(1, int(k * f)) for f in K_FACTORS}) if k else []
    kcases = [variants.with_size(example, "K", n) for n in ks]
    mcases = [variants.scaled(example, m) for m in MAGNITUDES]
    pairs = [("K", n, c) for n, c in zip(ks, kcases) if c is not None] + \
            [("magnitude", m, c) for m, c in zip(MAGNITUDES, mcases) if c is not None]
    if not pairs:
        return None
    outs = yield [c for _, _, c in pairs]
    found: dict = {"K": [], "magnitude": []}
    for (what, x, _), o in zip(pairs, outs):
        found[what].append({what: x, "max_abs_err": o.max_abs_err, "ulp_err": o.ulp_err, "outcome": o.outcome})
    found["text"] = _text(found)
    return found


def slope(points: list[tuple[float, float]]) -> float | None:
    """The log-log slope between the first and last points with a positive error."""
    pts = [(x, y) for x, y in points if x and y and y > 0 and math.isfinite(y)]
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    return math.log(y1 / y0) / math.log(x1 / x0)


def _text(found: dict) -> str:
    parts = []
    ks = found["K"]
    if ks:
        s = slope([(p["K"], p["max_abs_err"]) for p in ks])
        errs = ", ".join(f"K = {p['K']}: {_err(p)}" for p in ks)
        trend = "" if s is None else " (flat)" if abs(s) < 0.1 else f" (grows as K^{s:.1f})"
        parts.append(f"error against K: {errs}{trend}")
    ms = found["magnitude"]
    if ms:
        s = slope([(p["magnitude"], p["max_abs_err"]) for p in ms])
        kind = "" if s is None else (" (relative: scales with the values)" if s > 0.5 else
                                    " (absolute: does not scale with the values)")
        parts.append("error against magnitude: " + ", ".join(f"x{p['magnitude']:g}: {_err(p)}" for p in ms) + kind)
    return "; ".join(parts)


def _err(p: dict) -> str:
    e = p["max_abs_err"]
    word = "passes" if p["outcome"] == "passed" else "fails"
    return f"{word}, max abs err {e:.3g}" if e is not None else word
