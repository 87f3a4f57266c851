"""The numerics policy: which tolerance each compared tensor gets, and which judge decides.

Tolerance of one compared tensor of an occurrence, highest first (each of rtol and atol is
resolved on its own, so a rule may set only one):

1. the occurrence's own ``rtol``/``atol`` (written on the case in its manifest);
2. tolerance rules (``tolerances:`` in a triage file, and ``rtol``/``atol`` on its case entries):
   wildcards over op, model, device, backend and dtype. The most specific matching rule wins:
   rules that name the case (op, name, model, signature) over rules that name only the target
   (device, backend), over rules that name only a dtype, over none; naming exactly beats a
   wildcard pattern; among rules of equal specificity the later one wins (the gpt.rs order:
   default < dtype < backend < op < backend+op);
3. the manifest's ``default: rtol/atol`` — for tensors of the manifest's default dtype only
   (a bf16 manifest's 1.6e-2 never judges a float32 output; a default without a dtype is the
   RFC's float32);
4. the default of the tensor's own dtype: torch.testing's table (:data:`DTYPE_DEFAULTS`).

Every judged result records where its tolerance came from (``Tolerance.source``).

Judges (``--judge``): ``tolerance`` (``|target - ref| <= atol + rtol * |ref|`` per element),
``ulp`` (the target's error against a high-precision CPU reference, in ULPs of the output
dtype, may be at most ``ULP_K`` times the low-precision CPU reference's own error or
``ULP_FLOOR`` ULPs; parts without floating values are compared as in ``tolerance``), and
``both`` (a case passes only when both pass; the default, chosen by the mutation scores in
bench/README.md). A tolerance written down for the case (on the case or by a rule) is the
user's decision: the ULP judge does not overrule it, so such a case is judged by tolerance. So
is a case whose upcast inputs would exceed ``HI_REFERENCE_BYTES``. The high-precision reference is float32 for outputs of 16 bits or less
(its error is far below one of their ULPs) and float64 otherwise — and float64 for any result
whose NaN/inf the target and the CPU reference put in different places, because there it decides
whose fault that is (an element where the target agrees with it and the CPU reference does not is
a reference fault, ``Verdict.ref_faults``, not a failure), and float32 can share the CPU's fault
(x86's bfloat16 and float32 ``gelu(inf)`` are NaN; float64's is inf).

Where the ULP judge counts ULPs: at each element's own magnitude, but no lower than the tensor's
largest / 64 and, for ops that sum terms (matmuls, sums, convolutions, scatter-adds, softmax:
:mod:`casedb.judge.accumulation`), no lower than their *error scale*: the magnitude a correct
implementation's error grows with — the sum of the terms' magnitudes (the same call on
``|inputs|`` in high precision), not the result, which cancellation can make arbitrarily small
(measured: inductor's CPU mean of 2880 centred float32 values is 396 ULPs off at the result's
magnitude, eager's 49, and both are under 0.4 ULPs of the summands' mean), widened with the
number of terms and by the precision the op accumulates in. The tolerance judge measures such an
op's relative error against the same scale. The module says how each is derived and what a
correct GPU measured against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from casedb.judge import judges
from casedb.judge.selectors import Selector, case_norms

IN_REPRO = False  # not copied into repro scripts (casedb.read.repro reads every judge module's)

# torch.testing.assert_close's defaults, keyed by the compared tensor's dtype.
DTYPE_DEFAULTS = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7),
    # no torch.testing default: one step of the 3-bit mantissa
    "float8_e4m3fn": (0.125, 1e-3), "float8_e5m2": (0.25, 1e-3), "float8_e4m3fnuz": (0.125, 1e-3),
    "float8_e5m2fnuz": (0.25, 1e-3),
}
EXACT = (0.0, 0.0)               # integers and bools: equal
JUDGES = tuple(judges.JUDGES)  # the names; each one's row: casedb.judge.judges
DEFAULT_JUDGE = "both"
ULP_K = 4.0
ULP_FLOOR = 4.0
# The high-precision reference is skipped (the case is judged by tolerance) when its upcast
# inputs would take more than this: a 100k-vocabulary embedding in float64 is 3 GiB.
HI_REFERENCE_BYTES = 512 * 2**20
RULE_KEYS = ("op", "name", "model", "signature", "device", "backend", "dtype", "rtol", "atol")
_SELECTOR_KEYS = ("op", "name", "model", "signature", "device", "backend", "dtype")


def default_tolerance(dtype: str) -> tuple[float, float]:
    return DTYPE_DEFAULTS.get(dtype, EXACT)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    source: str
    # Set for this case on purpose (the case itself, a rule, the caller): the ULP judge then
    # stands aside, so a tolerance written down is never overruled. The manifest default and the
    # dtype table are not: they are the policy's guesses, which the ULP judge refines.
    explicit: bool = False


@dataclass(frozen=True)
class Rule:
    """A tolerance rule: selector values (casedb.judge.selectors) and the rtol/atol it sets."""

    rtol: float | None = None
    atol: float | None = None
    op: str | None = None
    name: str | None = None
    model: str | None = None
    signature: str | None = None
    device: str | None = None
    backend: str | None = None
    dtype: str | None = None
    where: str = ""
    order: int = 0
    selector: Selector = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        values = {k: getattr(self, k) for k in _SELECTOR_KEYS if getattr(self, k) is not None}
        object.__setattr__(self, "selector", Selector(values))

    def specificity(self) -> tuple:
        """The selector's rank; ``order`` breaks ties (the later rule wins)."""
        return self.selector.rank + (self.order,)

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("signature", "name", "op", "model", "device", "backend", "dtype")
                 if getattr(self, k) is not None]
        return f"rule {self.where} ({', '.join(parts) or 'every case'})"


@dataclass
class Policy:
    """Tolerances for one target (device, backend) under a set of rules."""

    rules: list = field(default_factory=list)
    device: str = "cpu"
    backend: str = "eager"

    def tolerances(self, occ: dict, case: dict, dtypes) -> dict[str, Tolerance]:
        """dtype name -> Tolerance for an occurrence (plan.PlanItem occurrence dict) of ``case``."""
        return {d: self.tolerance(occ, case, d) for d in dtypes}

    def tolerance(self, occ: dict, case: dict, dtype: str) -> Tolerance:
        defaults = occ.get("defaults") or {}
        norms = case_norms({"op": case["op"], "name": occ["name"], "model": occ["model"],
                            "signature": case.get("signature", ""), "dtype": dtype})
        target = {"device": self.device, "backend": self.backend}
        matching = [r for r in self.rules if r.selector.matches(norms, target)]
        matching.sort(key=Rule.specificity, reverse=True)
        values, sources, chosen = {}, {}, False
        for key in ("rtol", "atol"):
            if occ.get(key) is not None:
                values[key], sources[key], chosen = occ[key], "the case", True
                continue
            rule = next((r for r in matching if getattr(r, key) is not None), None)
            if rule is not None:
                values[key], sources[key], chosen = getattr(rule, key), rule.describe(), True
            elif defaults.get(key) is not None and (defaults.get("dtype") or "float32") == dtype:
                values[key], sources[key] = defaults[key], f"the manifest default for {dtype}"
            else:
                values[key] = default_tolerance(dtype)[0 if key == "rtol" else 1]
                sources[key] = f"the {dtype} default" if dtype in DTYPE_DEFAULTS else f"exact ({dtype})"
        source = (sources["rtol"] if sources["rtol"] == sources["atol"]
                  else f"rtol: {sources['rtol']}; atol: {sources['atol']}")
        return Tolerance(float(values["rtol"]), float(values["atol"]), source, explicit=chosen)


def high_precision(dtypes) -> str:
    """The dtype of the high-precision reference for outputs of these dtypes."""
    narrow = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
    return "float32" if dtypes and all(d in narrow for d in dtypes) else "float64"
