"""What a run is, so that runs can be told apart: its front end, what it selected (in words) and
whether it re-ran part of an earlier run.

* :func:`front_end`: ``casedb run``, ``pytest``, ``casedb mutants``, or ``merge`` (a run copied
  or combined from other databases);
* :func:`selection_words`: the selection options that narrow a run (models, ops, ``-k``, ``-m``,
  shard, limit, size, values), e.g. ``model granite4h; shard 2/4`` — runs with the same words and
  target ran the same cases and compare like with like;
* :func:`rerun_of`: a run whose judged occurrences are a strict subset of an earlier run's on the
  same target (pytest ``--lf``, an ``--op`` or ``-k`` narrowing, one shard after the whole) is a
  partial rerun of it: ``casedb report``, the Datasette pages and the dashboard lead with the
  latest run that is not (:data:`LATEST_FULL_RUN`).
"""

from __future__ import annotations

import datetime as _dt

from casedb.serial import loads

MUTANT_LABEL = "mutant:"  # labels of the runs `casedb mutants` makes start with it
# SQL true for a runs row that `casedb mutants` did not make: the one spelling of "not a mutant
# run" (runs --no-mutants, report's default run, the dashboard's latest run)
NOT_MUTANT_RUN = f"(label IS NULL OR label NOT GLOB '{MUTANT_LABEL}*')"
# ... and not a partial rerun (its summary's rerun_of, set when it was summarized; a running run
# has no summary yet and counts): the runs report and the dashboard lead with
FULL_RUN = f"{NOT_MUTANT_RUN} AND (CASE WHEN json_valid(summary) THEN json_extract(summary, '$.rerun_of') END) IS NULL"
# newest first, stopping at the first: only the summaries of the newest runs are read
LATEST_FULL_RUN = f"SELECT (SELECT id FROM runs WHERE {FULL_RUN} ORDER BY id DESC LIMIT 1)"
CANDIDATES = 20  # earlier runs looked at for the one a run re-ran part of


def front_end(selection: dict | None) -> str | None:
    """How the run was started: ``casedb run``, ``pytest``, ``casedb mutants``, or ``merge``."""
    sel = selection or {}
    if sel.get("merged_from"):
        return "merge"
    source = sel.get("source")
    return source if isinstance(source, str) else None


def selection_words(selection: dict | None) -> str:
    """The options that narrow what a run selected, in words ("all models" when none do)."""
    opts = (selection or {}).get("options") or {}
    if not isinstance(opts, dict):
        return "?"
    models = opts.get("models") or []
    words = [f"model {', '.join(map(str, models))}" if models else "all models"]
    ops = opts.get("op") or []
    if ops:
        words.append(f"op {', '.join(map(str, ops if isinstance(ops, list) else [ops]))}")
    for key, shown in (("keyword", "-k"), ("shard", "shard"), ("limit", "limit"), ("max_numel", "max-numel")):
        if opts.get(key) not in (None, ""):
            words.append(f"{shown} {opts[key]}")
    if opts.get("markexpr") is None and (selection or {}).get("source") == "pytest":
        words.append("-m default")  # the pytest front end's RFC default filter
    elif opts.get("markexpr"):
        words.append(f"-m {opts['markexpr']}")
    if opts.get("values") not in (None, "random"):
        words.append(f"{opts['values']} values")
    if opts.get("dedupe") is False:
        words.append("every occurrence")
    return "; ".join(words)


def duration_s(started_at: str | None, finished_at: str | None) -> float | None:
    try:
        return round((_dt.datetime.fromisoformat(finished_at) - _dt.datetime.fromisoformat(started_at))
                     .total_seconds(), 3)
    except (TypeError, ValueError):
        return None


def rerun_of(conn, run_id: int) -> int | None:
    """The latest earlier full run on the same target whose judged occurrences strictly include
    every occurrence run ``run_id`` judged; None when there is none (the run is a full run)."""
    run = conn.execute("SELECT device, backend, selection FROM runs WHERE id = ?", [run_id]).fetchone()
    mine = conn.execute("SELECT count(*) FROM judgements WHERE run_id = ?", [run_id]).fetchone()[0]
    if run is None or not mine:
        return None
    values = _values(run[2])
    for earlier, selection in conn.execute(
            f"SELECT id, selection FROM runs WHERE id < ? AND device IS ? AND backend IS ? AND {FULL_RUN}"
            " ORDER BY id DESC LIMIT ?", [run_id, run[0], run[1], CANDIDATES]).fetchall():
        if _values(selection) != values:
            continue
        theirs = conn.execute("SELECT count(*) FROM judgements WHERE run_id = ?", [earlier]).fetchone()[0]
        if theirs <= mine:
            continue
        outside = conn.execute(
            """SELECT count(*) FROM judgements j WHERE j.run_id = ? AND NOT EXISTS
               (SELECT 1 FROM judgements e WHERE e.run_id = ? AND e.model_case_id = j.model_case_id
                AND e.signature = j.signature)""", [run_id, earlier]).fetchone()[0]
        if not outside:
            return earlier
    return None


def _values(selection: str | None) -> str:
    """The inputs' values a run ran with (random or extremal: results of one case apart)."""
    try:
        return ((loads(selection) or {}).get("options") or {}).get("values") or "random"
    except (ValueError, AttributeError):
        return "random"
