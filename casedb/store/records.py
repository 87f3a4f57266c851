"""The typed records that cross between a run and the store: what one executed case hands the
recorder (:class:`Payload`: its :class:`ResultRow` and a :class:`Judgement` per model occurrence)
and what the store hands back when a run closes (:class:`RunSummary`, which ``casedb run`` returns
and prints with ``--json``). The payload travels as JSON through pytest's reports (from an xdist
worker to the recording process), so each record is a TypedDict: plain data, typed at the seams.
It imports only ``typing`` and the column list: the plugin's processes read it before opening a DB."""

from __future__ import annotations

from typing import Any, Optional, TypedDict

from casedb.store.result_columns import ResultColumns

# (Optional[...] rather than X | None: the annotations of a TypedDict may be evaluated on 3.10)


class ResultRow(ResultColumns, total=False):
    """A ``results`` row as a payload carries it: the columns (casedb.store.result_columns; a case
    that never ran fills only some) and ``metrics``, everything else the execution and the verdict
    measured (stored as JSON)."""

    metrics: dict


class Judgement(TypedDict):
    """One model occurrence's final verdict (casedb.run.decide), a ``judgements`` row."""

    model_case_id: Optional[int]
    model: str
    name: str
    outcome: str
    reason: str
    rtol: Optional[float]
    atol: Optional[float]
    stage: Optional[str]
    triage: Optional[str]        # how the run's triage files read it: known, new, regression... (None: not read)
    triage_where: Optional[str]  # the entry's file:line


class _PayloadBase(TypedDict):
    outcome: str                       # the worst occurrence's
    reason: str
    result: Optional[ResultRow]        # None: nothing ran (every occurrence skipped)
    judgements: list[Judgement]


class Payload(_PayloadBase, total=False):
    """What the process that ran a case hands the recorder (casedb.run.target.execute_item, or
    lost_payload for a case whose worker reported nothing)."""

    device: Optional[str]              # the device it ran on, resolved (a run started without --device)


class RunSummary(TypedDict, total=False):
    """A run's figures (casedb.store.run_figures.summarize), with what closing it and the session
    add; ``casedb run --json`` prints the keys casedb.run.console.JSON_KEYS names."""

    run_id: int
    status: str
    device: Optional[str]
    backend: Optional[str]
    started_at: Optional[str]
    finished_at: Optional[str]
    # the counts (history.run_counts): each outcome under its key (casedb.outcomes.COUNT_KEYS)
    executed: int
    passed: int
    failed: int
    errors: int
    ref_errors: int
    not_exercised: int
    crashed: int
    timeouts: int
    skipped: int
    xfailed: int
    xpassed: int
    occurrences: int
    cases: int
    duplicates_skipped: int
    unexpected: int
    pass_rate: Optional[float]
    # what the run measured and how it reads
    judge: Optional[str]
    values: str
    bias: dict
    reference_faults: int
    latency: Optional[dict]
    vacuous: int
    lowering: dict
    stages: dict
    triage: dict
    failures: list[dict]
    planned: Optional[dict]
    options: Optional[dict]
    triage_files: list[str]
    time: dict
    models: dict
    duration_s: Optional[float]
    front_end: Optional[str]
    selected: str
    rerun_of: Optional[int]
    # closing the run (history.finish_run)
    session: dict
    error: str
    fatal: str
    # the session that ran it (casedb.run.runner.run; casedb run --explain)
    pytest_exit_code: int
    triage_implicit: list[str]
    explanations: Any
