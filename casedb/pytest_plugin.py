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
splits it: the :class:`~casedb.run.controller.Controller` (the process that records the run; with
``-n``, xdist's controller) and the :class:`~casedb.run.worker.Worker` (the processes that collect
and execute cases; with ``-n``, each xdist worker). Without ``-n`` one process is both. This
module holds the options and the hooks; heavy imports (torch) happen in the process that
executes cases, on the first case.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from casedb.cases import marks as marks_mod
from casedb.errors import CasedbError
from casedb.outcomes import UNEXPECTED
from casedb.console import clean
from casedb.run.controller import Controller
from casedb.run.runspec import field_default, negative, spec_fields
from casedb.run.session import (MARK_GIVEN, NO_EXPR, Cases, item_param, listing_only, spec_dest,
                                xdist_controller)
from casedb.run.junit import capability_properties
from casedb.run.target import TargetError, execute_item, failure_message
from casedb.run.worker import Worker

_CASES = pytest.StashKey[Cases]()
_WORKER = pytest.StashKey[Worker]()
_TRACE_LOG = pytest.StashKey[bool]()
# torch's structured-trace logger: DEBUG records with empty messages, meant for TORCH_TRACE's own
# handler. pytest (>= 8) attaches its capture to every logger that does not propagate, so each
# failing case showed ~25 empty "DEBUG torch.__trace" lines; off for the session unless TORCH_TRACE.
TRACE_LOGGER = "torch.__trace"


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
     dict(nargs="?", const=NO_EXPR, default=None, metavar="MARKEXPR",
          help="List the cases a marker expression selects (default: -m, else the RFC's default filter) and exit.")),
    ("--casedb-show-excluded", "--show-excluded",
     dict(action="store_true", help="With --list-cases-by-mark: list the excluded cases instead.")),
    ("--casedb-show-skipped", "--show-skipped",
     dict(action="store_true", help="Summarize skipped model-op cases with their reasons.")),
    ("--casedb-db", None, dict(default=None, metavar="PATH",
                               help="Case DB (default: env CASEDB_DB, else data/casedb.sqlite).")),
    ("--casedb-run-id", None, dict(type=int, default=None, metavar="ID",
                                   help="Record into this run and skip what it already has (casedb run --resume).")),
    ("--casedb-backend-runs", None, dict(default=None, metavar="BACKEND=RUN,...", help=(
        "Run every case once per backend, each backend's results recorded in its run (casedb mutants)."))),
    ("--casedb-no-record", None, dict(action="store_true", help="Do not record this session as a run.")),
    ("--casedb-worker-log-dir", None, dict(default=None, help="Send each xdist worker's stdout/stderr to a file here.")),
)
# RFC spellings waiting for the project's conftests to load: (flag, dest, keywords)
_RFC_ALIASES: list[tuple[str, str, dict]] = []


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")




def pytest_addoption(parser):
    g = parser.getgroup("casedb", "casedb: model operator cases from the case DB (RFC-0186)")
    _RFC_ALIASES.clear()

    def add(flag, rfc, **kw):
        g.addoption(flag, **kw)
        if rfc:
            _RFC_ALIASES.append((rfc, kw["dest"], kw))

    for f, flag in spec_fields():
        if not flag.pytest:
            continue
        dest = spec_dest(f.name)
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
            kind = {"int | None": int, "int": int, "float": float}.get(f.type, None)
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
    early_config.stash[MARK_GIVEN] = _has_markexpr(args)
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



# ------------------------------------------------------------------------------------ session

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not os.environ.get("TORCH_TRACE"):
        import logging

        trace = logging.getLogger(TRACE_LOGGER)
        config.stash[_TRACE_LOG] = trace.disabled
        trace.disabled = True
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
    cases = Cases(config)
    config.stash[_CASES] = cases
    if workerinput is None:
        config.pluginmanager.register(Controller(cases), "casedb-controller")
    if not xdist_controller(config):
        worker = Worker(cases)
        config.stash[_WORKER] = worker
        config.pluginmanager.register(worker, "casedb-worker")


def pytest_unconfigure(config):
    if _TRACE_LOG in config.stash:
        import logging

        logging.getLogger(TRACE_LOGGER).disabled = config.stash[_TRACE_LOG]


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if not listing_only(config):
        return None
    # (the listing reads the store: sessions that list nothing never import it, see casedb.run.session)
    from casedb.run.listing import list_from_config

    try:
        list_from_config(config)
    except (CasedbError, ValueError) as e:
        print(clean(f"ERROR: {e}"))
        return pytest.ExitCode.USAGE_ERROR
    return pytest.ExitCode.OK


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Under strict markers an -m naming a mark nobody registered is refused on every pytest
    version, in casedb's words (pytest >= 9.2 refuses it itself; older ones select nothing)."""
    cases = config.stash.get(_CASES, None)
    if cases is None or not cases.spec.markexpr or not any(item_param(item) is not None for item in items):
        return
    from casedb.run.selection import item_marks

    problem = marks_mod.absent_derived(cases.spec.markexpr, [item_marks(it) for it in cases.plan()])
    if problem:  # a derived mark no case has: say so, not "N deselected"
        raise pytest.UsageError(problem)
    if not (config.getini("strict_markers") or getattr(config.option, "strict_markers", False)):
        return
    registered = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    problem = marks_mod.unknown_marks(cases.spec.markexpr, registered)
    if problem:
        raise pytest.UsageError(problem)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say what pytest's "N deselected" does not: how many of the plan's cases the RFC's default
    mark filter removed (no -m given), and how to include them."""
    controller = config.pluginmanager.get_plugin("casedb-controller")
    cases = config.stash.get(_CASES, None)
    if controller is None or not controller.summaries or cases is None or cases.spec.markexpr is not None:
        return  # no run recorded here, or -m given: pytest's own count says it all
    default = marks_mod.MarkExpression(marks_mod.DEFAULT_EXCLUDE)
    removed = sum(not default.matches(it.marks) for it in cases.plan())
    if removed:
        terminalreporter.line(f"casedb: {removed} cases deselected by the RFC default -m '{marks_mod.DEFAULT_EXCLUDE}'; "
                              "pass -m '' to include them")


def test_model_op(casedb_case, request):
    """One operator case from the casedb DB: the CPU eager reference vs --device / --compile-backend."""
    worker = request.config.stash[_WORKER]
    try:
        target = worker.target(request.node)
    except TargetError as e:
        request.node.user_properties.append(("casedb", json.dumps({"fatal": str(e)})))
        request.session.shouldstop = f"casedb: {e}"
        pytest.fail(str(e), pytrace=False)
    payload = execute_item(casedb_case, target, worker.store().load_blob, rules=worker.rules(), triage=worker.triage)
    request.node.user_properties.append(("casedb", json.dumps(payload, default=str)))
    # the RFC runner's JUnit properties (--junitxml): a CI reading its reports reads casedb's
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
