"""casedb's pytest plugin (entry point ``pytest11: casedb``): RFC-0186's front end over the case DB.

One test, :func:`test_model_op`, is parametrized straight from the database (no YAML at
collection): one test per unique case (dedupe, the default) or per model occurrence
(``--no-dedupe``). Use it from any test file::

    from casedb.pytest_plugin import test_model_op  # noqa: F401

and select with ``--model NAME`` (repeatable), ``-k`` (op names such as ``torch.add`` /
``aten.mm``, case names, model names), ``-m`` (case marks and ``model_<name>``). Without
``--model`` only a small smoke set is collected. Model-op tests get the RFC's default marker
filter (``not largedimtensor and not fp32operation and not bf16operation and not constant``)
unless ``-m`` is given (``-m ""`` runs everything).

A session that runs model-op tests is recorded in the DB as a run, exactly as ``casedb run``
records one (``casedb run`` *is* such a session): the controlling process writes each result as
its report arrives, with pytest-xdist (``-n``) too. Heavy imports (torch) happen in the process
that executes cases, on the first case.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

import pytest

ARG = "casedb_case"
TEST_NAME = "test_model_op"
_STATE = pytest.StashKey["_Casedb"]()
_MARK_GIVEN = pytest.StashKey[bool]()
_NO_EXPR = "\0"  # --list-cases-by-mark without an expression


class CasedbHooks:
    """Hooks casedb calls in the controlling process (casedb run's progress display uses them)."""

    @pytest.hookspec
    def pytest_casedb_planned(self, config, total, figures):
        """The model-op tests of this session are known: `total` to run; `figures` has run_id,
        occurrences, duplicates_skipped."""

    @pytest.hookspec
    def pytest_casedb_recorded(self, config, outcome, item):
        """One case was recorded in the DB with `outcome`."""


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(CasedbHooks)


def pytest_addoption(parser):
    g = parser.getgroup("casedb", "casedb: model operator cases from the case DB (RFC-0186)")
    g.addoption("--model", action="append", default=[], metavar="NAME",
                help="Run this model's cases (repeatable; gpt_oss = gpt-oss, case-insensitive).")
    g.addoption("--all-models", action="store_true", help="Run every model's cases (default without --model: a smoke set).")
    g.addoption("--dedupe", dest="casedb_dedupe", action="store_true", default=True,
                help="Run each unique case once and judge it for every model that has it (default).")
    g.addoption("--no-dedupe", dest="casedb_dedupe", action="store_false", help="Run every model occurrence.")
    g.addoption("--list-models", action="store_true", help="List the models in the DB and exit.")
    g.addoption("--list-cases", action="store_true", help="List cases as model::name::op (manifest path) and exit.")
    g.addoption("--list-cases-by-mark", nargs="?", const=_NO_EXPR, default=None, metavar="MARKEXPR",
                help="List the cases a marker expression selects (default: -m, else the RFC's default filter) and exit.")
    g.addoption("--show-excluded", action="store_true", help="With --list-cases-by-mark: list the excluded cases instead.")
    g.addoption("--show-skipped", action="store_true", help="Summarize skipped model-op cases with their reasons.")
    g.addoption("--compile-backend", default=os.environ.get("TEST_COMPILE_BACKEND") or "inductor", metavar="NAME",
                help="Dynamo backend for the target, or 'eager' for no compile (env TEST_COMPILE_BACKEND; default inductor).")
    g.addoption("--device", default=None, metavar="DEVICE",
                help="Target device (default: cuda when available, else cpu; any device torch knows).")
    g.addoption("--no-device-replace", action="store_true",
                help="Keep device strings recorded in cases (cuda:0) instead of using the target device.")
    g.addoption("--casedb-db", default=None, metavar="PATH", help="Case DB (default: env CASEDB_DB, else data/casedb.sqlite).")
    g.addoption("--casedb-import", action="append", default=[], metavar="MODULE",
                help="Import this module (or .py file) before running cases, e.g. torch_spyre (repeatable).")
    g.addoption("--casedb-reference-dtype", default=None, metavar="DTYPE",
                help="Also compute an upcast reference in this dtype (float32/float64).")
    g.addoption("--casedb-check-determinism", action="store_true", help="Run the target twice; require bit-identical output.")
    g.addoption("--casedb-op", default=None, metavar="OP", help="Only cases of this op (exact or substring).")
    g.addoption("--casedb-limit", type=int, default=None, metavar="N", help="Only the first N selected cases.")
    g.addoption("--casedb-shard", default=None, metavar="I/N", help="Only slice I of N (stable, by signature).")
    g.addoption("--casedb-run-id", type=int, default=None, metavar="ID",
                help="Record into this run and skip what it already has (casedb run --resume uses this).")
    g.addoption("--casedb-no-record", action="store_true", help="Do not record this session as a run.")
    g.addoption("--casedb-threads", type=int, default=None, help="torch threads per process running cases.")
    g.addoption("--casedb-worker-log-dir", default=None, help="Send each xdist worker's stdout/stderr to a file here.")


def pytest_load_initial_conftests(early_config, parser, args):
    # -m "" lifts the default filter, so "no -m at all" must be told apart from it; args here
    # include ini addopts and PYTEST_ADDOPTS.
    early_config.stash[_MARK_GIVEN] = _has_markexpr(args)


def _has_markexpr(args) -> bool:
    for a in args:
        a = str(a)
        if a == "--":
            break
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    from casedb import marks as marks_mod

    for name, doc in marks_mod.DERIVED.items():
        config.addinivalue_line("markers", f"{name}: {doc} (casedb derived mark)")
    worker = getattr(config, "workerinput", None)
    if worker is not None and config.option.casedb_worker_log_dir:
        # before pytest's faulthandler copies fd 2: a crash's own report lands in this file,
        # where the controller reads it for the crashed result
        path = Path(config.option.casedb_worker_log_dir) / f"{worker['workerid']}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    state = _Casedb(config)
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "casedb-session")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    opt = config.option
    if not (opt.list_models or opt.list_cases or opt.list_cases_by_mark is not None):
        return None
    from casedb.errors import CasedbError

    try:
        _listing(config)
    except (CasedbError, ValueError) as e:
        print(f"ERROR: {e}")
        return pytest.ExitCode.USAGE_ERROR
    return pytest.ExitCode.OK


def _db_arg(config) -> str | None:
    return config.option.casedb_db or os.environ.get("CASEDB_DB") or None


def _listing(config) -> None:
    from casedb import marks as marks_mod
    from casedb.runner import model_mark
    from casedb.store import open_store

    opt = config.option
    with open_store(_db_arg(config)) as store:
        if opt.list_models:
            for m in store.models():
                print(f"{m['name']}: {m['cases']} cases ({m['unique_cases']} unique), {m['ops']} ops"
                      f"{' — ' + m['source'] if m['source'] else ''}  [-m {model_mark(m['name'])}]")
        rows = store.occurrences(opt.model or None) if (opt.list_cases or opt.list_cases_by_mark is not None) else []
    if opt.list_cases:
        for r in rows:
            print(f"{r['model']}::{r['name']}::{r['op']} ({_manifest_path(r['source'])})")
    if opt.list_cases_by_mark is not None:
        expr = opt.list_cases_by_mark
        if expr == _NO_EXPR:
            expr = opt.markexpr if config.stash.get(_MARK_GIVEN, False) else marks_mod.DEFAULT_EXCLUDE
        matcher = marks_mod.MarkExpression(expr)
        picked = [r for r in rows if matcher.matches(list(r["marks"]) + [model_mark(r["model"])]) != opt.show_excluded]
        what = "excluded by" if opt.show_excluded else "selected by"
        print(f"cases {what} -m {expr!r}:")
        for r in picked:
            print(f"{r['model']}::{r['name']}::{r['op']} [{', '.join(r['marks'])}]")
        by_mark: dict[str, int] = {}
        for r in picked:
            for m in r["marks"] or ["(no marks)"]:
                by_mark[m] = by_mark.get(m, 0) + 1
        print(f"{len(picked)} of {len(rows)} cases {what} -m {expr!r}"
              + (" (" + ", ".join(f"{m}: {n}" for m, n in sorted(by_mark.items())) + ")" if by_mark else ""))


def _manifest_path(source: str | None) -> str:
    if not source:
        return "?"
    return re.sub(r":\d+$", "", source)


def _param_id(nodeid: str) -> str | None:
    name = nodeid.rsplit("::", 1)[-1]
    if not name.startswith(TEST_NAME + "[") or not name.endswith("]"):
        return None
    return name[len(TEST_NAME) + 1:-1]


class _Casedb:
    """Per-session state: the plan (every process), execution (processes that run cases) and
    recording (the controlling process)."""

    def __init__(self, config):
        self.config = config
        self.workerinput = getattr(config, "workerinput", None)
        self.is_worker = self.workerinput is not None
        opt = config.option
        shared = (self.workerinput or {}).get("casedb", {})
        self._db_path = shared.get("db")
        self.upto = tuple(shared["upto"]) if shared.get("upto") else None
        self.mark_given = config.stash.get(_MARK_GIVEN, False)
        self.models = list(opt.model or [])
        self.dedupe = opt.casedb_dedupe
        self.smoke = not self.models and not opt.all_models
        self.run_id = opt.casedb_run_id
        self._plan = None
        self._by_id = None
        self._marks: dict = {}
        self._target = None
        self._target_error = None
        self._store = None
        # controller
        self.conn = None
        self.recorder = None
        self.recorded: set = set()
        self.started: dict[str, float] = {}
        self.selected: list[str] | None = None
        self.fatal: str | None = None
        self.skips: list[tuple[str, str]] = []
        self.counts: dict[str, int] = {}
        if not self.is_worker and self.run_id is not None:
            self._attach_run()
        if not self.is_worker and self.models and not _listing_only(config):
            self._check_db()

    # ---------------------------------------------------------------------------- database
    @property
    def db_path(self) -> str:
        # absolute: every process of the session (xdist workers too) opens the same file;
        # resolved on first use, so sessions without model-op tests never import the store
        if self._db_path is None:
            from casedb.store import DEFAULT_DB

            self._db_path = str(Path(_db_arg(self.config) or DEFAULT_DB).resolve())
        return self._db_path

    def _check_db(self) -> None:
        # Opening here (controller, before workers start) creates and seeds a new default DB
        # once, and turns an unknown --model into a usage error.
        from casedb.errors import CasedbError
        from casedb.store import open_store

        try:
            with _db_lock(self.db_path), open_store(self.db_path) as store:
                for m in self.models:
                    store.model(m)
        except CasedbError as e:
            raise pytest.UsageError(str(e)) from None

    def store(self):
        if self._store is None:
            from casedb.store import Store

            self._store = Store(self.db_path)
        return self._store

    def plan(self):
        if self._plan is None:
            from casedb.errors import CasedbError
            from casedb.runner import build_plan
            from casedb.store import open_store

            try:
                with _db_lock(self.db_path), open_store(self.db_path) as store:
                    self._plan = build_plan(store, self.models or None, dedupe=self.dedupe, smoke=self.smoke)
            except CasedbError as e:
                raise pytest.UsageError(str(e)) from None
            self._by_id = {it.id: it for it in self._plan}
        return self._plan

    def item_for(self, nodeid: str):
        pid = _param_id(nodeid)
        if pid is None:
            return None
        self.plan()
        return self._by_id.get(pid)

    # ------------------------------------------------------------------------- collection
    def _mark(self, name: str):
        mark = self._marks.get(name)
        if mark is None:
            # registered before use, so --strict-markers accepts what manifests declare
            known = {line.split(":")[0].split("(")[0].strip() for line in self.config.getini("markers")}
            if name not in known:
                doc = (f"cases of model {name[6:]} (casedb)" if name.startswith("model_")
                       else "mark declared by a casedb manifest")
                self.config.addinivalue_line("markers", f"{name}: {doc}")
            mark = self._marks[name] = getattr(pytest.mark, name)
        return mark

    def pytest_generate_tests(self, metafunc):
        if ARG not in metafunc.fixturenames:
            return
        from casedb.runner import model_mark

        params = []
        for it in self.plan():
            names = list(it.marks) + [model_mark(m) for m in it.models]
            params.append(pytest.param(it, id=it.id, marks=[self._mark(n) for n in names]))
        metafunc.parametrize(ARG, params)

    def pytest_itemcollected(self, item):
        it = _item_param(item)
        if it is not None:
            # -k matches the op (torch.add, aten.mm), case names and models, not only the id
            item.extra_keyword_matches.update({it.op, *it.names, *it.models})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        if not any(_item_param(item) is not None for item in items):
            return
        from casedb import marks as marks_mod
        from casedb.errors import CasedbError
        from casedb.runner import done_keys, in_shard, op_matches, parse_shard, connect

        opt = config.option
        try:
            shard = parse_shard(opt.casedb_shard)
        except CasedbError as e:
            raise pytest.UsageError(str(e)) from None
        default = None if self.mark_given else marks_mod.MarkExpression(marks_mod.DEFAULT_EXCLUDE)
        done = set()
        if self.run_id is not None:
            conn = connect(self.db_path)
            try:
                done = done_keys(conn, self.run_id, dedupe=self.dedupe, upto=self.upto)
            finally:
                conn.close()
        keep, drop, taken = [], [], 0
        for item in items:
            it = _item_param(item)
            if it is None:
                keep.append(item)
                continue
            ok = ((default is None or default.matches(it.marks)) and op_matches(it.op, opt.casedb_op)
                  and in_shard(it.signature, shard))
            if ok and opt.casedb_limit is not None:
                ok = taken < opt.casedb_limit
                taken += ok
            if ok and it.key in done:
                ok = False
            (keep if ok else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    # ---------------------------------------------------------------- controller: the run
    def _attach_run(self) -> None:
        from casedb.runner import connect, get_run, high_water

        conn = connect(self.db_path)
        try:
            get_run(conn, self.run_id)
            # what the run had before this session: every process skips exactly that
            self.upto = high_water(conn, self.run_id)
        finally:
            conn.close()

    def pytest_configure_node(self, node):
        node.workerinput["casedb"] = {"db": self.db_path, "upto": list(self.upto) if self.upto else None}

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        if not self.config.option.collectonly and any(_item_param(i) is not None for i in session.items):
            # import torch and the --import modules now (in a worker: before it reports its
            # collection), so the first case's time and its --timeout are its own; an unusable
            # target is reported by the first case
            from casedb.runner import TargetError

            try:
                self.target()
            except TargetError:
                pass
        if not _xdist_controller(self.config) and not self.is_worker:
            self._selected([item.nodeid for item in session.items])

    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.selected is None:
            self._selected(list(ids))

    def _selected(self, nodeids: list[str]) -> None:
        self.selected = nodeids
        if self.run_id is None and not any(_param_id(n) is not None for n in nodeids):
            return  # a session without model-op tests records nothing
        from casedb.runner import Recorder, connect, start_run, update_selection

        items = [it for it in (self.item_for(n) for n in nodeids) if it is not None]
        opt = self.config.option
        if opt.collectonly or opt.casedb_no_record or (not items and self.run_id is None):
            return
        figures = {"cases": len(items), "occurrences": sum(len(it.occurrences) for it in items),
                   "available": len(self.plan())}
        figures["duplicates_skipped"] = figures["occurrences"] - figures["cases"] if self.dedupe else 0
        self.conn = connect(self.db_path)
        if self.run_id is None:
            self.run_id = start_run(self.conn, selection={"options": self._options(), "source": "pytest"},
                                    args=[str(a) for a in self.config.invocation_params.args],
                                    device=opt.device, backend=opt.compile_backend)
            sel = update_selection(self.conn, self.run_id, planned=figures, pid=os.getpid())
        else:
            from casedb.runner import get_run

            sel = get_run(self.conn, self.run_id)["selection"]
            changes = {"pid": os.getpid()}
            if sel.get("planned") is None:
                changes["planned"] = figures
            else:
                changes["remaining"] = figures
            sel = update_selection(self.conn, self.run_id, **changes)
        self.recorder = Recorder(self.conn, self.run_id)
        self.loop_started = self.loop_last = time.monotonic()
        self.config.hook.pytest_casedb_planned(config=self.config, total=len(items),
                                               figures={**figures, "run_id": self.run_id})

    def _options(self) -> dict:
        """This session's selection in casedb run's terms (so --resume can redo it)."""
        opt = self.config.option
        return {"models": self.models, "dedupe": self.dedupe, "keyword": opt.keyword or None,
                "markexpr": opt.markexpr if self.mark_given else None, "op": opt.casedb_op,
                "limit": opt.casedb_limit, "shard": opt.casedb_shard, "device": opt.device,
                "backend": opt.compile_backend, "imports": list(opt.casedb_import),
                "reference_dtype": opt.casedb_reference_dtype, "check_determinism": opt.casedb_check_determinism,
                "replace_device": not opt.no_device_replace, "all_models": bool(opt.all_models)}

    def pytest_runtest_logstart(self, nodeid, location):
        if self.recorder is not None:
            self.started[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        if self.is_worker or self.recorder is None:
            return
        it = self.item_for(report.nodeid)
        if it is None or it.key in self.recorded:
            return
        from casedb.runner import lost_payload

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
                payload = lost_payload(it, "error", "setup failed", _longrepr(report))
        elif report.when == "teardown":
            return
        else:  # xdist: the worker died while running this test
            payload = self._lost(it, report, worker)
        duration = report.duration if report.when in ("call", "setup") else self._elapsed(report.nodeid)
        if self.recorder.record(it, payload, duration=duration, worker=worker, test_id=it.id):
            self.loop_last = time.monotonic()
            self.recorded.add(it.key)
            outcome = payload["outcome"]
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if outcome == "skipped":
                self.skips.append((it.id, payload["reason"]))
            else:
                self.skips += [(f"{it.id} [{j['model']}::{j['name']}]", j["reason"])
                               for j in payload["judgements"] if j["outcome"] == "skipped"]
            self.config.hook.pytest_casedb_recorded(config=self.config, outcome=outcome, item=it)

    def _elapsed(self, nodeid: str) -> float | None:
        t = self.started.get(nodeid)
        return None if t is None else time.monotonic() - t

    def _timeout(self) -> float | None:
        t = getattr(self.config.option, "timeout", None)
        return float(t) if t else None

    def _lost(self, it, report, worker):
        """A report without casedb's payload: a crash, a timeout, or an error outside the core."""
        from casedb.runner import lost_payload

        text = _longrepr(report)
        limit = self._timeout()
        if "Timeout (>" in text and "pytest-timeout" in text:
            return lost_payload(it, "timeout", f"no result within --timeout {limit:g} s" if limit else "timeout", text)
        if report.when not in ("call", "setup", "teardown"):
            elapsed = self._elapsed(report.nodeid)
            tail = self._worker_log_tail(worker)
            detail = "\n".join(x for x in (text, tail) if x)
            # pytest-timeout's thread method ends the worker; it died at the limit, not before
            if limit and elapsed is not None and elapsed >= 0.9 * limit:
                return lost_payload(it, "timeout", f"no result within --timeout {limit:g} s (the worker was ended)", detail)
            signal_line = _crash_line(tail)
            return lost_payload(it, "crashed", f"the worker process died{' (' + signal_line + ')' if signal_line else ''}",
                                detail)
        return lost_payload(it, "error", _first_line(text) or "failed without a result", text)

    def _worker_log_tail(self, worker) -> str | None:
        from casedb.runner import TAIL

        log_dir = self.config.option.casedb_worker_log_dir
        if not log_dir or not worker:
            return None
        path = Path(log_dir) / f"{worker}.log"
        try:
            text = path.read_bytes()[-16 * TAIL:].decode("utf-8", errors="replace")
        except OSError:
            return None
        # from the death notice on (faulthandler's "Fatal Python error: ..." and its stack)
        at = max(text.rfind("Fatal Python error"), text.rfind("+++++ Timeout"))
        return text[at:at + TAIL] if at >= 0 else text[-TAIL:]

    def pytest_sessionfinish(self, session, exitstatus):
        if self.is_worker:
            if self._store is not None:
                self._store.close()
            return
        # a session pytest could not complete (collection errors, Ctrl-C) leaves the run resumable
        broken = int(exitstatus) not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.recorder is None:
            if self.run_id is not None and not self.config.option.collectonly:
                # casedb run made the run row, and nothing was run: close it
                from casedb.runner import connect, finish_run

                conn = connect(self.db_path)
                try:
                    finish_run(conn, self.run_id, "interrupted" if self.fatal or broken else "finished",
                               error=self.fatal)
                finally:
                    conn.close()
            return
        from casedb.runner import finish_run

        planned = len([n for n in (self.selected or []) if self.item_for(n) is not None])
        complete = len(self.recorded) >= planned and not self.fatal and not broken
        # this session's run loop: from the cases being ready to run to the last one recorded
        session_figures = {"cases": len(self.recorded), "loop_s": round(self.loop_last - self.loop_started, 4)}
        self.summary = finish_run(self.conn, self.run_id, "finished" if complete else "interrupted", error=self.fatal,
                                  session=session_figures)
        self.conn.close()
        self.conn = None

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if self.is_worker:
            return
        if config.option.show_skipped and self.skips:
            terminalreporter.section("casedb: skipped cases")
            for tid, reason in self.skips:
                terminalreporter.line(f"SKIPPED {tid}: {reason}")
        summary = getattr(self, "summary", None)
        if summary is not None:
            parts = [f"{summary[k]} {k}" for k in ("passed", "failed", "errors", "crashed", "timeouts", "xfailed",
                                                   "xpassed", "ref_errors", "skipped") if summary.get(k)]
            terminalreporter.line(f"casedb: run {self.run_id} recorded in {self.db_path}: {summary['executed']} executed, "
                                  f"{summary['duplicates_skipped']} duplicates skipped; {', '.join(parts) or 'nothing run'}")
        if self.fatal:
            terminalreporter.line(f"casedb: stopped: {self.fatal}", red=True)

    # ------------------------------------------------------------ processes running cases
    def target(self):
        """The prepared target of this process (imports done, device resolved), or raises."""
        from casedb.runner import Target, TargetError, prepare_target

        if self._target_error is not None:
            raise TargetError(self._target_error)
        if self._target is None:
            opt = self.config.option
            target = Target(device=opt.device, backend=opt.compile_backend,
                            reference_dtype=opt.casedb_reference_dtype,
                            check_determinism=opt.casedb_check_determinism,
                            replace_device=not opt.no_device_replace, imports=tuple(opt.casedb_import),
                            threads=opt.casedb_threads)
            try:
                self._target = prepare_target(target)
            except TargetError as e:
                self._target_error = str(e)
                raise
        return self._target


@contextlib.contextmanager
def _db_lock(db_path: str):
    """Serialize the first open of a DB across the session's processes: creating, migrating
    and seeding a new default DB must happen once, not once per xdist worker."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): xdist workers may race on a brand-new DB
        yield
        return
    lock = Path(db_path + "-lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _xdist_controller(config) -> bool:
    return (not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))
            and getattr(config.option, "dist", "no") != "no")


def _listing_only(config) -> bool:
    opt = config.option
    return bool(opt.list_models or opt.list_cases or opt.list_cases_by_mark is not None)


def _item_param(item):
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    return callspec.params.get(ARG)


def _payload(report) -> dict | None:
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


def test_model_op(casedb_case, request):
    """One operator case from the casedb DB: the CPU eager reference vs --device / --compile-backend."""
    from casedb.runner import UNEXPECTED, TargetError, execute_item, failure_message

    state = request.config.stash[_STATE]
    try:
        target = state.target()
    except TargetError as e:
        request.node.user_properties.append(("casedb", json.dumps({"fatal": str(e)})))
        request.session.shouldstop = f"casedb: {e}"
        pytest.fail(str(e), pytrace=False)
    payload = execute_item(casedb_case, target, state.store().load_blob)
    request.node.user_properties.append(("casedb", json.dumps(payload, default=str)))
    outcome = payload["outcome"]
    if outcome in UNEXPECTED:
        pytest.fail(failure_message(payload), pytrace=False)
    if outcome == "skipped":
        pytest.skip(payload["reason"])
    if outcome == "xfailed":
        pytest.xfail(payload["reason"])
    if outcome == "ref_error":
        # a bad case (the CPU reference raised), not a device failure: counted apart
        pytest.skip(f"ref_error: {payload['reason']}")
