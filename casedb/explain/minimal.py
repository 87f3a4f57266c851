"""The smallest failing case: shrink every dim of a failing case, round after round, keeping the
smallest variant that still fails with the same cause (a chain, :mod:`casedb.explain.schedule`).
"""

from __future__ import annotations

import math

from casedb.cases.marks import iter_tensors
from casedb.explain import variants

MAX_ROUNDS = 12


def elements(case: dict) -> int:
    """Elements the case's input tensors hold in all."""
    return sum(math.prod(t["shape"]) for t in iter_tensors(case["inputs"], case.get("attrs") or {}))


def chain(example: dict, cause: str):
    """Shrink ``example``; returns {"case", "steps"} (steps: each change kept) or None when no
    smaller case fails the same way."""
    current, steps = example, []
    for _ in range(MAX_ROUNDS):
        cands = [(how, c) for how, c in variants.shrunk(current) if elements(c) < elements(current)]
        if not cands:
            break
        outs = yield [c for _, c in cands]
        kept = [(elements(c), how, c) for (how, c), o in zip(cands, outs) if o.verdict(cause) == "same"]
        if not kept:
            break
        _, how, current = min(kept, key=lambda t: t[0])
        steps.append(how)
    return {"case": current, "steps": steps} if steps else None
