"""-j N: each worker's torch threads are its share of the CPUs this process may use (issue 30)."""

import os

from casedb.run import runner
from casedb.run.runspec import RunSpec


def threads_of(args: list) -> str | None:
    return args[args.index("--casedb-threads") + 1] if "--casedb-threads" in args else None


def test_workers_share_the_usable_cpus_not_the_machines(monkeypatch, tmp_path):
    """Pinned to 2 of 16 CPUs (taskset, a container's cpuset): 2 workers get 1 thread each, not 8."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    got = {jobs: threads_of(runner.pytest_args(RunSpec(jobs=jobs), db=tmp_path / "c.db", run_id=1, workdir=tmp_path))
           for jobs in (1, 2, 3)}
    assert got == {1: None, 2: "1", 3: "1"}
