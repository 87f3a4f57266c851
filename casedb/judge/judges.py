"""The judges ``--judge`` chooses from: one row each. The verdict (casedb.judge.verdict), the run
(which references it computes: casedb.run.target) and the repro script (this module is copied
into it) read a judge's row, never its name. A new judge is one row (docs/extending.md).

Every command imports this table (the run's options list the judges), so it imports no torch:
a decision gets its comparisons (casedb.judge.compare.Comparison) and builds one of their type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)


@dataclass(frozen=True)
class Judge:
    name: str
    about: str
    # Measures against the upcast reference in ULPs: the run computes that reference, the bias
    # judge checks what it passes, and a tolerance written for a case overrules it.
    by_ulp: bool
    # (values comparison, ULP comparison or None) -> the comparison that decides
    decide: Callable


def _by_values(values, ulp):
    return values


def _by_ulp(values, ulp):
    return values if ulp is None else ulp


def _by_both(values, ulp):
    """The first that fails decides; a pass says what both found (ULPs only where measured)."""
    if ulp is None or ulp.ulp_err is None or not values.passed:
        return values
    if not ulp.passed:
        return ulp
    return type(values)(passed=True, reason=f"{values.reason}; {ulp.reason}", mode="both",
                      comparable=values.comparable, opaque=values.opaque,
                      ref_faults=max(values.ref_faults, ulp.ref_faults))


JUDGES = {j.name: j for j in (
    Judge("tolerance", "rtol/atol per output dtype", False, _by_values),
    Judge("ulp", "error against a high-precision CPU reference, in ULPs, relative to the CPU reference's own", True,
          _by_ulp),
    Judge("both", "tolerance, then ULPs: the first that fails", True, _by_both),
)}
