"""The columns of ``results`` a run records, each with where the run's payload takes it from: the
one list the store's insert (casedb.store.recorder) and the payload of an executed case
(casedb.run.target) derive their keys from. It imports only typing: the plugin's processes read it
before they open a DB."""

from typing import Annotated, Optional, TypedDict

VERDICT = "verdict"  # the judge's Verdict field of the same name (casedb.judge.verdict)
RUN = "run"          # set by casedb.run.target: the worst occurrence's outcome, the execution's figures, the values


class ResultColumns(TypedDict, total=False):
    """The one list: one ``results`` row as a run fills it (besides the recorder's own columns:
    run, case, timing, ``metrics``), each column's type annotated with where it comes from (VERDICT
    or RUN). RESULT_COLUMNS and the typed records between run and store (casedb.store.records)
    derive from it; it imports only ``typing``."""

    outcome: Annotated[str, RUN]
    reason: Annotated[str, RUN]
    compare_mode: Annotated[Optional[str], RUN]
    max_abs_err: Annotated[Optional[float], VERDICT]
    max_rel_err: Annotated[Optional[float], VERDICT]
    mismatch_count: Annotated[Optional[int], VERDICT]
    nan_inf_mismatch: Annotated[Optional[int], RUN]
    t_ref: Annotated[Optional[float], RUN]
    t_compile: Annotated[Optional[float], RUN]
    t_exec: Annotated[Optional[float], RUN]
    error_type: Annotated[Optional[str], VERDICT]
    error_message: Annotated[Optional[str], VERDICT]
    traceback: Annotated[Optional[str], VERDICT]
    stage: Annotated[Optional[str], VERDICT]
    judge: Annotated[Optional[str], VERDICT]
    tolerance: Annotated[Optional[str], VERDICT]
    ulp_err: Annotated[Optional[float], VERDICT]
    ref_ulp_err: Annotated[Optional[float], VERDICT]
    vacuous: Annotated[Optional[str], VERDICT]
    exercised: Annotated[Optional[int], RUN]
    lowering: Annotated[Optional[str], RUN]
    bias_mean: Annotated[Optional[float], VERDICT]
    bias_toward: Annotated[Optional[float], VERDICT]
    bias_count: Annotated[Optional[int], VERDICT]
    input_values: Annotated[Optional[str], RUN]


# (no `from __future__ import annotations` here: the annotations are objects, read as they are)
RESULT_SOURCES = {name: hint.__metadata__[0] for name, hint in ResultColumns.__annotations__.items()}
RESULT_COLUMNS = tuple(RESULT_SOURCES)
FROM_VERDICT = tuple(k for k, source in RESULT_SOURCES.items() if source == VERDICT)
# the columns of `results` the recorder fills itself (besides `id`): the table is these and RESULT_COLUMNS
RECORDER_COLUMNS = ("run_id", "signature", "model_case_id", "metrics", "duration", "worker", "test_id", "created_at")
