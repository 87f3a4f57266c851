"""The simplest condition over cases' features (:mod:`casedb.explain.features`) that separates a
run's failing cases from its passing ones: one feature first (a flag, a value, a threshold
``K >= t``, a divisibility ``last % m != 0``), then pairs of them; each with its counts (failing
cases with it, passing cases with it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from casedb.explain.features import SIZES

MULTIPLES = (8, 16, 32, 64, 128)
FEATURES = ("op", "dtype", "layout", "broadcast", "rank", "dim_size", "divisibility", "numel", "values")
# simplest first: what a backend engineer checks first, and what variants can confirm
_ORDER = ("flag:noncontiguous", "flag:broadcast", "is:dtype", "is:layout", "notmult", "ge:K", "le:K",
          "ge:last", "le:last", "ge:batch", "le:batch", "ge:numel", "le:numel", "is:rank", "is:dtype:in",
          "is:op", "is:values")
_WORDS = {"K": "K (the reduced length)", "last": "the last dim", "batch": "the batch dim",
          "numel": "the number of elements"}


@dataclass
class Condition:
    kind: str            # flag, is, ge, le, notmult
    key: str             # the feature's key (noncontiguous, dtype, layout:in0, K, numel ...)
    value: object = None  # is: the value; ge/le: the threshold; notmult: the multiple
    failing: int = 0
    passing: int = 0
    also: "Condition | None" = None  # a pair: this and `also`
    near: object = None  # ge/le: the nearest passing value on the other side (observed or bisected)
    extra: dict = field(default_factory=dict)

    def holds(self, f: dict) -> bool:
        if self.also is not None and not self.also.holds(f):
            return False
        v = f.get(self.key)
        if v is None:
            return False
        if self.kind == "flag":
            return bool(v)
        if self.kind == "is":
            return v == self.value
        if self.kind == "ge":
            return v >= self.value
        if self.kind == "le":
            return v <= self.value
        return v % self.value != 0

    @property
    def feature(self) -> str:
        """One of :data:`FEATURES`."""
        if self.kind == "flag":
            return "layout" if self.key == "noncontiguous" else "broadcast"
        if self.kind == "notmult":
            return "divisibility"
        if self.kind in ("ge", "le"):
            return "numel" if self.key == "numel" else "dim_size"
        head = self.key.split(":")[0]
        return {"dtype": "dtype", "layout": "layout", "op": "op", "rank": "rank"}.get(head, "values")

    @property
    def rank(self) -> int:
        tag = {"flag": f"flag:{self.key}", "notmult": "notmult"}.get(self.kind) or (
            f"{self.kind}:{self.key}" if self.kind in ("ge", "le") else
            "is:dtype:in" if self.key.startswith("dtype:in") else
            "is:layout" if self.key.startswith("layout:") else f"is:{self.key}")
        return _ORDER.index(tag) + (len(_ORDER) if self.also is not None else 0)

    def phrase(self) -> str:
        """The property in words: ``an input is non-contiguous``, ``K >= 1025``."""
        own = _phrase(self)
        return f"{own} and {self.also.phrase()}" if self.also is not None else own


def _phrase(c: Condition) -> str:
    if c.kind == "flag":
        return "an input is non-contiguous" if c.key == "noncontiguous" else "an input is broadcast"
    if c.kind == "notmult":
        return f"{_WORDS.get(c.key, c.key)} is not a multiple of {c.value}"
    if c.kind in ("ge", "le"):
        return f"{c.key} {'>=' if c.kind == 'ge' else '<='} {c.value}"
    if c.key.startswith("layout:in"):
        return f"input {c.key[9:]} is {c.value}"
    if c.key.startswith("dtype:in"):
        return f"input {c.key[8:]} is {c.value}"
    words = {"dtype": "the dtype", "rank": "the output's rank", "op": "the op", "values": "the values"}
    return f"{words.get(c.key, c.key)} is {c.value}"


def candidates(fail: list[dict], ok: list[dict]) -> list[Condition]:
    """Every single condition that all failing cases meet, counted, simplest first."""
    out = []
    keys = sorted({k for f in fail for k in f})
    for key in keys:
        vals = [f.get(key) for f in fail]
        if any(v is None for v in vals):
            continue
        if key in ("noncontiguous", "broadcast"):
            if all(vals):
                out.append(Condition("flag", key))
        elif key in (*SIZES, "numel"):
            out += [Condition("ge", key, min(vals)), Condition("le", key, max(vals))]
            if key != "numel":
                out += [Condition("notmult", key, m) for m in MULTIPLES if all(v % m for v in vals)]
        elif len(set(vals)) == 1:
            out.append(Condition("is", key, vals[0]))
    for c in out:
        count(c, fail, ok)
        c.near = _near(c, ok)
    return sorted(out, key=lambda c: (c.passing, c.rank))


def count(c: Condition, fail: list[dict], ok: list[dict]) -> Condition:
    c.failing = sum(c.holds(f) for f in fail)
    c.passing = sum(c.holds(f) for f in ok)
    return c


def _near(c: Condition, ok: list[dict]):
    """ge/le: the passing value closest to the threshold (on the passing side)."""
    if c.kind not in ("ge", "le"):
        return None
    vals = [f[c.key] for f in ok if f.get(c.key) is not None]
    side = [v for v in vals if (v < c.value if c.kind == "ge" else v > c.value)]
    if not side:
        return None
    return max(side) if c.kind == "ge" else min(side)


def separating(fail: list[dict], ok: list[dict], limit: int = 4) -> list[Condition]:
    """The simplest conditions separating ``fail`` from ``ok``: the single ones met by every failing
    case and no passing one, else such pairs; else the single one that separates best. Up to
    ``limit``, simplest first."""
    if not fail:
        return []
    single = candidates(fail, ok)
    exact = [c for c in single if c.passing == 0]
    if exact:
        # a threshold that needs no passing case to hold (K >= min over failing) reads first where
        # the passing cases have the feature at all: a K that only the failing cases have is no split
        return sorted(exact, key=lambda c: c.rank)[:limit]
    pairs = []
    for i, a in enumerate(single[:24]):
        for b in single[i + 1:24]:
            if a.key == b.key:
                continue
            p = Condition(a.kind, a.key, a.value, also=b, near=a.near)
            count(p, fail, ok)
            if p.passing == 0:
                pairs.append(p)
    if pairs:
        return sorted(pairs, key=lambda c: (c.rank, c.also.rank))[:limit]
    return sorted(single, key=lambda c: (c.passing, c.rank))[:1]
