"""``casedb run``: one pytest session over the selected cases, recorded as a run.

``casedb run`` and ``pytest --casedb-model X`` are the same thing: a pytest session with the
casedb plugin (:mod:`casedb.pytest_plugin`), pytest-xdist workers for isolation and parallelism
and pytest-timeout for hangs. :func:`run` creates (or reopens, for ``--resume``) the run,
hands the :class:`~casedb.run.runspec.RunSpec` to that session as pytest options, shows progress
and returns the run's summary. The parts live in their own modules: the plan
(:mod:`casedb.run.plan`), the target and one case's execution (:mod:`casedb.run.target`), the history
rows (:mod:`casedb.store.run_lifecycle`), merging shard databases (:mod:`casedb.store.merge`) and the terminal
(:mod:`casedb.run.console`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from casedb.run import selection
from casedb.errors import CasedbError
from casedb.run import refcache
from casedb.run.console import Progress
from casedb.run.runspec import SAME, SELECTION_VERSION, RunSpec, spec_fields
from casedb.run.session import usable_cpus
from casedb.run import software
from casedb.run.target import TargetError, check_import
from casedb.store.database import open_store
from casedb.store.records import RunSummary
from casedb.store.run_lifecycle import finish_run, pid_alive, reopen_run, start_run
from casedb.store.run_rows import get_run
from casedb.ingest.seed import open_seeded
from casedb import triage

TEST_FILE = "test_casedb_run.py"


def pytest_args(spec: RunSpec, *, db: Path, run_id: int, workdir: Path, max_cases: int = 1000) -> list[str]:
    """The pytest command line `casedb run` amounts to: the spec's options plus the session
    plumbing (generated test file, workers, time limit)."""
    # importlib mode: each run's generated test module is its own, even within one process
    args = [str(workdir / TEST_FILE), "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
            "--import-mode", "importlib", "-p", "no:cacheprovider", "-p", "no:benchmark", "-q", "--strict-markers",
            f"--casedb-db={db}", "--casedb-run-id", str(run_id)]
    # only the plugins a run needs (see _no_plugin_autoload): the session and its workers start faster
    args += ["-p", "casedb.pytest_plugin", "-p", "xdist.plugin", "-p", "pytest_timeout"]
    args += spec.pytest_argv()
    if spec.jobs >= 1:
        # a worker that dies is replaced: one restart per case it could take down, and no more
        # (a worker that dies before any case would otherwise be restarted for ever)
        args += ["-n", str(spec.jobs), "--max-worker-restart", str(max_cases + 2 * spec.jobs),
                 "--casedb-worker-log-dir", str(workdir)]
        if spec.jobs > 1 and spec.threads is None:
            args += ["--casedb-threads", str(max(1, usable_cpus() // spec.jobs))]
    if spec.timeout and spec.timeout > 0:
        # thread: a hang inside C code is ended too (the worker exits and is replaced);
        # without workers only a signal keeps the run alive
        args += ["--timeout", f"{spec.timeout:g}", "--timeout-method", "thread" if spec.jobs >= 1 else "signal"]
    return args


def _resume_spec(conn, run_id: int, given: RunSpec) -> RunSpec:
    """The spec to finish run ``run_id`` with: its stored selection, ``given``'s how, and the
    ``--import`` modules only as given again on this command line (a database can come from
    anywhere: casedb never imports a module because a database names it)."""
    run_row = get_run(conn, run_id)
    sel = run_row["selection"]
    if run_row["status"] == "running" and run_row["host"] == socket.gethostname() and pid_alive(sel.get("pid")):
        raise CasedbError(f"run {run_id} is still running (pid {sel.get('pid')}); "
                          "wait for it, or kill it first and resume then")
    saved = sel.get("options")
    if saved is None:
        raise CasedbError(f"run {run_id} has no recorded selection to resume from")
    spec = RunSpec.from_selection(saved).with_how(given)
    ignored = _overridden(given, spec)
    if ignored:
        raise CasedbError(f"--resume {run_id} runs what run {run_id} selected, on its target; {', '.join(ignored)} "
                          f"would be ignored: leave {'it' if len(ignored) == 1 else 'them'} out, or start a new run")
    stored = list(saved.get("imports") or [])
    given_imports = [check_import(n) for n in given.imports]
    missing = [n for n in stored if n not in given_imports]
    if missing:
        again = " ".join(f"--import {n}" for n in stored)
        raise CasedbError(f"run {run_id} was recorded with --import {', '.join(missing)}; casedb never imports a "
                          f"module because a database names it (the file may come from elsewhere): review it and "
                          f"give it again to resume: casedb run --resume {run_id} {again}")
    # triage files too come from this command line (or its defaults), never from paths the
    # database names: a file from elsewhere could point casedb at any file
    return replace(spec, imports=given_imports, triage=list(given.triage or []))


def _overridden(given: RunSpec, stored: RunSpec) -> list[str]:
    """The selection options given (not left at their defaults) with a value other than the
    stored run's, as ``--flag VALUE``; ``--import`` is checked on its own."""
    blank = RunSpec()
    out = []
    for f, flag in spec_fields():
        if not flag.what or f.name in ("imports", "triage"):
            continue
        value = getattr(given, f.name)
        if value in (None, []) or value == getattr(blank, f.name) or (
                flag.cli_default is not SAME and value == flag.cli_default):
            continue
        if value != getattr(stored, f.name):
            name = (flag.cli or (flag.pytest,))[0]
            out.append(f"{name} {' '.join(map(str, value)) if isinstance(value, list) else value}".strip())
    return out


def run(spec: RunSpec, *, db: str | os.PathLike | None = None, resume: int | None = None,
        progress: bool = True, console=None) -> RunSummary:
    """`casedb run`: record a run of the selected cases; returns its summary (see casedb.store.run_figures.summarize).

    ``resume``: finish run `resume` (its selection and target are reused; jobs, timeout and
    fail-fast come from ``spec``, and its ``--import`` modules must be given again) — every case
    it has no result for runs exactly once.
    """
    db_path, max_cases = _check_store(spec, db, resume)
    implicit = triage.implicit_paths(spec.triage)  # (the summary says which files no option named)
    spec, run_id = _start(spec, db_path, resume)
    code, text = _session(spec, db_path, run_id, max_cases, Progress(console, enabled=progress))
    return {**_finish(db_path, run_id, code, text), "triage_implicit": implicit}


def _check_store(spec: RunSpec, db, resume: int | None) -> tuple[Path, int]:
    """(the DB's path, its occurrences): creates, migrates or seeds the default DB before any
    worker starts, and refuses unknown models and marks."""
    with open_seeded(db) as store:
        db_path = store.path.resolve()
        if spec.reference_cache:  # a linked, shared or foreign cache folder, or an unsafe key: exit 2 first
            refcache.ReferenceCache(refcache.beside(db_path)).check()
        if resume is None:
            for m in spec.models:
                store.model(m)
            # pytest >= 9.2 refuses an unknown mark in -m; say so first, on any version (and
            # that a derived mark no case has selects nothing)
            selection.check_store_marks(store, spec)
        return db_path, store.stats()["occurrences"]


def _start(spec: RunSpec, db_path: Path, resume: int | None) -> tuple[RunSpec, int]:
    """(the checked spec, the run id): a new run, or run ``resume`` reopened."""
    with open_store(db_path) as store:
        conn = store.conn
        if resume is not None:
            spec = _resume_spec(conn, resume, spec)
        spec.validate()
        # files are kept by absolute path, so --resume works from anywhere; casedb run without
        # --model runs every model (pytest: a smoke set; a resumed pytest run keeps the set it had)
        spec = replace(spec, imports=[check_import(n) for n in spec.imports],
                       triage=triage.run_paths(spec.triage, shipped=spec.shipped_triage),
                       all_models=spec.all_models or (resume is None and not spec.models))
        if spec.triage:  # checked before anything runs: a typo'd key is exit 2, not a silent no-op
            triage.require_clean(spec.triage, store)
        if resume is not None:
            reopen_run(conn, resume)
            return spec, resume
        run_id = start_run(
            conn, selection={"version": SELECTION_VERSION, "options": spec.selection(), "source": "casedb run"},
            args=sys.argv[1:], device=spec.device, backend=spec.backend,
            software=software.describe(spec.imports, spec.device))
        return spec, run_id


def _session(spec: RunSpec, db_path: Path, run_id: int, max_cases: int, ui: Progress,
             extra_args: tuple = ()) -> tuple[int, str]:
    """Run the pytest session (``extra_args``: more pytest options); (its exit code, its output)."""
    with tempfile.TemporaryDirectory(prefix="casedb-run-") as tmp:
        workdir = Path(tmp)
        (workdir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        (workdir / TEST_FILE).write_text(
            '"""Generated by casedb run."""\nfrom casedb.pytest_plugin import test_model_op  # noqa: F401\n',
            encoding="utf-8")
        args = pytest_args(spec, db=db_path, run_id=run_id, workdir=workdir, max_cases=max_cases) + list(extra_args)
        log = workdir / "pytest.log"
        with open(log, "w", encoding="utf-8") as out, contextlib.redirect_stdout(out), _no_plugin_autoload():
            try:
                code = pytest.main(args, plugins=[ui])
            finally:
                ui.stop()
        return int(code), log.read_text(encoding="utf-8", errors="replace")


def _finish(db_path: Path, run_id: int, code: int, text: str) -> RunSummary:
    """The run's summary; a run the session never closed is closed as interrupted; raises when
    the target was unusable or pytest could not run the session."""
    with open_store(db_path) as store:
        run_row = get_run(store.conn, run_id)
        if run_row["status"] == "running":  # the plugin never got to close it
            finish_run(store.conn, run_id, "interrupted", error=f"pytest exit code {code}")
            run_row = get_run(store.conn, run_id)
        summary = run_row["summary"]
    summary["pytest_exit_code"] = code
    if summary.get("fatal"):
        raise TargetError(f"run {run_id}: {summary['fatal']}")
    interrupted_by_user = code == 2 and "KeyboardInterrupt" in text
    if code not in (0, 1, 5) and not interrupted_by_user:
        # pytest could not run the session (collection, usage or internal error): say why
        tail = "\n".join(text.strip().splitlines()[-30:])
        raise CasedbError(f"run {run_id}: pytest could not run the cases (exit code {code}); "
                          f"resume with casedb run --resume {run_id} once fixed:\n{tail}")
    return summary


@contextlib.contextmanager
def _no_plugin_autoload():
    """Every installed pytest plugin costs start-up time in the controller and in each worker
    (hypothesis alone ~1 s here); a run loads casedb's, xdist's and pytest-timeout's by name."""
    old = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = old
