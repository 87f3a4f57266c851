"""Issue 46, item 2: runs you can tell apart.

`casedb runs` says what each run ran: its front end, selection, shard, duration and the triage
files it applied; a partial rerun (pytest --lf, a narrower --op, one shard after the whole) names
the run it re-ran part of, and `casedb report`, Datasette and the dashboard lead with the latest
full run instead of it. Real runs: `casedb run` in process, and pytest sessions in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import runs_data
from tests.run.test_runner import RA, RB, write

CPU = ("--device", "cpu", "--backend", "eager", "-j", "0")


@pytest.fixture
def db(cli, db_path, tmp_path):
    assert cli("import", *write(tmp_path, ra=RA, rb=RB)).exit_code == 0
    return db_path


def run(cli, *args) -> dict:
    res = cli("run", "--model", "ra", *CPU, *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def listed(cli) -> dict[int, dict]:
    return {r["run_id"]: r for r in cli.json("runs")}


@pytest.mark.slow
def test_runs_say_what_they_ran_and_a_partial_rerun_does_not_lead(cli, db, tmp_path):
    run(cli)
    run(cli, "--op", "torch.mul")
    run(cli, "--shard", "1/2", "--no-shipped-triage")
    runs = listed(cli)
    assert [(r["front_end"], r["selection"], r["shard"], r["rerun_of"]) for r in runs.values()] == [
        ("casedb run", "model ra; shard 1/2", "1/2", 1),
        ("casedb run", "model ra; op torch.mul", None, 1),
        ("casedb run", "model ra", None, None)]
    assert all(isinstance(r["duration_s"], float) and r["duration_s"] >= 0 for r in runs.values())
    # the shipped triage applied by default, none where turned off
    assert runs[1]["triage"] and all(name.endswith(".yaml") for name in runs[1]["triage"]) and runs[3]["triage"] == []
    # the table says it too
    table = cli("runs", "--format", "plain").stdout.splitlines()
    assert table[0].split("\t")[:9] == ["run", "label", "status", "device", "backend", "front end", "selection",
                                       "rerun of", "triage"]
    assert table[1].split("\t")[5:9] == ["casedb run", "model ra; shard 1/2", "1", ""]
    # report leads with the full run, not the latest partial rerun
    assert cli.json("report")["run"]["run_id"] == 1
    # a full rerun is a full run again, and leads
    again = run(cli)["run_id"]
    assert listed(cli)[again]["rerun_of"] is None and cli.json("report")["run"]["run_id"] == again == 4


def pytest_session(tmp_path: Path, db: Path, *args) -> subprocess.CompletedProcess:
    """The pytest front end as a user runs it (its cache on: --lf reads it), in its own process."""
    (tmp_path / "test_ops.py").write_text("from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # its rootdir, and so its cache, here
    env = {**os.environ, "CASEDB_DB": str(db), "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TEST_COMPILE_BACKEND", None)
    data = Path(__file__).parents[1] / "data" / "custom_ops.py"
    return subprocess.run([sys.executable, "-m", "pytest", "test_ops.py", "-q", "-p", "no:randomly",
                           "--casedb-model", "ra", "--casedb-model", "rb", "--casedb-device", "cpu",
                           "--casedb-backend", "casedb_test_perturb", "--casedb-import", str(data),
                           "--casedb-judge", "tolerance", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_pytest_lf_rerun_is_partial_and_the_dashboard_leads_with_the_full_run(cli, db, tmp_path):
    first = pytest_session(tmp_path, db)
    assert first.returncode == 1, first.stdout[-3000:]
    rerun = pytest_session(tmp_path, db, "--lf")
    assert rerun.returncode == 1 and "3 failed" in rerun.stdout, rerun.stdout[-3000:]
    runs = listed(cli)
    assert [(r["front_end"], r["selection"], r["rerun_of"], r["executed"]) for r in runs.values()] == [
        ("pytest", "model ra, rb; -m default", 1, 3), ("pytest", "model ra, rb; -m default", None, 4)]
    assert cli.json("report")["run"]["run_id"] == 1
    with runs_data.Server(db, tmp_path / "serve.log") as server:
        failures = server.json("/casedb/latest_failures.json?_shape=array")
        trend = server.json("/casedb.json?sql=" + "select+casedb_latest_run()+as+run&_shape=array")
    assert {r["run_id"] for r in failures} == {1} and trend == [{"run": 1}]
