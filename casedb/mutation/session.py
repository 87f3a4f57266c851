"""The backends of ``casedb mutants`` in one pytest session: the control and every mutant run in
the same worker processes — one session, one start-up of each worker (``import torch``, the
--import modules, the plan) instead of one per backend. Each case runs once per backend, one
backend after the other (:data:`casedb.run.session.BACKEND_SEP`), and each backend's results are
recorded in its own run, exactly as ``casedb run --backend B`` would record them.

No triage file applies (issue 28): neither ./triage/*.yaml nor the shipped triage. An entry
could turn the control's false alarm into an expected failure (or exclude the case), and the
control is there to show every false alarm; the mutants are judged the same way.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from casedb.run import runner
from casedb.run.console import Progress
from casedb.run.runspec import SELECTION_VERSION, RunSpec
from casedb.run.target import check_import
from casedb.store.database import open_store
from casedb.store.run_lifecycle import start_run

SOURCE = "casedb mutants"


def run_backends(spec: RunSpec, backends: list[str], *, db, progress: bool = True, console=None) -> dict:
    """Run ``spec``'s selection on each of ``backends`` in one pytest session, without triage;
    returns {backend: its run's summary} (see casedb.store.run_figures.summarize)."""
    db_path, max_cases = runner._check_store(spec, db, None)
    spec = replace(spec, triage=[], shipped_triage=False, backend=backends[0]).validate()
    spec = replace(spec, imports=[check_import(n) for n in spec.imports], all_models=spec.all_models or not spec.models)
    runs = _start_runs(spec, backends, db_path)
    extra = ("--casedb-backend-runs", ",".join(f"{b}={r}" for b, r in runs.items()))
    # one restart per case a worker could take down, on every backend
    code, text = runner._session(spec, db_path, runs[backends[0]], max_cases * len(backends),
                                 Progress(console, enabled=progress), extra)
    return {b: runner._finish(db_path, run_id, code, text) for b, run_id in runs.items()}


def _start_runs(spec: RunSpec, backends: list[str], db_path: Path) -> dict:
    """{backend: the id of its new run}, each run's selection that of ``spec`` on the backend."""
    with open_store(db_path) as store:
        return {b: start_run(store.conn, selection={"version": SELECTION_VERSION, "source": SOURCE,
                                                    "options": replace(spec, backend=b).selection()},
                             args=sys.argv[1:], device=spec.device, backend=b)
                for b in backends}
