"""Judging an executed case: :func:`judge` turns an :class:`~casedb.judge.execution.Execution`
into a :class:`Verdict` for one model occurrence (its tolerances, expected error and xfail).

The parts, in the order a verdict is reached: the tolerances of each compared dtype
(:func:`_tolerances`), a reference that failed (:func:`_judge_reference_error`), a target that
was expected to raise (:func:`_judge_expected_error`), a target error, a reference that raised as
expected (:func:`_judge_against_upcast`), the comparison the judge decides by (:func:`_compared`),
then ``xfail`` (:func:`_apply_xfail`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from casedb.judge import bias, judges, numerics
from casedb.judge.compare import Comparison, compare
from casedb.judge.execution import ErrorInfo, Execution

IN_REPRO = False  # not copied into repro scripts (casedb.read.repro reads every judge module's)


@dataclass
class Verdict:
    outcome: str                                 # passed, failed, error, ref_error, xfailed, xpassed, not_exercised
    reason: str
    compare_mode: str
    rtol: float
    atol: float
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatch_count: int | None = None
    numel: int | None = None
    nan_inf_mismatch: bool | None = None
    where: str | None = None
    max_abs_err_hi: float | None = None          # target vs upcast reference
    max_rel_err_hi: float | None = None
    ref_max_abs_err_hi: float | None = None      # CPU reference vs upcast reference
    ref_max_rel_err_hi: float | None = None
    deterministic: bool | None = None
    t_ref: float | None = None
    t_compile: float | None = None
    t_exec: float | None = None
    error_phase: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    judge: str | None = None                     # tolerance | ulp | both
    tolerance: str | None = None                 # where the output's tolerance came from
    tolerances: dict | None = None               # dtype -> [rtol, atol, source]
    ulp_err: float | None = None                 # the target's error in ULPs (judge ulp/both)
    ref_ulp_err: float | None = None             # the CPU reference's own error in ULPs
    vacuous: str | None = None                   # "zero" / "constant": the reference cannot catch a bug
    bias_mean: float | None = None               # the target's mean signed error in ULPs (casedb.judge.bias)
    bias_toward: float | None = None             # ... toward the reference's magnitude (truncation: -0.5)
    bias_count: int | None = None                # ... over this many elements
    ref_faults: int | None = None                # elements where the CPU reference's NaN/inf are wrong, the target's right
    stage: str | None = None                     # where it failed (casedb.outcomes.STAGES), for a result that is not a pass
    triage: str | None = None                    # how the run's triage files read it (known, new...): set by the
    triage_where: str | None = None              # judge's caller, casedb.run.decide, with the entry's file:line

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def _expectations(expects_error: dict | None, device: str) -> tuple[dict | None, dict | None]:
    """(reference spec, target spec) from ``{"type", "match"}`` or ``{"ref": ..., "<device>": ...}``."""
    if not expects_error:
        return None, None
    if "type" in expects_error:
        return expects_error, expects_error
    dev = torch.device(device)
    tgt = expects_error.get(str(dev)) or expects_error.get(dev.type) or expects_error.get("target")
    # the reference runs on the CPU: what is declared for the CPU is declared for it, whatever the target
    return expects_error.get("ref") or expects_error.get("cpu"), tgt


def _cpu_limit(expects_error: dict, err) -> bool:
    """The target raised what the case declares the CPU raises (``{cpu: ...}``; a ``ref``-only
    declaration is the reference's alone)."""
    cpu = expects_error.get("cpu") if "type" not in expects_error else None
    return err is not None and bool(cpu) and err.matches(cpu)


def _describe_spec(spec: dict) -> str:
    m = spec.get("match")
    return f"{spec.get('type')}" + (f" matching {m!r}" if m else "")


def _short(msg: str, n: int = 300) -> str:
    """The start of a message on one line (lines joined with ' | ')."""
    msg = " | ".join(line.strip() for line in msg.strip().splitlines() if line.strip())
    return msg if len(msg) <= n else msg[: n - 1] + "…"



def judge(execution: Execution, *, rtol: float | None = None, atol: float | None = None,
          tolerances: dict | None = None, judge: str = numerics.DEFAULT_JUDGE, expects_error: dict | None = None,
          xfail: str | None = None, xfail_strict: bool = True) -> Verdict:
    """The verdict for one model occurrence of an executed case.

    ``tolerances``: dtype name -> :class:`casedb.judge.numerics.Tolerance` (or ``(rtol, atol)``) for
    each compared dtype (:meth:`casedb.judge.numerics.Policy.tolerances`); ``rtol``/``atol`` instead
    give every part the same. ``judge``: a name of casedb.judge.judges.JUDGES (see casedb.judge.numerics;
    a tolerance written down for the case is never overruled: such a case is judged by tolerance).
    ``expects_error``: ``{"type", "match"}`` — the target must raise it (the reference may raise
    it too), else ``xpassed``; or ``{"ref": {...}, "<device type or device>": {...}}`` per side.
    ``xfail``: the occurrence is expected to fail (reason text): failed/error become ``xfailed``
    and passed becomes ``xpassed``. A target that never computed the op is ``not_exercised``,
    never ``passed``.
    """
    ex = execution
    if judge not in judges.JUDGES:
        raise ValueError(f"judge must be one of {', '.join(judges.JUDGES)}, not {judge!r}")
    tols = _tolerances(ex, rtol, atol, tolerances)
    pairs = {d: (t.rtol, t.atol) for d, t in tols.items()}
    main = tols.get((ex.dtypes() or [None])[0]) or next(iter(tols.values()), None)
    if judges.JUDGES[judge].by_ulp and main is not None and main.explicit:
        judge = "tolerance"  # a tolerance written down for the case is never overruled
    v = Verdict(outcome="passed", reason="", compare_mode=ex.compare_mode,
                rtol=main.rtol if main else float(rtol or 0.0), atol=main.atol if main else float(atol or 0.0),
                deterministic=ex.deterministic, t_ref=ex.t_ref, t_compile=ex.t_compile, t_exec=ex.t_exec,
                judge=judge, tolerance=main.source if main else None,
                tolerances={d: [t.rtol, t.atol, t.source] for d, t in tols.items()} or None,
                vacuous=ex.vacuous(pairs))
    ref_spec, tgt_spec = _expectations(expects_error, ex.device)
    err = ex.ref_error
    ref_expected = (err is not None and err.phase not in ("resolve", "materialize") and bool(ref_spec)
                    and err.matches(ref_spec))
    if err is not None and not ref_expected:
        return _judge_reference_error(v, err, ref_spec)  # (xfail does not turn a bad case into a pass)
    if tgt_spec:
        _judge_expected_error(v, ex, tgt_spec, pairs)
    elif ref_expected and _cpu_limit(expects_error, ex.target_error):
        # the target runs into the CPU's declared limitation (a device that calls the CPU's
        # kernel): the declaration covers it, no triage entry per device needed
        _error_fields(v, ex.target_error)
        v.outcome = "xfailed"
        v.reason = (f"raised the error declared for the CPU ({_describe_spec(expects_error['cpu'])}): "
                    f"{ex.target_error.type}: {_short(ex.target_error.message)}")
    elif ex.target_error is not None:
        terr = ex.target_error
        v.outcome, v.reason, v.stage = "error", f"{terr.phase}: {terr.type}: {_short(terr.message)}", ex.stage
        _error_fields(v, terr)
    elif ref_expected:
        _judge_against_upcast(v, ex)
    else:
        _judge_result(v, ex, pairs)
    return _apply_xfail(v, xfail, xfail_strict)


def _tolerances(ex: Execution, rtol, atol, tolerances: dict | None) -> dict:
    """dtype -> Tolerance: the given ones, and ``rtol``/``atol`` for every compared dtype (float32
    when none) that has none."""
    def given(r, a) -> numerics.Tolerance:  # the caller's: never overruled
        return numerics.Tolerance(float(r or 0.0), float(a or 0.0), "given", explicit=True)

    tols = {d: (t if isinstance(t, numerics.Tolerance) else given(*t)) for d, t in (tolerances or {}).items()}
    if rtol is not None or atol is not None:
        for d in ex.dtypes() or ["float32"]:
            tols.setdefault(d, given(rtol, atol))
    return tols


def _error_fields(v: Verdict, err: ErrorInfo) -> None:
    d = err.to_dict()
    v.error_phase, v.error_type, v.error_message, v.traceback = (
        d["error_phase"], d["error_type"], d["error_message"], d["traceback"])


def _judge_reference_error(v: Verdict, err: ErrorInfo, ref_spec: dict | None) -> Verdict:
    """The case is bad: its op cannot be resolved, its inputs cannot be built, or the CPU
    reference raised (other than as expected)."""
    v.outcome = "ref_error"
    what = {"resolve": "the op cannot be resolved", "materialize": "the inputs cannot be built"}.get(
        err.phase, "the CPU reference raised")
    v.reason = f"{what}: {err.type}: {_short(err.message)}"
    if ref_spec:
        v.reason += f" (expected {_describe_spec(ref_spec)})"
    v.stage = {"resolve": "resolve", "materialize": "input build"}.get(err.phase, "reference")
    _error_fields(v, err)
    return v


def _judge_expected_error(v: Verdict, ex: Execution, tgt_spec: dict, pairs: dict) -> None:
    """The target must raise ``tgt_spec``: xfailed when it does, error when it raises something
    else, xpassed when it does not raise."""
    terr = ex.target_error
    if terr is not None:
        _error_fields(v, terr)
        if terr.matches(tgt_spec):
            v.outcome = "xfailed"
            v.reason = f"raised the expected {terr.type}: {_short(terr.message)}"
        else:
            v.outcome = "error"
            v.reason = (f"expected {_describe_spec(tgt_spec)}, but {terr.phase} raised "
                        f"{terr.type}: {_short(terr.message)}")
            v.stage = ex.stage
        return
    v.outcome = "xpassed"
    c = _compared(v, ex, pairs)
    tail = "" if c is None else (" (its result matches the reference)" if c.passed
                                 else f" (and its result differs: {c.reason})")
    v.reason = f"expected {_describe_spec(tgt_spec)}, but the target did not raise{tail}"


def _judge_against_upcast(v: Verdict, ex: Execution) -> None:
    """The CPU reference raised as expected: the target is compared with the upcast reference,
    if there is one."""
    if ex.reference_hi is not None and ex.target is not None:
        # the upcast reference's parts are float32/float64: the output dtype's tolerance applies
        c = compare(ex.reference_hi, ex.target, rtol=v.rtol, atol=v.atol, mode=ex.compare_mode, check_dtype=False)
        v.max_abs_err, v.max_rel_err, v.mismatch_count = c.max_abs_err, c.max_rel_err, c.mismatch_count
        v.outcome = "passed" if c.passed else "failed"
        v.reason = f"against the {ex.reference_dtype} reference (the CPU reference raised as expected): {c.reason}"
        return
    v.outcome = "ref_error"
    v.reason = (f"the CPU reference raised the expected {ex.ref_error.type}, so there is nothing to "
                f"compare the target with (give a reference_dtype to compare against an upcast reference)")
    v.stage = "reference"
    _error_fields(v, ex.ref_error)


def _judge_result(v: Verdict, ex: Execution, pairs: dict) -> None:
    """Both sides ran: the comparison decides, then determinism, then whether the op was exercised."""
    c = _compared(v, ex, pairs)
    if c is not None and judges.JUDGES[v.judge].by_ulp:
        c = bias.decide(ex, v, c)
    if c is None:
        v.outcome, v.reason = "error", "no result to compare"
    elif not c.comparable:  # nothing but opaque objects: no difference seen, nothing verified
        v.outcome, v.reason, v.stage = "not_exercised", c.reason, "not exercised"
    elif not c.passed:
        v.outcome, v.reason, v.stage = "failed", c.reason, "incorrect result"
        if ex.notes.get("reduced_precision_reduction"):
            v.reason += (f" ({ex.notes['reduced_precision_reduction']} was True: cuBLAS may sum split-K partials "
                         "in the output dtype; to judge the kernel alone, --import a module that sets it False)")
    elif ex.deterministic is False:
        v.outcome, v.reason, v.stage = "failed", f"nondeterministic: {ex.determinism_detail}", "incorrect result"
    elif not ex.exercised:
        v.outcome, v.reason, v.stage = "not_exercised", f"not exercised: {ex.not_exercised}", "not exercised"
    else:
        v.outcome, v.reason = "passed", c.reason
    if v.ref_faults:
        v.reason += (f"; the CPU reference is wrong at {v.ref_faults} element{'s' * (v.ref_faults != 1)}: its NaN/inf "
                     f"disagree with the {ex.reference_dtype} reference's, which the target's agree with")


def _compared(v: Verdict, ex: Execution, pairs: dict) -> Comparison | None:
    """The comparison ``v.judge``'s row decides by (casedb.judge.judges), with the
    errors it measured written into ``v``; None when a side has no result."""
    values = ex.comparison(tolerances=pairs)
    if values is None:
        return None
    v.max_abs_err, v.max_rel_err, v.mismatch_count = values.max_abs_err, values.max_rel_err, values.mismatch_count
    v.numel, v.nan_inf_mismatch, v.where = values.numel, values.nan_inf_mismatch, values.where
    v.ref_faults = values.ref_faults or None
    hi, ref_hi = ex.comparisons_hi(pairs)
    if hi is not None:
        v.max_abs_err_hi, v.max_rel_err_hi = hi.max_abs_err, hi.max_rel_err
    if ref_hi is not None:
        v.ref_max_abs_err_hi, v.ref_max_rel_err_hi = ref_hi.max_abs_err, ref_hi.max_rel_err
    row = judges.JUDGES[v.judge]
    if not row.by_ulp:
        return row.decide(values, None)
    ulp = ex.comparison(tolerances=pairs, judge="ulp")
    v.ulp_err, v.ref_ulp_err = ulp.ulp_err, ulp.ref_ulp_err
    v.ref_faults = max(values.ref_faults, ulp.ref_faults) or None
    return row.decide(values, ulp)


def _apply_xfail(v: Verdict, xfail: str | None, strict: bool = True) -> Verdict:
    """An occurrence expected to fail: a pass is xpassed (not ``strict``: passed), a failure or
    error xfailed."""
    if xfail and v.outcome in ("passed", "failed", "error"):
        if v.outcome == "passed" and not strict:
            v.reason = f"{v.reason} (expected to fail, not strictly: {xfail})"
        elif v.outcome == "passed":
            v.outcome, v.reason = "xpassed", f"expected to fail ({xfail}) but passed"
        else:
            v.outcome, v.reason = "xfailed", f"{xfail}: {v.reason}"
    return v
