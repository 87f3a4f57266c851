"""Confirming a condition by experiment: variants of failing cases that make the condition false
(a contiguous copy, another dtype, a broadcast input materialized, a dim rounded to a multiple),
and bisection of a threshold between a passing and a failing size. Each is a chain
(:mod:`casedb.explain.schedule`): a generator that yields a round of variant cases, receives their
outcomes (:class:`casedb.explain.rounds.Outcome`) and returns what it found.
"""

from __future__ import annotations

from casedb.explain import variants
from casedb.explain.conditions import Condition
from casedb.explain.features import of_case as features_of

POINTS = 7  # sizes tried per round of a bisection


def first_confirmed(conds: list[Condition], examples: list[dict], cause: str):
    """Confirm ``conds`` one after the other (simplest first) until one is confirmed; returns
    {index: what its confirmation found} of those tried."""
    found = {}
    for j, cond in enumerate(conds):
        found[j] = yield from chain(cond, examples, cause)
        if found[j].get("confirmed"):
            break
    return found


def chain(cond: Condition, examples: list[dict], cause: str):
    """The confirmation chain of ``cond`` over failing ``examples``; returns
    {"confirmed": bool, "by": text} (a threshold's also "threshold", "near")."""
    if cond.also is not None:  # a pair: vary the part that can be varied (not the op)
        first = Condition(cond.kind, cond.key, cond.value, near=cond.near)
        part = cond.also if first.key == "op" else first
        return (yield from chain(part, examples, cause))
    flip = _flip(cond)
    if flip is not None:
        make, words = flip
        cases = [c for c in (make(e) for e in examples) if c is not None]
        if not cases:
            return {"confirmed": False, "by": f"no variant applies ({words})"}
        outs = yield cases
        passed = sum(o.verdict(cause) == "pass" for o in outs)
        return {"confirmed": passed == len(cases), "by": f"{words} pass" if passed == len(cases)
                else f"{words}: {passed} of {len(cases)} pass"}
    if cond.kind == "notmult":
        return (yield from _multiple(cond, examples, cause))
    if cond.kind in ("ge", "le"):
        return (yield from bisect(cond, _closest(cond, examples), cause))
    return {"confirmed": False, "by": "not varied (a case's op cannot be changed)" if cond.key == "op"
            else "not varied"}


def _flip(cond: Condition):
    """(variant maker, what its variants are) that makes ``cond`` false, if one does."""
    if cond.kind == "flag" and cond.key == "noncontiguous" or (cond.kind == "is" and cond.key.startswith("layout:")):
        return variants.contiguous, "contiguous copies"
    if cond.kind == "flag" and cond.key == "broadcast":
        return variants.materialized, "materialized broadcast inputs"
    if cond.kind == "is" and cond.key in ("dtype",) or cond.key.startswith("dtype:in"):
        other = "float32" if cond.value in variants.LOW else "bfloat16"
        return (lambda c: variants.other_dtype(c, other)), f"{other} copies"
    return None


def _multiple(cond: Condition, examples: list[dict], cause: str):
    m = cond.value
    up = [c for c in (variants.rounded(e, cond.key, m) for e in examples) if c is not None]
    half = [c for c in (variants.rounded(e, cond.key, m, odd_half=True) for e in examples) if c is not None] \
        if m > 8 else []
    if not up:
        return {"confirmed": False, "by": f"no variant applies (rounding {cond.key} to a multiple of {m})"}
    outs = yield up + half
    up_pass = all(o.verdict(cause) == "pass" for o in outs[:len(up)])
    half_fail = all(o.verdict(cause) == "same" for o in outs[len(up):])
    by = f"{cond.key} rounded up to a multiple of {m} passes" if up_pass else \
        f"{cond.key} rounded up to a multiple of {m} still fails"
    if half:
        by += f"; an odd multiple of {m // 2} {'still fails' if half_fail else 'passes'}"
    return {"confirmed": up_pass and half_fail, "by": by}


def _closest(cond: Condition, examples: list[dict]) -> dict:
    """The failing example whose value is nearest the threshold (the shortest bisection)."""
    return min(examples, key=lambda e: abs(features_of(e)[cond.key] - cond.value))


def bisect(cond: Condition, example: dict, cause: str):
    """Bisect ``cond.key`` of a failing ``example`` between a passing size and its own;
    returns {"confirmed", "by", "threshold" (the first failing size), "near" (the last passing)}."""
    key, ge = cond.key, cond.kind == "ge"
    fail_at = features_of(example)[key]
    pass_at = cond.near if cond.near is not None and (cond.near < fail_at if ge else cond.near > fail_at) else (
        1 if ge else 2 * fail_at)
    checked = False
    while True:
        lo, hi = sorted((pass_at, fail_at))
        points = _points(lo, hi) if checked else [pass_at] + _points(lo, hi)
        cases, sizes = [], []
        for p in points:
            c = variants.with_numel(example, p) if key == "numel" else variants.with_size(example, key, p)
            got = features_of(c).get(key) if c is not None else None
            if got is not None and got not in sizes and (lo < got < hi or got == pass_at):
                cases.append(c)
                sizes.append(got)
        if not cases:
            break
        outs = yield cases
        verdict = dict(zip(sizes, (o.verdict(cause) for o in outs)))
        if not checked:
            checked = True
            if verdict.pop(pass_at, None) != "pass":
                return {"confirmed": False, "by": f"{key} = {pass_at} does not pass either"}
        before = (pass_at, fail_at)
        pass_at, fail_at = _narrowed(verdict, pass_at, fail_at, ge)
        if (pass_at, fail_at) == before:  # nothing in between decided (errors): no closer
            break
    return {"confirmed": True, "threshold": fail_at, "near": pass_at,
            "by": f"bisection: fails at {key} = {fail_at}, passes at {key} = {pass_at}"}


def _points(lo: int, hi: int) -> list[int]:
    if hi - lo <= 1:
        return []
    n = min(POINTS, hi - lo - 1)
    return sorted({lo + round((hi - lo) * (i + 1) / (n + 1)) for i in range(n)} - {lo, hi})


def _narrowed(verdict: dict, pass_at: int, fail_at: int, ge: bool) -> tuple[int, int]:
    """(the passing size nearest the failing ones, the failing size nearest the passing ones)."""
    fails = [s for s, v in verdict.items() if v == "same"] + [fail_at]
    fail_at = min(fails) if ge else max(fails)
    passes = [s for s, v in verdict.items() if v == "pass" and (s < fail_at if ge else s > fail_at)] + [pass_at]
    return (max(passes) if ge else min(passes)), fail_at
