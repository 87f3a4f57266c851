"""The worker of a casedb pytest session (an xdist worker, or the only process): it parametrizes
``test_model_op`` from the plan, selects what runs (the default marker filter, --op, --shard,
--max-numel, --limit, the triage files, what a resumed run already has) and prepares the target
the cases execute on (:func:`casedb.run.target.execute_item` runs each).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from casedb.cases import expectations, marks as marks_mod
from casedb.errors import CasedbError
from casedb.names import model_mark
from casedb.run.plan import in_shard, op_matches
from casedb.run.runspec import parse_shard
from casedb.run.session import ARG, BACKEND_SEP, Cases, item_param
from casedb.run.decide import triage_target
from casedb.run.target import Target, TargetError, entries_timeout, prepare_target, triage_entries
from casedb import triage as triage_mod


def registered_markers(config) -> set[str]:
    """The names of the markers registered in this session so far."""
    return {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}


class Worker:
    """Collects the model-op tests and executes cases (an xdist worker, or the only process)."""

    def __init__(self, cases: Cases):
        self.cases = cases
        self.config = cases.config
        self._marks: dict = {}
        # the markers registered when casedb configured (the project's ini, casedb's derived
        # marks): a stored mark of any other registered name is some plugin's, never applied
        self._project_markers = registered_markers(self.config)
        self._others: set | None = None
        self._dropped: set = set()
        self._targets: dict = {}        # backend (None: the spec's) -> the prepared target
        self._target_errors: dict = {}
        self._store = None
        self._triage = None

    @property
    def triage(self):
        """The run's triage files (casedb.triage.entries.Triage), or None without any."""
        if self._triage is None and self.cases.spec.triage:
            try:
                self._triage = triage_mod.load(self.cases.spec.triage)
            except CasedbError as e:
                raise pytest.UsageError(str(e)) from None
        return self._triage

    def rules(self) -> list:
        """Tolerance rules of the run's triage files for this target."""
        return self.triage.rules(arch=self.target().arch) if self.triage else []

    def store(self):
        """The case DB, opened on first use (the blobs of cases' file inputs come from it)."""
        if self._store is None:
            from casedb.store.database import Store  # (see casedb.run.session)

            self._store = Store(self.cases.db_path)
        return self._store

    def _mark(self, name: str):
        mark = self._marks.get(name)
        if mark is None:
            # registered before use, so --strict-markers accepts what manifests declare
            if name not in registered_markers(self.config):
                doc = (f"cases of model {name[6:]} (casedb)" if name.startswith("model_")
                       else "mark declared by a casedb manifest")
                self.config.addinivalue_line("markers", f"{name}: {doc}")
            mark = self._marks[name] = getattr(pytest.mark, name)
        return mark

    def _case_marks(self, names) -> list:
        """The pytest marks of a case's stored marks, but those named like a marker pytest or a
        plugin gives behaviour to (skip, xfail, timeout...) or like casedb's model marks: a
        database from elsewhere must not skip a failing case or file it under another model."""
        if self._others is None:
            self._others = registered_markers(self.config) - self._project_markers
        usable, dropped = [], []
        for n in names:
            bad = n in self._others or expectations.reserved_mark(n)
            (dropped if bad else usable).append(n)
        dropped = set(dropped) - self._dropped
        if dropped:
            self._dropped |= dropped
            warnings.warn(pytest.PytestConfigWarning(
                f"casedb: case marks {', '.join(sorted(dropped))} name pytest's or a plugin's markers (or "
                "casedb's model marks): not applied (import refuses them; the database holds them from elsewhere)"))
        return [self._mark(n) for n in usable]

    def pytest_generate_tests(self, metafunc):
        if ARG not in metafunc.fixturenames:
            return
        params = []
        plan = self.cases.plan()
        self._case_marks(sorted(self.cases.mark_names))  # -m may name a mark of any case of the DB
        backends = list(self.cases.backend_runs)
        for it in plan:
            marks = self._case_marks(it.marks) + [self._mark(model_mark(m)) for m in it.models]
            if not backends:
                params.append(pytest.param(it, id=it.id, marks=marks))
            # one case's backends one after the other: its inputs and reference are built while warm
            params += [pytest.param(it, id=f"{it.id}{BACKEND_SEP}{b}", marks=marks) for b in backends]
        metafunc.parametrize(ARG, params)

    def pytest_itemcollected(self, item):
        it = item_param(item)
        if it is not None:
            # -k matches the op (torch.add, aten.mm), case names and models, not only the id
            item.extra_keyword_matches.update({it.op, *it.names, *it.models})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        """Deselect the model-op tests this run does not take (see the module docstring)."""
        if not any(item_param(item) is not None for item in items):
            return
        spec = self.cases.spec
        try:
            shard = parse_shard(spec.shard)
        except CasedbError as e:
            raise pytest.UsageError(str(e)) from None
        default = None if spec.markexpr is not None else marks_mod.MarkExpression(marks_mod.DEFAULT_EXCLUDE)
        done = self._done_keys()
        keep, drop, taken = [], [], set()  # taken: the plan keys --limit counts (once over several backends)
        for item in items:
            it = item_param(item)
            if it is None:
                keep.append(item)
                continue
            ok = ((default is None or default.matches(it.marks)) and op_matches(it.op, spec.op)
                  and in_shard(it.signature, shard) and (spec.max_numel is None or it.numel <= spec.max_numel)
                  and self._triaged(item, it) and (spec.max_numel is None or it.fits(spec.max_numel)))
            if ok and spec.limit is not None and it.key not in taken:
                ok = len(taken) < spec.limit
                if ok:
                    taken.add(it.key)
            if ok and it.key in done:
                ok = False
            (keep if ok else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def _done_keys(self) -> set:
        """The plan keys the resumed run already has a result for (empty for a new run)."""
        if self.cases.run_id is None:
            return set()
        from casedb.store.recorder import done_keys  # (see casedb.run.session)

        return done_keys(self.store().conn, self.cases.run_id, dedupe=self.cases.spec.dedupe, upto=self.cases.upto)

    def _triaged(self, item, it) -> bool:
        """Apply the triage files at collection: False when every occurrence is excluded; an
        entry's timeout becomes the test's."""
        if self.triage is None:
            return True
        try:
            where = triage_target(self.target(item))
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
        if not self.config.option.collectonly and any(item_param(i) is not None for i in session.items):
            # import torch and the --import modules now (in a worker: before it reports its
            # collection), so the first case's time and its --timeout are its own; an unusable
            # target is reported by the first case
            for backend in list(self.cases.backend_runs) or [None]:
                try:
                    self.target(backend=backend)
                except TargetError:
                    pass

    def target(self, node=None, *, backend: str | None = None):
        """The prepared target of this process (imports done, device resolved) for test ``node``
        (its backend, in a session over several), or raises."""
        if node is not None:
            backend = self.cases.backend_of(node.nodeid)
        if backend in self._target_errors:
            raise TargetError(self._target_errors[backend])
        if backend not in self._targets:
            spec = self.cases.spec if backend is None else replace(self.cases.spec, backend=backend)
            try:
                self._targets[backend] = prepare_target(Target.from_spec(spec))
                from casedb.run import execute, refcache  # (torch: see prepare_target)

                # one cache for the process: every backend of a session reads the same references
                execute.use_reference_cache(refcache.for_run(self.cases.db_path)
                                            if self.cases.spec.reference_cache else None)
            except TargetError as e:
                self._target_errors[backend] = str(e)
                raise
        return self._targets[backend]

    def pytest_sessionfinish(self, session, exitstatus):
        if self._targets:  # (-j 0: this process goes on after the run)
            from casedb.run import execute

            execute.use_reference_cache(None)
        if self._store is not None:
            self._store.close()
