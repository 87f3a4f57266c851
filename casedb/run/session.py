"""What every process of a casedb pytest session shares: the :class:`Cases` (the RunSpec read from
the session's options, the DB path and the plan), and the helpers the plugin's hooks, the
:class:`~casedb.run.worker.Worker` and the :class:`~casedb.run.controller.Controller` have in common.

Every pytest session loads the plugin: the store (sqlite-utils) is imported on first use, so a
session without model-op tests does not pay for it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from casedb.errors import CasedbError
from casedb.run.plan import build_plan, param_id
from casedb.run.runspec import RunSpec, spec_fields
from casedb.triage import implicit_paths, run_paths

ARG = "casedb_case"
MARK_GIVEN = pytest.StashKey[bool]()  # whether -m was given at all (-m "" lifts the default filter)
NO_EXPR = "\0"  # --list-cases-by-mark without an expression
# A session over several backends (casedb mutants) runs each case once per backend, as tests
# "<plan id> @<backend>" (plan ids hold no spaces), each backend's results recorded in its own run.
BACKEND_SEP = " @"


def narrowed(spec: RunSpec) -> bool:
    """A selection option beside the models is given (--op, -k, --shard, --limit, --max-numel): the
    session then selects from every model, as `casedb run` does, instead of the smoke set."""
    return bool(spec.op or spec.keyword or spec.shard or spec.limit or spec.max_numel)


def spec_dest(name: str) -> str:
    """The option dest of a RunSpec field in the plugin."""
    return "casedb_" + name


def spec_from_config(config) -> RunSpec:
    """This session's RunSpec, from its options, built once (every process of the session builds
    the same): the triage files are those it loads, the project's ``triage/*.yaml`` and the shipped
    triage included, unless casedb run handed the session the files it chose."""
    opt = config.option
    values = {f.name: getattr(opt, spec_dest(f.name)) for f, flag in spec_fields() if flag.pytest}
    values["keyword"] = getattr(opt, "keyword", None) or None
    values["markexpr"] = opt.markexpr if config.stash.get(MARK_GIVEN, False) else None
    values["jobs"] = int(getattr(opt, "numprocesses", None) or 0)
    values["timeout"] = float(getattr(opt, "timeout", None) or 0)
    values["fail_fast"] = getattr(opt, "maxfail", 0) == 1
    if opt.casedb_run_id is None:
        # the project's triage/*.yaml, as casedb run finds them (the invocation directory, not
        # rootdir: pytest's rootdir follows path-like option values), and the shipped triage
        values["triage"] = run_paths(values["triage"], cwd=Path(config.invocation_params.dir),
                                     shipped=values["shipped_triage"])
    return RunSpec(**values)


class Cases:
    """What every process of the session shares: the spec, the DB and the plan (built lazily)."""

    def __init__(self, config):
        self.config = config
        self.workerinput = getattr(config, "workerinput", None)
        shared = (self.workerinput or {}).get("casedb", {})
        self._db_path = shared.get("db")
        self.upto = tuple(shared["upto"]) if shared.get("upto") else None  # the run's rows before this session
        self.spec = spec_from_config(config)
        # the files loaded that no option named (the summary says so; casedb run says its own)
        cwd = Path(config.invocation_params.dir)
        self.triage_implicit: list = ([] if config.option.casedb_run_id is not None
                                      else implicit_paths(config.option.casedb_triage, cwd=cwd))
        self.smoke = not self.spec.models and not self.spec.all_models and not narrowed(self.spec)
        self.run_id = config.option.casedb_run_id
        self.backend_runs = parse_backend_runs(getattr(config.option, "casedb_backend_runs", None))
        if self.backend_runs and self.run_id not in self.backend_runs.values():
            raise pytest.UsageError("--casedb-backend-runs needs --casedb-run-id, one of its runs "
                                    "(casedb mutants gives both)")
        self._plan = None
        self._by_id = None
        self.mark_names: set[str] = set()  # every mark of the DB (with the plan)

    @property
    def db_path(self) -> str:
        # absolute: every process of the session (xdist workers too) opens the same file;
        # resolved on first use, so sessions without model-op tests never import the store
        if self._db_path is None:
            from casedb.store.database import db_path

            self._db_path = str(db_path(self.config.option.casedb_db).resolve())
        return self._db_path

    def plan(self) -> list:
        if self._plan is None:
            from casedb.ingest.seed import open_seeded  # (see the module docstring)

            try:
                with db_lock(self.db_path), open_seeded(self.db_path) as store:
                    self._plan = build_plan(store, self.spec.models or None, dedupe=self.spec.dedupe, smoke=self.smoke)
                    self.mark_names = store.mark_names()
            except CasedbError as e:
                raise pytest.UsageError(str(e)) from None
            self._by_id = {it.id: it for it in self._plan}
        return self._plan

    def item_for(self, nodeid: str):
        """The plan item of a model-op test's node id (None: not one of this plan's)."""
        pid = param_id(nodeid)
        if pid is None:
            return None
        self.plan()
        return self._by_id.get(pid.split(BACKEND_SEP)[0])

    def backend_of(self, nodeid: str) -> str | None:
        """The backend a test of a session over several backends runs on (None: the spec's)."""
        pid = param_id(nodeid) or ""
        return pid.split(BACKEND_SEP, 1)[1] if self.backend_runs and BACKEND_SEP in pid else None


def parse_backend_runs(text: str | None) -> dict[str, int]:
    """``--casedb-backend-runs BACKEND=RUN,...`` as {backend: run id}, in order ({} without it)."""
    out: dict[str, int] = {}
    for part in filter(None, (text or "").split(",")):
        backend, _, run_id = part.partition("=")
        if not backend or not run_id.isdigit():
            raise pytest.UsageError(f"--casedb-backend-runs: {part!r} is not BACKEND=RUN_ID")
        out[backend] = int(run_id)
    return out


@contextlib.contextmanager
def db_lock(db_path: str):
    """Serialize the first open of a DB across the session's processes: creating, migrating
    and seeding a new default DB must happen once, not once per xdist worker."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): xdist workers may race on a brand-new DB
        yield
        return
    from casedb.store.database import check_db_file

    check_db_file(db_path)  # before its lock file is made beside it (a folder, /dev/null)
    lock = Path(db_path + "-lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: taskset, a container's cpuset), which
    os.cpu_count() overstates: the machine's count would give each -j worker too many torch
    threads, and they would fight over the few cores they have."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def xdist_controller(config) -> bool:
    """Whether this process is xdist's controller (it collects nothing and runs no case)."""
    return (not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))
            and getattr(config.option, "dist", "no") != "no")


def listing_only(config) -> bool:
    """Whether the session only lists (--list-models, --list-cases, --list-cases-by-mark)."""
    opt = config.option
    return bool(opt.casedb_list_models or opt.casedb_list_cases or opt.casedb_list_cases_by_mark is not None)


def item_param(item):
    """The plan item a collected test runs (None: not a model-op test)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    return callspec.params.get(ARG)


