"""The controller of a casedb pytest session (xdist's controller, or the only process): it records
the session as a run — starts or reopens the run, stores each case's payload as its report
arrives (a case whose worker reported nothing gets a crashed, timeout or error payload), and
closes the run with its summary.

The store is imported on first use (see :mod:`casedb.run.session`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from casedb import outcomes
from casedb.errors import CasedbError
from casedb.run import software
from casedb.run.console import counted, failure_notes, triage_files_note
from casedb.run.plan import param_id
from casedb.run.runspec import SELECTION_VERSION
from casedb.run.session import Cases, db_lock, listing_only, xdist_controller
from casedb.run.target import entries_timeout, lost_payload, resolve_arch, resolve_device, triage_entries
from casedb.store.records import Payload
from casedb import triage as triage_mod

_TAIL = 4000  # characters of a dead worker's log kept for its crashed result


class Controller:
    """Records the session as a run (xdist's controller, or the only process): starts or reopens
    the run, stores each case's payload as its report arrives, closes the run."""

    def __init__(self, cases: Cases):
        self.cases = cases
        self.config = cases.config
        self.store = None  # the DB, open while the session records (casedb.store.database.Store)
        self.recorders: dict = {}   # backend (None: the spec's) -> the Recorder of its run
        self.recorded: set = set()  # (backend, plan key)
        self.started: dict[str, float] = {}
        self.selected: list[str] | None = None
        self.fatal: str | None = None
        self.skips: list[tuple[str, str]] = []
        self.summaries: dict = {}   # run id -> its summary, once closed
        self._triage_where = None
        if cases.run_id is not None:
            self._attach_run()
        if cases.spec.models and not listing_only(self.config):
            self._check_db()

    def _check_db(self) -> None:
        # Opening here (before workers start) creates and seeds a new default DB once, and turns
        # an unknown --model or a bad option into a usage error.
        from casedb.ingest.seed import open_seeded

        try:
            self.cases.spec.validate()
            with db_lock(self.cases.db_path), open_seeded(self.cases.db_path) as store:
                for m in self.cases.spec.models:
                    store.model(m)
                triage_mod.require_clean(self.cases.spec.triage, store)
        except CasedbError as e:
            raise pytest.UsageError(str(e)) from None

    def _attach_run(self) -> None:
        from casedb.store.database import open_store  # (see casedb.run.session)
        from casedb.store.recorder import high_water
        from casedb.store.run_rows import get_run

        with open_store(self.cases.db_path) as store:
            get_run(store.conn, self.cases.run_id)
            # what the run had before this session: every process skips exactly that
            self.cases.upto = high_water(store.conn, self.cases.run_id)

    def pytest_configure_node(self, node):
        node.workerinput["casedb"] = {"db": self.cases.db_path, "upto": list(self.cases.upto) if self.cases.upto else None}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        if not xdist_controller(self.config):
            self._selected([item.nodeid for item in session.items])

    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.selected is None:
            self._selected(list(ids))

    def _selected(self, nodeids: list[str]) -> None:
        """The session's model-op tests are known: start (or reopen) the run and its recorder."""
        self.selected = [n for n in nodeids if param_id(n) is not None]
        if self.cases.run_id is None and not self.selected:
            return  # a session without model-op tests records nothing
        from casedb.store.database import open_store  # (see casedb.run.session)
        from casedb.store.recorder import Recorder
        from casedb.store.run_lifecycle import start_run
        from casedb.store.run_rows import get_run, update_selection

        first = next(iter(self.cases.backend_runs), None)  # every backend runs the same cases
        items = [it for it in (self.cases.item_for(n) for n in self.selected
                               if self.cases.backend_of(n) == first) if it is not None]
        opt = self.config.option
        if opt.collectonly or opt.casedb_no_record or (not items and self.cases.run_id is None):
            return
        dedupe = self.cases.spec.dedupe
        figures = {"cases": len(items), "occurrences": sum(len(it.occurrences) for it in items),
                   "available": len(self.cases.plan())}
        figures["duplicates_skipped"] = figures["occurrences"] - figures["cases"] if dedupe else 0
        self.store = open_store(self.cases.db_path)
        conn = self.store.conn
        if self.cases.run_id is None:
            self.cases.run_id = start_run(
                conn, selection={"version": SELECTION_VERSION, "options": self.cases.spec.selection(),
                                      "source": "pytest"},
                args=[str(a) for a in self.config.invocation_params.args],
                device=self.cases.spec.device, backend=self.cases.spec.backend,
                software=software.describe(self.cases.spec.imports, self.cases.spec.device))
            # the arch the run resolved (sm_90), which `triage update` scopes entries to
            update_selection(conn, self.cases.run_id, planned=figures, pid=os.getpid(),
                             arch=self._triage()[1]["arch"])
        else:
            for run_id in self._runs().values():
                sel = get_run(conn, run_id)["selection"]
                changes = {"pid": os.getpid()}
                if sel.get("planned") is None:
                    changes["planned"] = figures
                else:
                    changes["remaining"] = figures
                update_selection(conn, run_id, **changes)
        self.recorders = {b: Recorder(conn, run_id) for b, run_id in self._runs().items()}
        self.loop_started = self.loop_last = time.monotonic()
        self.config.hook.pytest_casedb_planned(config=self.config, total=len(items) * len(self.recorders),
                                               figures={**figures, "run_id": self.cases.run_id})

    def _runs(self) -> dict:
        """backend -> the run its results go to: {None: the run} but in a session over several backends."""
        return self.cases.backend_runs or {None: self.cases.run_id}

    def pytest_runtest_logstart(self, nodeid, location):
        if self.recorders:
            self.started[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        if not self.recorders:
            return
        it = self.cases.item_for(report.nodeid)
        backend = self.cases.backend_of(report.nodeid)
        if it is None or (backend, it.key) in self.recorded:
            return
        payload = _payload(report)
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if payload is not None and payload.get("fatal"):
            self.fatal = payload["fatal"]
            return
        if report.when == "call":
            if payload is None:
                payload = self._lost(it, report, worker)
        elif report.when == "setup":
            if report.passed:
                return
            if report.skipped:
                payload = lost_payload(it, "xfailed" if hasattr(report, "wasxfail") else "skipped", _skip_reason(report))
            else:
                payload = self._lost_payload(it, "error", "setup failed", _longrepr(report))
        elif report.when == "teardown":
            return
        else:  # xdist: the worker died while running this test
            payload = self._lost(it, report, worker)
        duration = report.duration if report.when in ("call", "setup") else self._elapsed(report.nodeid)
        if self.recorders[backend].record(it, payload, duration=duration, worker=worker, test_id=it.id):
            self.loop_last = time.monotonic()
            self.recorded.add((backend, it.key))
            outcome = payload["outcome"]
            if outcome == "skipped":
                self.skips.append((it.id, payload["reason"]))
            else:
                self.skips += [(f"{it.id} [{j['model']}::{j['name']}]", j["reason"])
                               for j in payload["judgements"] if j["outcome"] == "skipped"]
            self.config.hook.pytest_casedb_recorded(config=self.config, outcome=outcome, item=it)

    def pytest_report_teststatus(self, report, config):
        """A case casedb records as an error (a compile error, a bad input) is an error in pytest's
        counts too, as in casedb run's; a wrong result stays a failure."""
        if report.when == "call" and report.failed and self.cases.item_for(report.nodeid) is not None:
            payload = _payload(report)
            if payload is not None and payload.get("outcome") == "error":
                return "error", "E", "ERROR"
        return None

    def _elapsed(self, nodeid: str) -> float | None:
        t = self.started.get(nodeid)
        return None if t is None else time.monotonic() - t

    def _triage(self):
        """(the run's triage files or None, the target they are read for), loaded once. The
        target is resolved here without the --import modules: the workers have the prepared one,
        but a lost case is judged in this process."""
        if self._triage_where is None:
            spec, loaded = self.cases.spec, None
            if spec.triage:
                try:
                    loaded = triage_mod.load(spec.triage)
                except CasedbError:
                    loaded = None  # reported at collection
            device = resolve_device(spec.device)
            self._triage_where = (loaded, {"device": device, "backend": spec.backend,
                                           "arch": resolve_arch(device, spec.arch)})
        return self._triage_where

    def _lost_payload(self, it, outcome: str, reason: str, detail: str | None = None) -> Payload:
        triage, where = self._triage()
        return lost_payload(it, outcome, reason, detail, triage=triage, where=where)

    def _timeout(self, it) -> tuple[float | None, str]:
        """The case's time limit and what set it: its triage entry's ``timeout``, else --timeout."""
        own = entries_timeout(triage_entries(it, *self._triage()))
        if own:
            return float(own), f"its triage entry's timeout {own:g} s"
        t = getattr(self.config.option, "timeout", None)
        return (float(t), f"--timeout {float(t):g} s") if t else (None, "")

    def _lost(self, it, report, worker) -> Payload:
        """A report without casedb's payload: a crash, a timeout, or an error outside the core."""
        text = _longrepr(report)
        limit, limit_text = self._timeout(it)
        if "Timeout (>" in text and "pytest-timeout" in text:
            return self._lost_payload(it, "timeout", f"no result within {limit_text}" if limit else "timeout", text)
        if report.when not in ("call", "setup", "teardown"):
            elapsed = self._elapsed(report.nodeid)
            tail = self._worker_log_tail(worker)
            detail = "\n".join(x for x in (text, tail) if x)
            # pytest-timeout's thread method ends the worker; it died at the limit, not before
            if limit and elapsed is not None and elapsed >= 0.9 * limit:
                return self._lost_payload(it, "timeout", f"no result within {limit_text} (the worker was ended)",
                                          detail)
            signal_line = _crash_line(tail)
            return self._lost_payload(it, "crashed", "the worker process died"
                                      + (f" ({signal_line})" if signal_line else ""), detail)
        return self._lost_payload(it, "error", _first_line(text) or "failed without a result", text)

    def _worker_log_tail(self, worker) -> str | None:
        log_dir = self.config.option.casedb_worker_log_dir
        if not log_dir or not worker:
            return None
        path = Path(log_dir) / f"{worker}.log"
        try:
            text = path.read_bytes()[-16 * _TAIL:].decode("utf-8", errors="replace")
        except OSError:
            return None
        # from the death notice on (faulthandler's "Fatal Python error: ..." and its stack)
        at = max(text.rfind("Fatal Python error"), text.rfind("+++++ Timeout"))
        return text[at:at + _TAIL] if at >= 0 else text[-_TAIL:]

    def _unrecorded(self, backend: str | None) -> list[str]:
        """Selected model-op tests (of ``backend``'s run) this session has no recorded result for."""
        missing = []
        for nodeid in self.selected or []:
            if self.cases.backend_of(nodeid) != backend:
                continue
            it = self.cases.item_for(nodeid)
            if it is None or (backend, it.key) not in self.recorded:
                missing.append(nodeid)
        return missing

    def pytest_sessionfinish(self, session, exitstatus):
        from casedb.store.database import open_store  # (see casedb.run.session)
        from casedb.store.run_lifecycle import finish_run

        # a session pytest could not complete (collection errors, Ctrl-C) leaves the run resumable
        broken = int(exitstatus) not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
        if not self.recorders:
            if self.cases.run_id is not None and not self.config.option.collectonly:
                # casedb run made the run rows, and nothing was run: close them
                with open_store(self.cases.db_path) as store:
                    for run_id in self._runs().values():
                        finish_run(store.conn, run_id, "interrupted" if self.fatal or broken else "finished",
                                   fatal=self.fatal)
            return
        stopped = broken or self.fatal or session.shouldstop or session.shouldfail
        for backend, run_id in self._runs().items():
            missing = self._unrecorded(backend)
            error = None
            if missing and not stopped:
                # every planned case must have its row: never report success over a lost result
                error = (f"{len(missing)} of {len(self.selected) // len(self.recorders)} selected cases have no "
                         f"recorded result (e.g. {', '.join(missing[:3])})")
            complete = not missing and not self.fatal and not broken
            # this session's run loop: from the cases being ready to run to the last one recorded
            session_figures = {"cases": sum(b == backend for b, _ in self.recorded),
                               "loop_s": round(self.loop_last - self.loop_started, 4)}
            self.summaries[run_id] = finish_run(self.store.conn, run_id, "finished" if complete else "interrupted",
                                                error=error, fatal=self.fatal, session=session_figures)
        self.store.close()
        self.store = None

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if config.option.casedb_show_skipped and self.skips:
            terminalreporter.section("casedb: skipped cases")
            for tid, reason in self.skips:
                terminalreporter.line(f"SKIPPED {tid}: {reason}")
        for run_id, summary in self.summaries.items():
            parts = [counted(summary[outcomes.COUNT_KEYS[o]], o) for o in outcomes.SHOWN
                     if summary.get(outcomes.COUNT_KEYS[o])]
            terminalreporter.line(f"casedb: run {run_id} recorded in {self.cases.db_path}: "
                                  f"{summary['executed']} executed, {summary['duplicates_skipped']} duplicates skipped; "
                                  f"{', '.join(parts) or 'nothing run'}")
            if config.option.casedb_run_id is None:  # (casedb run prints its own: the causes, the triage files)
                for note in failure_notes(summary):
                    for line in note.splitlines():
                        terminalreporter.line(f"casedb: {line}")
                note = triage_files_note({**summary, "triage_implicit": self.cases.triage_implicit})
                terminalreporter.line(f"casedb: {note}")
            if summary.get("error") and not self.fatal:
                terminalreporter.line(f"casedb: run {run_id} not complete: {summary['error']}", red=True)
        if self.fatal:
            terminalreporter.line(f"casedb: stopped: {self.fatal}", red=True)


def _payload(report) -> Payload | None:
    for key, value in getattr(report, "user_properties", ()) or ():
        if key == "casedb":
            return json.loads(value)
    return None


def _longrepr(report) -> str:
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple):
        return str(lr[-1])
    return str(lr)


def _skip_reason(report) -> str:
    text = _longrepr(report)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _crash_line(tail: str | None) -> str | None:
    # the line faulthandler / the C runtime wrote for the death, e.g. "Fatal Python error: Aborted"
    if not tail:
        return None
    for line in tail.splitlines():
        if "Fatal Python error" in line:
            return line.strip()[:200]
    return None
