"""What a case's outcome can be, what each means, how bad it is and what it counts as: the one list.

The run summary, the exit status of ``casedb run``, the progress line, the pytest report and the
``outcome_classes`` table behind the report views all read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    name: str
    verdict: str        # class in the report views: pass, fail, error, xfail, skip, ref_error
    executed: bool      # counts in a pass rate's denominator
    passed: bool
    failing: bool       # what a regression turns into
    unexpected: bool    # makes `casedb run` exit 1
    key: str            # key of the JSON summary
    style: str          # Rich style of its count
    meaning: str
    stage: str | None = None  # the failure stage (STAGES) it has when nothing more telling is known


# Worst first: a case judged for several models takes the worst of its verdicts.
OUTCOMES = (
    Outcome("crashed", "error", True, False, True, True, "crashed", "red", "the worker process died", "crash"),
    Outcome("timeout", "error", True, False, True, True, "timeouts", "red", "ran past the time limit", "timeout"),
    Outcome("error", "error", True, False, True, True, "errors", "red",
            "the device/backend raised an unexpected error", "runtime"),
    Outcome("failed", "fail", True, False, True, True, "failed", "red", "ran, but the output is outside tolerance",
            "incorrect result"),
    Outcome("xpassed", "pass", True, True, False, True, "xpassed", "red",
            "passed although marked xfail: remove the xfail"),
    Outcome("ref_error", "ref_error", False, False, False, False, "ref_errors", "yellow",
            "the CPU eager reference itself failed: a bad case"),
    Outcome("not_exercised", "not_exercised", False, False, False, False, "not_exercised", "yellow",
            "the target never computed the op (the backend was not called, got an empty graph, or the output "
            "is not on the target device): proves nothing"),
    Outcome("xfailed", "xfail", True, False, False, False, "xfailed", "yellow", "failed as its xfail mark expects"),
    Outcome("passed", "pass", True, True, False, False, "passed", "green",
            "matched the CPU reference within the occurrence's tolerance"),
    Outcome("skipped", "skip", False, False, False, False, "skipped", "dim",
            "not run (skip_if, marks or an unsupported dtype)"),
)

# The order counts are shown in (summaries, tables): passes first, then what needs a look.
SHOWN = ("passed", "failed", "error", "crashed", "timeout", "xfailed", "xpassed", "ref_error", "not_exercised",
         "skipped")

# Where a case that did not pass went wrong, in the order a case goes through them.
STAGES = ("resolve", "input build", "reference", "compile: dynamo trace", "compile: lowering",
          "compile: backend compiler", "runtime", "incorrect result", "not exercised", "crash", "timeout")

BY_NAME = {o.name: o for o in OUTCOMES}
NAMES = tuple(o.name for o in OUTCOMES)
UNEXPECTED = frozenset(o.name for o in OUTCOMES if o.unexpected)
FAILING = frozenset(o.name for o in OUTCOMES if o.failing)    # crashed, timeout, error, failed
PASSING = frozenset(o.name for o in OUTCOMES if o.passed)     # xpassed, passed
COUNT_KEYS = {o.name: o.key for o in OUTCOMES}
# The longest time limit a case may have (the `timeout` outcome's bound, in seconds): beyond a week
# is a typo, and pytest-timeout cannot arm 1e30 s. `casedb run --timeout` and triage entries both keep to it.
MAX_TIMEOUT = 7 * 24 * 3600.0


def severity(name: str) -> int:
    """Lower is worse; an unknown outcome sorts last."""
    return NAMES.index(name) if name in BY_NAME else len(NAMES)


def failure_stage(name: str) -> str | None:
    """The stage (:data:`STAGES`) of a failing outcome recorded without one; None for the others."""
    found = BY_NAME.get(name)
    return found.stage if found else None


def worst(names) -> str:
    return min(names, key=severity)


def class_rows() -> list[dict]:
    """Rows of the ``outcome_classes`` table (what the report views count)."""
    return [{"outcome": o.name, "verdict": o.verdict, "executed": int(o.executed), "passed": int(o.passed),
             "failing": int(o.failing), "meaning": o.meaning} for o in OUTCOMES]
