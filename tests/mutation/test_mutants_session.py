"""casedb mutants in one pytest session: every backend in the same worker processes, each
backend's results in its own run; no triage file reaches the control (issue 28)."""

import json
import os

import pytest
from tests.helpers import rows

TINY = """\
model: tiny
default: {dtype: fp32}
cases:
  - name: add_bcast
    op: torch.add
    inputs:
      - tensor: {shape: [4, 100]}
      - tensor: {shape: [100]}
  - name: log_nan
    op: torch.log
    inputs:
      - tensor: {shape: [64]}
  - name: mul_sq
    op: torch.mul
    inputs:
      - tensor: {shape: [8, 128]}
      - tensor: {shape: [8, 128]}
"""


@pytest.fixture
def tiny_db(imported_db):
    return imported_db({"tiny.yaml": TINY})


@pytest.mark.slow
def test_every_backend_runs_in_the_same_worker(cli, tiny_db, tmp_path):
    """-j 1: one worker process starts (imports the --import module once) and runs the control
    and both mutants; each backend's results go to its own run, --limit counting cases."""
    log = tmp_path / "imports.log"
    module = tmp_path / "count_imports.py"
    module.write_text(f"import os\nwith open({str(log)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n")
    res = cli("mutants", "--model", "tiny", "--mutant", "lost_sign", "--mutant", "nan_inf",
                 "--import", module, "-j", "1", "--limit", "2", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    pids = log.read_text().split()
    # this process imports it to list the mutants; the session's processes import it once each
    workers = [p for p in pids if p != str(os.getpid())]
    assert len(workers) == 1, pids

    ids = [report["control"]["run_id"]] + [m["run_id"] for m in report["mutants"]]
    runs = rows(tiny_db, f"SELECT id, backend, status, label, json_extract(selection, '$.source') AS source "
                         f"FROM runs WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id", ids)
    assert runs == [{"id": i, "backend": f"casedb_mutant_{n}", "status": "finished", "label": f"mutant:{n}",
                     "source": "casedb mutants"} for i, n in zip(ids, ("none", "lost_sign", "nan_inf"))]
    per_run = {r["run_id"]: r["sigs"] for r in rows(
        tiny_db, "SELECT run_id, group_concat(signature) AS sigs FROM (SELECT run_id, signature FROM results "
                 "ORDER BY run_id, signature) GROUP BY run_id")}
    assert set(per_run) == set(ids) and len(set(per_run.values())) == 1
    assert len(per_run[ids[0]].split(",")) == 2
    workers_seen = rows(tiny_db, "SELECT DISTINCT worker FROM results WHERE run_id IN (?, ?, ?)", ids)
    assert workers_seen == [{"worker": "gw0"}]
    (lost_sign, nan_inf) = report["mutants"]
    assert (report["control"]["passed"], lost_sign["changed"], lost_sign["caught"]) == (2, 2, 2)
    assert (nan_inf["executed"], nan_inf["survivors"], nan_inf["failed_unchanged"]) == (2, [], [])


@pytest.mark.slow
def test_the_control_reads_no_triage_file(cli, tiny_db, tmp_path, monkeypatch):
    """A ./triage/*.yaml that excludes a case and expects another to fail leaves every run alone."""
    (tmp_path / "triage").mkdir()
    (tmp_path / "triage" / "t.yaml").write_text("""\
version: 1
cases:
  - {model: tiny, name: log_nan, status: exclude, reason: hidden}
  - {model: tiny, name: add_bcast, status: known_failure, reason: hidden too}
""")
    monkeypatch.chdir(tmp_path)
    res = cli("mutants", "--model", "tiny", "--mutant", "lost_sign", "-j", "0", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    c = report["control"]
    assert {k: c.get(k) for k in ("executed", "passed", "false_alarms", "outcomes", "triage")} == {
        "executed": 3, "passed": 3, "false_alarms": 0, "outcomes": {"passed": 3}, "triage": []}
    (m,) = report["mutants"]
    assert (m["executed"], m["changed"], m["caught"]) == (3, 3, 3)
    text = cli("mutants", "--model", "tiny", "--mutant", "lost_sign", "-j", "0", "--no-progress")
    assert text.exit_code == 0, text.output
    flat = " ".join(text.stdout.split())
    assert (f"control run {c['run_id'] + 2}: no triage files (neither ./triage/*.yaml nor the shipped triage): "
            "the control shows every false alarm") in flat
