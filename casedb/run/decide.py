"""The final verdict of one model occurrence, decided in one place before anything records it.

:func:`final_verdict` is the judge's caller: it judges the execution with the occurrence's own
expectations (its tolerances, ``expects_error`` and ``xfail_if``: casedb.judge.verdict.judge)
and reads the result under the run's triage files (:func:`expected`: a known failure is
``xfailed``, a known failure that passes ``xpassed``, a regression or a new failure named so), and
returns that one :class:`~casedb.judge.verdict.Verdict`. ``casedb run`` and a pytest session run
cases through the same core (casedb.run.target.execute_item), so both decide here; a case whose
worker reported nothing (crashed, timeout) is read under the same files by :func:`expected`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from casedb import triage as triage_mod
from casedb.cases.safe_eval import evaluate_condition


@dataclass(frozen=True)
class Expected:
    """A raw outcome as the run's triage files read it."""

    outcome: str
    reason: str
    triage: str | None   # known, expected, regression, new, unspecified (casedb.triage.entries.verdict)
    where: str | None    # the entry's file:line (None: no entry)


def first_true(conditions, env: dict) -> str | None:
    """The reason of the first condition (``{expr, reason}``: skip_if, xfail_if) true in ``env``."""
    for cond in conditions or ():
        if evaluate_condition(cond["expr"], env):
            return cond.get("reason") or cond["expr"]
    return None


def triage_target(target) -> dict:
    """What a triage entry's target selectors match: the device, backend and arch run on."""
    return {"device": target.device, "backend": target.backend, "arch": target.arch}


def expected(triage, entry, outcome: str, reason: str, stage: str | None, on: dict | None = None) -> Expected:
    """``outcome`` read under the run's triage files (``triage``: a casedb.triage.entries.Triage or
    None; ``entry``: the occurrence's, or None; ``on``: the target, which a hint names)."""
    t = triage_mod.verdict(entry, outcome, stage=stage, unlisted=triage.unlisted if triage else "unspecified",
                           target=on)
    out, why = t["outcome"] or outcome, reason
    if out != outcome and t["reason"]:
        # an entry `triage update` wrote holds the failure's own reason (cut short): say it once
        said = t["reason"].removesuffix("...").removesuffix("…")
        why = reason if reason.startswith(said) else f"{t['reason']}: {reason}"
    if t["hint"] and t["triage"] != "new":  # (a new failure's hint is the summary's, once per run)
        why = f"{why} [{t['hint']}]"
    return Expected(out, why, t["triage"], t["where"])


def final_verdict(ex, occ, env: dict, entry, *, tolerances: dict, target, triage):
    """The verdict of occurrence ``occ`` (casedb.run.plan.Occurrence) of execution ``ex`` on
    ``target``, final: judged with its own expectations, then read under the run's triage files
    (``entry``: its entry in them, or None). ``env``: what its xfail_if condition sees."""
    from casedb.judge.verdict import judge  # (imports torch: only the processes that run cases pay for it)

    xfail = first_true([occ.xfail] if occ.xfail else None, env)
    v = judge(ex, tolerances=tolerances, judge=target.judge, expects_error=occ.expects_error, xfail=xfail,
              xfail_strict=(occ.xfail or {}).get("strict", True))
    read = expected(triage, entry, v.outcome, v.reason, v.stage, triage_target(target))
    return replace(v, outcome=read.outcome, reason=read.reason, triage=read.triage, triage_where=read.where)
