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

Every option has a ``--casedb-…`` spelling; the RFC's plain spellings (``--model``,
``--device``, ``--compile-backend``, ``--list-cases`` ...) are registered too, after the
project's own conftest.py files are loaded, for each name nobody else owns (a project whose
conftest defines ``--model`` keeps it, and selects casedb models with ``--casedb-model``).
Run options come from :class:`casedb.run.runspec.RunSpec`.

A session that runs model-op tests is recorded in the DB as a run, exactly as ``casedb run``
records one (``casedb run`` *is* such a session). Two objects do the work, as pytest-xdist
splits it: the :class:`Controller` (the process that records the run; with ``-n``, xdist's
controller) and the :class:`Worker` (the processes that collect and execute cases; with
``-n``, each xdist worker). Without ``-n`` one process is both. Heavy imports (torch) happen in
the process that executes cases, on the first case.
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
_CASES = pytest.StashKey["_Cases"]()
_WORKER = pytest.StashKey["Worker"]()
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


# ------------------------------------------------------------------------------------ options

# (casedb spelling, RFC spelling or None, argparse keywords) of the plugin's own options, beside
# the RunSpec ones: listing, the DB, and what casedb run hands its session.
_PLUGIN_OPTIONS = (
    ("--casedb-list-models", "--list-models", dict(action="store_true", help="List the models in the DB and exit.")),
    ("--casedb-list-cases", "--list-cases",
     dict(action="store_true", help="List cases as model::name::op (manifest path) and exit.")),
    ("--casedb-list-cases-by-mark", "--list-cases-by-mark",
     dict(nargs="?", const=_NO_EXPR, default=None, metavar="MARKEXPR",
          help="List the cases a marker expression selects (default: -m, else the RFC's default filter) and exit.")),
    ("--casedb-show-excluded", "--show-excluded",
     dict(action="store_true", help="With --list-cases-by-mark: list the excluded cases instead.")),
    ("--casedb-show-skipped", "--show-skipped",
     dict(action="store_true", help="Summarize skipped model-op cases with their reasons.")),
    ("--casedb-db", None, dict(default=None, metavar="PATH",
                               help="Case DB (default: env CASEDB_DB, else data/casedb.sqlite).")),
    ("--casedb-run-id", None, dict(type=int, default=None, metavar="ID",
                                   help="Record into this run and skip what it already has (casedb run --resume).")),
    ("--casedb-no-record", None, dict(action="store_true", help="Do not record this session as a run.")),
    ("--casedb-worker-log-dir", None, dict(default=None, help="Send each xdist worker's stdout/stderr to a file here.")),
)
# RFC spellings waiting for the project's conftests to load: (flag, dest, keywords)
_RFC_ALIASES: list[tuple[str, str, dict]] = []


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _spec_dest(name: str) -> str:
    return "casedb_" + name


def pytest_addoption(parser):
    from casedb.run.runspec import field_default, negative, spec_fields

    g = parser.getgroup("casedb", "casedb: model operator cases from the case DB (RFC-0186)")
    _RFC_ALIASES.clear()

    def add(flag, rfc, **kw):
        g.addoption(flag, **kw)
        if rfc:
            _RFC_ALIASES.append((rfc, kw["dest"], kw))

    for f, flag in spec_fields():
        if not flag.pytest:
            continue
        dest = _spec_dest(f.name)
        default = field_default(f.name)
        if isinstance(default, bool):
            on, off = flag.pytest, negative(flag.pytest)
            if default:
                add(on, flag.rfc, dest=dest, action="store_true", default=True, help=argparse_help(flag.help))
                add(off, flag.rfc and negative(flag.rfc), dest=dest, action="store_false", help="(turns it off)")
            else:
                add(on, flag.rfc, dest=dest, action="store_true", default=False, help=argparse_help(flag.help))
        elif isinstance(default, list):
            add(flag.pytest, flag.rfc, dest=dest, action="append", default=[], metavar=flag.metavar,
                help=argparse_help(flag.help))
        else:
            kind = {"int | None": int, "int": int}.get(f.type, None)
            kw = dict(dest=dest, default=default, metavar=flag.metavar, help=argparse_help(flag.help))
            if kind:
                kw["type"] = kind
            if flag.choices:
                kw["choices"] = flag.choices
            add(flag.pytest, flag.rfc, **kw)
    for flag, rfc, kw in _PLUGIN_OPTIONS:
        add(flag, rfc, dest=_dest(flag), **kw)


def argparse_help(text: str) -> str:
    return text.replace("%", "%%")


def _option_names(parser) -> set:
    names = set()
    for group in [getattr(parser, "_anonymous", None), *getattr(parser, "_groups", [])]:
        for option in getattr(group, "options", ()):
            names.update(option.names())
    return names


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # -m "" lifts the default filter, so "no -m at all" must be told apart from it; args here
    # include ini addopts and PYTEST_ADDOPTS.
    early_config.stash[_MARK_GIVEN] = _has_markexpr(args)
    result = yield
    # The project's conftests are loaded: give casedb the RFC spellings nobody else took.
    taken = _option_names(parser)
    group = parser.getgroup("casedb")
    for flag, dest, kw in _RFC_ALIASES:
        if flag not in taken:
            group.addoption(flag, **{**kw, "dest": dest})
            taken.add(flag)
    return result


def _has_markexpr(args) -> bool:
    for a in args:
        a = str(a)
        if a == "--":
            break
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            return True
    return False


def spec_from_config(config):
    """This session's RunSpec, from its options."""
    from casedb.run.runspec import RunSpec, spec_fields

    opt = config.option
    values = {f.name: getattr(opt, _spec_dest(f.name)) for f, flag in spec_fields() if flag.pytest}
    values["keyword"] = getattr(opt, "keyword", None) or None
    values["markexpr"] = opt.markexpr if config.stash.get(_MARK_GIVEN, False) else None
    values["jobs"] = int(getattr(opt, "numprocesses", None) or 0)
    values["timeout"] = float(getattr(opt, "timeout", None) or 0)
    values["fail_fast"] = getattr(opt, "maxfail", 0) == 1
    return RunSpec(**values)


# ------------------------------------------------------------------------------------ session

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    from casedb.cases import marks as marks_mod

    for name, doc in marks_mod.DERIVED.items():
        config.addinivalue_line("markers", f"{name}: {doc} (casedb derived mark)")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and config.option.casedb_worker_log_dir:
        # before pytest's faulthandler copies fd 2: a crash's own report lands in this file,
        # where the controller reads it for the crashed result
        path = Path(config.option.casedb_worker_log_dir) / f"{workerinput['workerid']}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    cases = _Cases(config)
    config.stash[_CASES] = cases
    if workerinput is None:
        config.pluginmanager.register(Controller(cases), "casedb-controller")
    if not _xdist_controller(config):
        worker = Worker(cases)
        config.stash[_WORKER] = worker
        config.pluginmanager.register(worker, "casedb-worker")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if not _listing_only(config):
        return None
    from casedb.errors import CasedbError

    try:
        _listing(config)
    except (CasedbError, ValueError) as e:
        from casedb.run.console import clean

        print(clean(f"ERROR: {e}"))
        return pytest.ExitCode.USAGE_ERROR
    return pytest.ExitCode.OK


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Under strict markers an -m naming a mark nobody registered is refused on every pytest
    version, in casedb's words (pytest >= 9.2 refuses it itself; older ones select nothing)."""
    cases = config.stash.get(_CASES, None)
    if cases is None or not cases.spec.markexpr or not any(_item_param(item) is not None for item in items):
        return
    if not (config.getini("strict_markers") or getattr(config.option, "strict_markers", False)):
        return
    from casedb.cases import marks as marks_mod

    registered = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    problem = marks_mod.unknown_marks(cases.spec.markexpr, registered)
    if problem:
        raise pytest.UsageError(problem)


def _db_arg(config) -> str | None:
    return config.option.casedb_db


def _listing(config) -> None:
    from casedb.cases import marks as marks_mod
    from casedb.run.console import clean
    from casedb.run.plan import model_mark
    from casedb.ingest.seed import open_seeded

    opt = config.option
    models = opt.casedb_models or None
    by_mark = opt.casedb_list_cases_by_mark
    with open_seeded(_db_arg(config)) as store:
        if opt.casedb_list_models:
            for m in store.models():
                print(clean(f"{m['name']}: {m['cases']} cases ({m['unique_cases']} unique), {m['ops']} ops"
                            f"{' — ' + m['source'] if m['source'] else ''}  [-m {model_mark(m['name'])}]"))
        rows = store.occurrences(models) if (opt.casedb_list_cases or by_mark is not None) else []
    if opt.casedb_list_cases:
        for r in rows:
            print(clean(f"{r['model']}::{r['name']}::{r['op']} ({_manifest_path(r['source'])})"))
    if by_mark is not None:
        expr = by_mark
        if expr == _NO_EXPR:
            expr = opt.markexpr if config.stash.get(_MARK_GIVEN, False) else marks_mod.DEFAULT_EXCLUDE
        matcher = marks_mod.MarkExpression(expr)
        excluded = opt.casedb_show_excluded
        picked = [r for r in rows if matcher.matches(list(r["marks"]) + [model_mark(r["model"])]) != excluded]
        what = "excluded by" if excluded else "selected by"
        print(f"cases {what} -m {expr!r}:")
        for r in picked:
            print(clean(f"{r['model']}::{r['name']}::{r['op']} [{', '.join(r['marks'])}]"))
        counts: dict[str, int] = {}
        for r in picked:
            for m in r["marks"] or ["(no marks)"]:
                counts[m] = counts.get(m, 0) + 1
        print(f"{len(picked)} of {len(rows)} cases {what} -m {expr!r}"
              + (" (" + ", ".join(f"{m}: {n}" for m, n in sorted(counts.items())) + ")" if counts else ""))


def _manifest_path(source: str | None) -> str:
    if not source:
        return "?"
    return re.sub(r":\d+$", "", source)


class _Cases:
    """What every process of the session shares: the spec, the DB and the plan (built lazily)."""

    def __init__(self, config):
        self.config = config
        self.workerinput = getattr(config, "workerinput", None)
        shared = (self.workerinput or {}).get("casedb", {})
        self._db_path = shared.get("db")
        self.upto = tuple(shared["upto"]) if shared.get("upto") else None  # the run's rows before this session
        self.spec = spec_from_config(config)
        if config.option.casedb_run_id is None:  # (casedb run hands its session the files it chose)
            from casedb.triage import run_paths

            # the project's triage/*.yaml, as casedb run finds them (the invocation directory, not
            # rootdir: pytest's rootdir follows path-like option values), and the shipped triage
            self.spec.triage = run_paths(self.spec.triage, cwd=Path(config.invocation_params.dir),
                                         shipped=self.spec.shipped_triage)
        self.smoke = not self.spec.models and not self.spec.all_models
        self.run_id = config.option.casedb_run_id
        self._plan = None
        self._by_id = None
        self.mark_names: set[str] = set()  # every mark of the DB (with the plan)

    @property
    def db_path(self) -> str:
        # absolute: every process of the session (xdist workers too) opens the same file;
        # resolved on first use, so sessions without model-op tests never import the store
        if self._db_path is None:
            from casedb.store.database import db_path

            self._db_path = str(db_path(_db_arg(self.config)).resolve())
        return self._db_path

    def plan(self):
        if self._plan is None:
            from casedb.errors import CasedbError
            from casedb.run.plan import build_plan
            from casedb.ingest.seed import open_seeded

            try:
                with _db_lock(self.db_path), open_seeded(self.db_path) as store:
                    self._plan = build_plan(store, self.spec.models or None, dedupe=self.spec.dedupe, smoke=self.smoke)
                    self.mark_names = store.mark_names()
            except CasedbError as e:
                raise pytest.UsageError(str(e)) from None
            self._by_id = {it.id: it for it in self._plan}
        return self._plan

    def item_for(self, nodeid: str):
        from casedb.run.plan import param_id

        pid = param_id(nodeid)
        if pid is None:
            return None
        self.plan()
        return self._by_id.get(pid)


class Worker:
    """Collects the model-op tests and executes cases (an xdist worker, or the only process)."""

    def __init__(self, cases: _Cases):
        self.cases = cases
        self.config = cases.config
        self._marks: dict = {}
        self._target = None
        self._target_error = None
        self._store = None
        self._triage = None

    @property
    def triage(self):
        """The run's triage files (casedb.triage.entries.Triage), or None without any."""
        if self._triage is None and self.cases.spec.triage:
            from casedb import triage
            from casedb.errors import CasedbError

            try:
                self._triage = triage.load(self.cases.spec.triage)
            except CasedbError as e:
                raise pytest.UsageError(str(e)) from None
        return self._triage

    def rules(self) -> list:
        """Tolerance rules of the run's triage files for this target."""
        return self.triage.rules(arch=self.target().arch) if self.triage else []

    def store(self):
        if self._store is None:
            from casedb.store.database import Store

            self._store = Store(self.cases.db_path)
        return self._store

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
        from casedb.run.plan import model_mark

        params = []
        plan = self.cases.plan()
        for name in sorted(self.cases.mark_names):  # -m may name a mark of any case of the DB
            self._mark(name)
        for it in plan:
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
        from casedb.cases import marks as marks_mod
        from casedb.errors import CasedbError
        from casedb.store.history import connect, done_keys
        from casedb.run.plan import in_shard, op_matches
        from casedb.run.runspec import parse_shard

        spec = self.cases.spec
        try:
            shard = parse_shard(spec.shard)
        except CasedbError as e:
            raise pytest.UsageError(str(e)) from None
        default = None if spec.markexpr is not None else marks_mod.MarkExpression(marks_mod.DEFAULT_EXCLUDE)
        done = set()
        if self.cases.run_id is not None:
            conn = connect(self.cases.db_path)
            try:
                done = done_keys(conn, self.cases.run_id, dedupe=spec.dedupe, upto=self.cases.upto)
            finally:
                conn.close()
        keep, drop, taken = [], [], 0
        for item in items:
            it = _item_param(item)
            if it is None:
                keep.append(item)
                continue
            ok = ((default is None or default.matches(it.marks)) and op_matches(it.op, spec.op)
                  and in_shard(it.signature, shard) and (spec.max_numel is None or it.numel <= spec.max_numel)
                  and self._triaged(item, it) and (spec.max_numel is None or it.fits(spec.max_numel)))
            if ok and spec.limit is not None:
                ok = taken < spec.limit
                taken += ok
            if ok and it.key in done:
                ok = False
            (keep if ok else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def _triaged(self, item, it) -> bool:
        """Apply the triage files at collection: False when every occurrence is excluded; an
        entry's timeout becomes the test's."""
        if self.triage is None:
            return True
        from casedb.run.target import TargetError, entries_timeout, triage_entries, triage_target

        try:
            where = triage_target(self.target())
        except TargetError:
            return True  # the first case reports why the target cannot be used
        entries = triage_entries(it, self.triage, where)
        if entries and all(e is not None and e.status == "exclude" for e in entries):
            return False
        timeout = entries_timeout(entries)
        if timeout:
            item.add_marker(pytest.mark.timeout(timeout))
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session):
        if not self.config.option.collectonly and any(_item_param(i) is not None for i in session.items):
            # import torch and the --import modules now (in a worker: before it reports its
            # collection), so the first case's time and its --timeout are its own; an unusable
            # target is reported by the first case
            from casedb.run.target import TargetError

            try:
                self.target()
            except TargetError:
                pass

    def target(self):
        """The prepared target of this process (imports done, device resolved), or raises."""
        from casedb.run.target import Target, TargetError, prepare_target

        if self._target_error is not None:
            raise TargetError(self._target_error)
        if self._target is None:
            try:
                self._target = prepare_target(Target.from_spec(self.cases.spec))
            except TargetError as e:
                self._target_error = str(e)
                raise
        return self._target

    def pytest_sessionfinish(self, session, exitstatus):
        if self._store is not None:
            self._store.close()


class Controller:
    """Records the session as a run (xdist's controller, or the only process): starts or reopens
    the run, stores each case's payload as its report arrives, closes the run."""

    def __init__(self, cases: _Cases):
        self.cases = cases
        self.config = cases.config
        self.conn = None
        self.recorder = None
        self.recorded: set = set()
        self.started: dict[str, float] = {}
        self.selected: list[str] | None = None
        self.fatal: str | None = None
        self.skips: list[tuple[str, str]] = []
        self.summary = None
        self._triage_where = None
        if cases.run_id is not None:
            self._attach_run()
        if cases.spec.models and not _listing_only(self.config):
            self._check_db()

    def _check_db(self) -> None:
        # Opening here (before workers start) creates and seeds a new default DB once, and turns
        # an unknown --model or a bad option into a usage error.
        from casedb import triage
        from casedb.errors import CasedbError
        from casedb.ingest.seed import open_seeded

        try:
            self.cases.spec.validate()
            with _db_lock(self.cases.db_path), open_seeded(self.cases.db_path) as store:
                for m in self.cases.spec.models:
                    store.model(m)
                triage.require_clean(self.cases.spec.triage, store)
        except CasedbError as e:
            raise pytest.UsageError(str(e)) from None

    def _attach_run(self) -> None:
        from casedb.store.history import connect, get_run, high_water

        conn = connect(self.cases.db_path)
        try:
            get_run(conn, self.cases.run_id)
            # what the run had before this session: every process skips exactly that
            self.cases.upto = high_water(conn, self.cases.run_id)
        finally:
            conn.close()

    def pytest_configure_node(self, node):
        node.workerinput["casedb"] = {"db": self.cases.db_path, "upto": list(self.cases.upto) if self.cases.upto else None}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        if not _xdist_controller(self.config):
            self._selected([item.nodeid for item in session.items])

    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.selected is None:
            self._selected(list(ids))

    def _selected(self, nodeids: list[str]) -> None:
        from casedb.run.plan import param_id

        self.selected = [n for n in nodeids if param_id(n) is not None]
        if self.cases.run_id is None and not self.selected:
            return  # a session without model-op tests records nothing
        from casedb.store import history
        from casedb.run.runspec import SELECTION_VERSION

        items = [it for it in (self.cases.item_for(n) for n in self.selected) if it is not None]
        opt = self.config.option
        if opt.collectonly or opt.casedb_no_record or (not items and self.cases.run_id is None):
            return
        dedupe = self.cases.spec.dedupe
        figures = {"cases": len(items), "occurrences": sum(len(it.occurrences) for it in items),
                   "available": len(self.cases.plan())}
        figures["duplicates_skipped"] = figures["occurrences"] - figures["cases"] if dedupe else 0
        self.conn = history.connect(self.cases.db_path)
        if self.cases.run_id is None:
            self.cases.run_id = history.start_run(
                self.conn, selection={"version": SELECTION_VERSION, "options": self.cases.spec.selection(),
                                      "source": "pytest"},
                args=[str(a) for a in self.config.invocation_params.args],
                device=self.cases.spec.device, backend=self.cases.spec.backend)
            # the arch the run resolved (sm_90), which `triage update` scopes entries to
            history.update_selection(self.conn, self.cases.run_id, planned=figures, pid=os.getpid(),
                                     arch=self._triage()[1]["arch"])
        else:
            sel = history.get_run(self.conn, self.cases.run_id)["selection"]
            changes = {"pid": os.getpid()}
            if sel.get("planned") is None:
                changes["planned"] = figures
            else:
                changes["remaining"] = figures
            history.update_selection(self.conn, self.cases.run_id, **changes)
        self.recorder = history.Recorder(self.conn, self.cases.run_id)
        self.loop_started = self.loop_last = time.monotonic()
        self.config.hook.pytest_casedb_planned(config=self.config, total=len(items),
                                               figures={**figures, "run_id": self.cases.run_id})

    def pytest_runtest_logstart(self, nodeid, location):
        if self.recorder is not None:
            self.started[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        if self.recorder is None:
            return
        it = self.cases.item_for(report.nodeid)
        if it is None or it.key in self.recorded:
            return
        from casedb.run.target import lost_payload

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
        if self.recorder.record(it, payload, duration=duration, worker=worker, test_id=it.id):
            self.loop_last = time.monotonic()
            self.recorded.add(it.key)
            outcome = payload["outcome"]
            if outcome == "skipped":
                self.skips.append((it.id, payload["reason"]))
            else:
                self.skips += [(f"{it.id} [{j['model']}::{j['name']}]", j["reason"])
                               for j in payload["judgements"] if j["outcome"] == "skipped"]
            self.config.hook.pytest_casedb_recorded(config=self.config, outcome=outcome, item=it)

    def _elapsed(self, nodeid: str) -> float | None:
        t = self.started.get(nodeid)
        return None if t is None else time.monotonic() - t

    def _triage(self):
        """(the run's triage files or None, the target they are read for), loaded once. The
        target is resolved here without the --import modules: the workers have the prepared one,
        but a lost case is judged in this process."""
        if self._triage_where is None:
            from casedb import triage
            from casedb.errors import CasedbError
            from casedb.run.target import resolve_arch, resolve_device

            spec, loaded = self.cases.spec, None
            if spec.triage:
                try:
                    loaded = triage.load(spec.triage)
                except CasedbError:
                    loaded = None  # reported at collection
            device = resolve_device(spec.device)
            self._triage_where = (loaded, {"device": device, "backend": spec.backend,
                                           "arch": resolve_arch(device, spec.arch)})
        return self._triage_where

    def _lost_payload(self, it, outcome: str, reason: str, detail: str | None = None) -> dict:
        from casedb.run.target import lost_payload

        triage, where = self._triage()
        return lost_payload(it, outcome, reason, detail, triage=triage, where=where)

    def _timeout(self, it) -> tuple[float | None, str]:
        """The case's time limit and what set it: its triage entry's ``timeout``, else --timeout."""
        from casedb.run.target import entries_timeout, triage_entries

        own = entries_timeout(triage_entries(it, *self._triage()))
        if own:
            return float(own), f"its triage entry's timeout {own:g} s"
        t = getattr(self.config.option, "timeout", None)
        return (float(t), f"--timeout {float(t):g} s") if t else (None, "")

    def _lost(self, it, report, worker):
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

    def _unrecorded(self) -> list[str]:
        """Selected model-op tests this session has no recorded result for."""
        missing = []
        for nodeid in self.selected or []:
            it = self.cases.item_for(nodeid)
            if it is None or it.key not in self.recorded:
                missing.append(nodeid)
        return missing

    def pytest_sessionfinish(self, session, exitstatus):
        from casedb.store import history

        # a session pytest could not complete (collection errors, Ctrl-C) leaves the run resumable
        broken = int(exitstatus) not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.recorder is None:
            if self.cases.run_id is not None and not self.config.option.collectonly:
                # casedb run made the run row, and nothing was run: close it
                conn = history.connect(self.cases.db_path)
                try:
                    history.finish_run(conn, self.cases.run_id, "interrupted" if self.fatal or broken else "finished",
                                       fatal=self.fatal)
                finally:
                    conn.close()
            return
        missing = self._unrecorded()
        error = None
        if missing and not (broken or self.fatal or session.shouldstop or session.shouldfail):
            # every planned case must have its row: never report success over a lost result
            error = (f"{len(missing)} of {len(self.selected)} selected cases have no recorded result "
                     f"(e.g. {', '.join(missing[:3])})")
        complete = not missing and not self.fatal and not broken
        # this session's run loop: from the cases being ready to run to the last one recorded
        session_figures = {"cases": len(self.recorded), "loop_s": round(self.loop_last - self.loop_started, 4)}
        self.summary = history.finish_run(self.conn, self.cases.run_id, "finished" if complete else "interrupted",
                                          error=error, fatal=self.fatal, session=session_figures)
        self.conn.close()
        self.conn = None

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if config.option.casedb_show_skipped and self.skips:
            terminalreporter.section("casedb: skipped cases")
            for tid, reason in self.skips:
                terminalreporter.line(f"SKIPPED {tid}: {reason}")
        summary = self.summary
        if summary is not None:
            from casedb import outcomes

            keys = [outcomes.COUNT_KEYS[name] for name in outcomes.SHOWN]
            parts = [f"{summary[k]} {k}" for k in keys if summary.get(k)]
            terminalreporter.line(f"casedb: run {self.cases.run_id} recorded in {self.cases.db_path}: "
                                  f"{summary['executed']} executed, {summary['duplicates_skipped']} duplicates skipped; "
                                  f"{', '.join(parts) or 'nothing run'}")
            if summary.get("error") and not self.fatal:
                terminalreporter.line(f"casedb: run {self.cases.run_id} not complete: {summary['error']}", red=True)
        if self.fatal:
            terminalreporter.line(f"casedb: stopped: {self.fatal}", red=True)


_TAIL = 4000


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
    return bool(opt.casedb_list_models or opt.casedb_list_cases or opt.casedb_list_cases_by_mark is not None)


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
    from casedb.outcomes import UNEXPECTED
    from casedb.run.target import TargetError, execute_item, failure_message

    worker = request.config.stash[_WORKER]
    try:
        target = worker.target()
    except TargetError as e:
        request.node.user_properties.append(("casedb", json.dumps({"fatal": str(e)})))
        request.session.shouldstop = f"casedb: {e}"
        pytest.fail(str(e), pytrace=False)
    payload = execute_item(casedb_case, target, worker.store().load_blob, rules=worker.rules(), triage=worker.triage)
    request.node.user_properties.append(("casedb", json.dumps(payload, default=str)))
    from casedb.run.junit import capability_properties  # the RFC runner's JUnit properties (--junitxml)

    request.node.user_properties += capability_properties(casedb_case, str(target.device), payload["outcome"])
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
