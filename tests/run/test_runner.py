"""`casedb run`, resume, shard, merge: runs recorded as history, one crashing or hanging case at a time."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import rows

RA = """\
model: ra
default: {dtype: fp16, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: add
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: mul
    op: torch.mul
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: relu
    op: torch.relu
    inputs:
      - tensor: {shape: [8, 64]}
  - name: skip_cpu
    op: torch.abs
    skip_if:
      - expr: device == 'cpu' and dtype_str == 'fp16'
        reason: abs fp16 is not checked on the cpu
    inputs:
      - tensor: {shape: [2, 64]}
"""

# rb shares ra's add, with a looser tolerance of its own
RB = """\
model: rb
default: {dtype: fp16, rtol: 0.5, atol: 0.5}
cases:
  - name: add_b
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: neg
    op: torch.neg
    inputs:
      - tensor: {shape: [4, 64]}
"""

# Misbehaving cases between good ones; ops from tests/data/custom_ops.py and WRONG_OPS.
BAD = """\
model: bad
default: {dtype: fp16, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: first_ok
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: aborts
    op: torch.ops.casedb_test.abort
    inputs:
      - tensor: {shape: [4, 64]}
  - name: middle_ok
    op: torch.mul
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: sleeps
    op: torch.ops.casedb_test.sleep
    inputs:
      - tensor: {shape: [4, 64]}
      - value: 120.0
  - name: wrong
    op: torch.ops.casedb_runner_test.wrong_second_call
    inputs:
      - tensor: {shape: [4, 64]}
  - name: last_ok
    op: torch.sub
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
"""

# A CPU op whose result is wrong on the target only: the runner calls the reference first and
# the target second, so every second call of this op adds 1.
WRONG_OPS = '''\
import itertools

import torch

_calls = itertools.count()


@torch.library.custom_op("casedb_runner_test::wrong_second_call", mutates_args=())
def wrong_second_call(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + next(_calls) % 2


@wrong_second_call.register_fake
def _fake(x):
    return torch.empty_like(x)
'''

CPU = ("--backend", "eager", "--device", "cpu")


def write(tmp_path, **manifests) -> list[Path]:
    paths = []
    for name, text in manifests.items():
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        paths.append(p)
    return paths


@pytest.fixture
def db(cli, db_path, tmp_path):
    res = cli("import", *write(tmp_path, ra=RA, rb=RB))
    assert res.exit_code == 0, res.output
    return db_path




def run_json(cli, *args, db=None, code=0):
    res = cli("run", *args, "--json", db=db)
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


# ---------------------------------------------------------------------------------- the plan

def test_plan_dedupe_groups_occurrences_and_no_dedupe_keeps_them(db):
    from casedb.run.plan import build_plan
    from casedb.store.database import Store

    with Store(db) as store:
        plan = build_plan(store, ["ra", "rb"])
        flat = build_plan(store, ["ra", "rb"], dedupe=False)
        sigs = {r["name"]: r["signature"] for r in store.occurrences(["ra", "rb"])}
    from casedb.judge.numerics import Policy

    # each occurrence is judged with its own model's tolerance (the manifest default for fp16)
    rtol = lambda it, o: Policy().tolerance(vars(o), it.case, "float16").rtol  # noqa: E731
    assert [(it.id, [(o.model, o.name, rtol(it, o)) for o in it.occurrences]) for it in plan] == [
        (f"torch.add-4x64,4x64-fp16-{sigs['add'][:10]}", [("ra", "add", 1e-3), ("rb", "add_b", 0.5)]),
        (f"torch.mul-4x64,4x64-fp16-{sigs['mul'][:10]}", [("ra", "mul", 1e-3)]),
        (f"torch.relu-8x64-fp16-{sigs['relu'][:10]}", [("ra", "relu", 1e-3)]),
        (f"torch.abs-2x64-fp16-{sigs['skip_cpu'][:10]}", [("ra", "skip_cpu", 1e-3)]),
        (f"torch.neg-4x64-fp16-{sigs['neg'][:10]}", [("rb", "neg", 0.5)]),
    ]
    assert [it.id for it in flat] == ["ra-add", "ra-mul", "ra-relu", "ra-skip_cpu", "rb-add_b", "rb-neg"]
    assert [it.key for it in flat][:1] == [(sigs["add"], flat[0].occurrences[0].model_case_id)]


def test_shards_partition_the_cases_stably():
    from casedb.run.plan import in_shard

    sigs = [f"{i:08x}" + "0" * 56 for i in range(0, 4000, 7)]
    for n in (1, 2, 3, 5):
        owners = [[i for i in range(1, n + 1) if in_shard(s, (i, n))] for s in sigs]
        assert all(len(o) == 1 for o in owners)
    # a case's shard depends only on its signature, not on which other cases exist
    assert [in_shard(s, (2, 3)) for s in sigs[:50]] == [in_shard(s, (2, 3)) for s in sigs[:50][::-1]][::-1]


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_bad_shard_is_a_clear_error(cli, db, text):
    res = cli("run", "--shard", text, *CPU)
    assert res.exit_code == 2
    assert "--shard takes I/N with 1 <= I <= N" in res.output


# ------------------------------------------------------------------------------------- runs

def test_run_records_a_run_and_prints_the_summary(cli, db):
    res = cli("run", "--model", "ra", "--model", "rb", *CPU, "--no-progress")
    assert res.exit_code == 0, res.output
    assert "4 executed (6 occurrences, 1 duplicates skipped): 4 passed, 0 failed" in " ".join(res.stdout.split())
    for model in ("ra", "rb"):
        assert model in res.stdout
    run = rows(db, "SELECT * FROM runs")[0]
    assert {k: run[k] for k in ("id", "status", "device", "backend", "casedb_version")} == {
        "id": 1, "status": "finished", "device": "cpu", "backend": "eager", "casedb_version": "0.1.0"}
    assert run["started_at"] <= run["finished_at"] and run["torch_version"] and run["host"]
    sel = json.loads(run["selection"])
    assert sel["source"] == "casedb run" and sel["options"]["models"] == ["ra", "rb"]
    assert sel["planned"] == {"cases": 5, "occurrences": 6, "duplicates_skipped": 1, "available": 5}
    results = rows(db, """SELECT c.op, r.outcome, r.model_case_id, r.compare_mode, r.mismatch_count, r.max_abs_err,
                                 r.error_type, r.worker FROM results r JOIN cases c USING (signature) ORDER BY r.id""")
    assert results == [
        {"op": op, "outcome": "passed", "model_case_id": None, "compare_mode": "values", "mismatch_count": 0,
         "max_abs_err": 0.0, "error_type": None, "worker": "gw0"}
        for op in ("torch.add", "torch.mul", "torch.relu", "torch.neg")]
    judged = rows(db, """SELECT j.model, mc.name, j.outcome, j.reason, j.rtol, j.atol, j.result_id IS NOT NULL AS executed
                         FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id ORDER BY j.model, mc.position""")
    assert [(j["model"], j["name"], j["outcome"], j["rtol"], j["executed"]) for j in judged] == [
        ("ra", "add", "passed", 1e-3, 1), ("ra", "mul", "passed", 1e-3, 1), ("ra", "relu", "passed", 1e-3, 1),
        ("ra", "skip_cpu", "skipped", None, 0), ("rb", "add_b", "passed", 0.5, 1), ("rb", "neg", "passed", 0.5, 1)]
    assert judged[3]["reason"] == "abs fp16 is not checked on the cpu"


def test_run_json_summary(cli, db):
    s = run_json(cli, "--model", "ra", "--model", "rb", *CPU, "-j", "0")
    assert {k: s[k] for k in ("run_id", "status", "executed", "passed", "failed", "errors", "ref_errors", "crashed",
                              "timeouts", "skipped", "xfailed", "xpassed", "occurrences", "cases",
                              "duplicates_skipped", "unexpected")} == {
        "run_id": 1, "status": "finished", "executed": 4, "passed": 4, "failed": 0, "errors": 0, "ref_errors": 0,
        "crashed": 0, "timeouts": 0, "skipped": 1, "xfailed": 0, "xpassed": 0, "occurrences": 6, "cases": 5,
        "duplicates_skipped": 1, "unexpected": 0}
    assert s["models"]["rb"] == {"occurrences": 2, "passed": 2, "failed": 0, "errors": 0, "ref_errors": 0,
                                 "crashed": 0, "timeouts": 0, "skipped": 0, "xfailed": 0, "xpassed": 0,
                                 "not_exercised": 0}
    assert s["time"]["exec_ms_per_case"] is not None and s["time"]["compile_ms_per_case"] is None


def test_default_device_and_backend_env(cli, db, monkeypatch):
    import torch

    monkeypatch.setenv("TEST_COMPILE_BACKEND", "eager")
    s = run_json(cli, "--model", "ra", "-j", "0", "--op", "torch.relu")
    assert (s["device"], s["backend"], s["passed"]) == ("cuda" if torch.cuda.is_available() else "cpu", "eager", 1)


def test_selection_options(cli, db):
    assert run_json(cli, "--model", "ra", *CPU, "-j", "0", "--limit", "2")["executed"] == 2
    assert run_json(cli, "--model", "ra", *CPU, "-j", "0", "--op", "torch.relu")["executed"] == 1
    assert run_json(cli, "--model", "ra", *CPU, "-j", "0", "-k", "mul")["executed"] == 1
    # --op is repeatable: cases of any of the ops, in this process and through pytest workers
    assert run_json(cli, "--model", "ra", *CPU, "-j", "0", "--op", "torch.relu", "--op", "mul")["executed"] == 2
    assert run_json(cli, "--model", "ra", *CPU, "-j", "1", "--op", "torch.relu", "--op", "mul")["executed"] == 2
    listed = cli("cases", "--model", "ra", "--op", "torch.relu", "--op", "mul", "--format", "plain")
    assert sorted(r.split("\t")[2] for r in listed.stdout.splitlines()[1:]) == ["torch.mul", "torch.relu"]
    # relu's one [8, 64] input holds 512 elements; add's and mul's two [4, 64] inputs 512 together
    small = run_json(cli, "--model", "ra", *CPU, "-j", "0", "--max-numel", "511")
    assert small["executed"] == 0 and small["status"] == "finished"
    assert run_json(cli, "--model", "ra", *CPU, "-j", "0", "--max-numel", "512")["executed"] == 3
    one = run_json(cli, *CPU, "-j", "0", "--shard", "1/2")
    two = run_json(cli, *CPU, "-j", "0", "--shard", "2/2")
    assert one["cases"] + two["cases"] == 5
    shards = [{r["signature"] for r in rows(db, "SELECT signature FROM results WHERE run_id = ?", [rid])}
              for rid in (one["run_id"], two["run_id"])]
    assert not shards[0] & shards[1]


def test_reference_dtype_and_determinism_reach_the_core(cli, db):
    s = run_json(cli, "--model", "ra", *CPU, "-j", "0", "--op", "torch.mul", "--reference-dtype", "float64",
                 "--check-determinism")
    assert s["passed"] == 1
    m = json.loads(rows(db, "SELECT metrics FROM results")[0]["metrics"])
    assert (m["deterministic"], m["reference_dtype"]) == (True, "float64")
    assert m["max_abs_err_hi"] is not None and m["ref_max_abs_err_hi"] is not None
    opts = json.loads(rows(db, "SELECT selection FROM runs")[0]["selection"])["options"]
    assert (opts["reference_dtype"], opts["check_determinism"]) == ("float64", True)


def test_dedupe_judges_each_model_with_its_own_tolerance(cli, db, data_dir):
    perturb = ("--backend", "casedb_test_perturb", "--device", "cpu", "--import", str(data_dir / "custom_ops.py"),
               "-j", "0", "-k", "add")
    # the default judge: a loose manifest default does not hide a 1 % error from the ULP judge
    strict = run_json(cli, "--model", "ra", "--model", "rb", *perturb, code=1)
    assert rows(db, "SELECT model, outcome FROM judgements ORDER BY model") == [
        {"model": "ra", "outcome": "failed"}, {"model": "rb", "outcome": "failed"}]
    assert "ULPs of float16" in rows(db, "SELECT reason FROM judgements WHERE model = 'rb'")[0]["reason"]
    assert strict["judge"] == "both"
    perturb += ("--judge", "tolerance")
    s = run_json(cli, "--model", "ra", "--model", "rb", *perturb, code=1)
    assert (s["executed"], s["occurrences"], s["duplicates_skipped"], s["failed"]) == (1, 2, 1, 1)
    got = rows(db, "SELECT model, outcome, rtol, result_id FROM judgements WHERE run_id = ? ORDER BY model",
               [s["run_id"]])
    assert [(g["model"], g["outcome"], g["rtol"]) for g in got] == [("ra", "failed", 1e-3), ("rb", "passed", 0.5)]
    assert got[0]["result_id"] == got[1]["result_id"]
    res = rows(db, "SELECT outcome, max_abs_err, mismatch_count, metrics FROM results WHERE run_id = ?", [s["run_id"]])
    assert len(res) == 1 and res[0]["outcome"] == "failed" and res[0]["max_abs_err"] > 0.01
    assert json.loads(res[0]["metrics"])["judged_for"] == "ra::add"
    flat = run_json(cli, "--model", "ra", "--model", "rb", *perturb, "--no-dedupe", code=1)
    assert (flat["executed"], flat["occurrences"], flat["duplicates_skipped"]) == (2, 2, 0)
    per_occ = rows(db, """SELECT mc.name, r.outcome FROM results r JOIN model_cases mc ON mc.id = r.model_case_id
                          WHERE r.run_id = ? ORDER BY mc.model""", [flat["run_id"]])
    assert per_occ == [{"name": "add", "outcome": "failed"}, {"name": "add_b", "outcome": "passed"}]


def test_crash_timeout_and_wrong_values_do_not_stop_the_run(cli, db_path, tmp_path, data_dir):
    assert cli("import", *write(tmp_path, bad=BAD)).exit_code == 0
    wrong = tmp_path / "wrong_ops.py"
    wrong.write_text(WRONG_OPS)
    # (--judge tolerance: the wrong op counts its calls, and the ULP judge's upcast reference is one more)
    res = cli("run", *CPU, "--import", str(data_dir / "custom_ops.py"), "--import", str(wrong),
              "--timeout", "6", "--json", "-m", "", "--judge", "tolerance")
    assert res.exit_code == 1, res.output
    s = json.loads(res.stdout)
    assert {k: s[k] for k in ("executed", "passed", "failed", "crashed", "timeouts", "errors")} == {
        "executed": 6, "passed": 3, "failed": 1, "crashed": 1, "timeouts": 1, "errors": 0}
    got = {r["name"]: r for r in rows(db_path, """SELECT mc.name, r.* FROM results r
                                                JOIN judgements j ON j.result_id = r.id
                                                JOIN model_cases mc ON mc.id = j.model_case_id""")}
    assert [got[n]["outcome"] for n in ("first_ok", "aborts", "middle_ok", "sleeps", "wrong", "last_ok")] == [
        "passed", "crashed", "passed", "timeout", "failed", "passed"]
    crash = got["aborts"]
    assert crash["reason"] == "the worker process died (Fatal Python error: Aborted)"
    assert "crashed while running" in crash["traceback"] and "custom_ops.py" in crash["traceback"]
    assert got["sleeps"]["reason"] == "no result within --timeout 6 s (the worker was ended)"
    assert 5.4 <= got["sleeps"]["duration"] < 60
    w = got["wrong"]
    assert (w["mismatch_count"], w["compare_mode"]) == (256, "values")
    assert w["max_abs_err"] == pytest.approx(1.0, abs=2e-3)  # fp16 rounding of 2x + 1
    assert "256 of 256 elements" in w["reason"]
    # the replaced workers ran the rest: three worker processes in all
    assert len({r["worker"] for r in got.values()}) == 3


def test_known_crashes_and_timeouts_are_read_under_triage(cli, db_path, tmp_path, data_dir):
    # a lost case (its worker died) is judged in the recording process: triage applies there too,
    # and a triage entry's own timeout is the limit it is judged by
    assert cli("import", *write(tmp_path, bad=BAD)).exit_code == 0
    known = tmp_path / "known.yaml"
    known.write_text("version: 1\ncases:\n"
                     "  - {model: bad, name: aborts, status: known_failure, stage: crash, reason: aborts on purpose}\n"
                     "  - {model: bad, name: sleeps, status: known_failure, stage: timeout, timeout: 4}\n")
    res = cli("run", *CPU, "--import", str(data_dir / "custom_ops.py"), "--timeout", "60", "--triage", str(known),
              "--json", "-m", "", "-k", "aborts or sleeps or first_ok")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert {k: s[k] for k in ("executed", "passed", "xfailed", "crashed", "timeouts")} == {
        "executed": 3, "passed": 1, "xfailed": 2, "crashed": 0, "timeouts": 0}
    got = {r["name"]: r for r in rows(db_path, """SELECT mc.name, j.outcome, j.reason, j.triage, r.stage,
                                                  r.error_type, r.duration FROM judgements j
                                                  JOIN results r ON r.id = j.result_id
                                                  JOIN model_cases mc ON mc.id = j.model_case_id""")}
    assert {k: got["aborts"][k] for k in ("outcome", "triage", "stage", "error_type")} == {
        "outcome": "xfailed", "triage": "known", "stage": "crash", "error_type": "crashed"}
    assert got["aborts"]["reason"] == "aborts on purpose: the worker process died (Fatal Python error: Aborted)"
    assert {k: got["sleeps"][k] for k in ("outcome", "triage", "stage", "error_type")} == {
        "outcome": "xfailed", "triage": "known", "stage": "timeout", "error_type": "timeout"}
    assert got["sleeps"]["reason"].endswith("no result within its triage entry's timeout 4 s (the worker was ended)")
    assert got["sleeps"]["duration"] < 30


@pytest.mark.slow
def test_sigkill_then_resume_runs_every_case_exactly_once(cli, db_path, tmp_path, data_dir):
    cases = "\n".join(f"""  - name: nap{i}
    op: torch.ops.casedb_test.sleep
    inputs:
      - tensor: {{shape: [{i + 1}, 64]}}
      - value: 0.3""" for i in range(8))
    assert cli("import", *write(tmp_path, naps=f"model: naps\ndefault: {{dtype: fp16}}\ncases:\n{cases}\n")).exit_code == 0
    cmd = [sys.executable, "-m", "casedb", "--db", str(db_path), "run", *CPU, "--import",
           str(data_dir / "custom_ops.py"), "--no-progress", "-m", ""]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _count(db_path) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    done = _count(db_path)
    assert 3 <= done < 8
    assert rows(db_path, "SELECT status FROM runs") == [{"status": "running"}]
    # the selection and the target come from the run; its --import is given again (never taken from a DB)
    assert cli("run", "--resume", "1").exit_code == 2
    s = run_json(cli, "--resume", "1", "--import", data_dir / "custom_ops.py")
    assert (s["run_id"], s["status"], s["executed"], s["passed"]) == (1, "finished", 8, 8)
    per_case = rows(db_path, "SELECT signature, count(*) AS n FROM results WHERE run_id = 1 GROUP BY signature")
    assert len(per_case) == 8 and {r["n"] for r in per_case} == {1}
    assert rows(db_path, "SELECT count(*) AS n FROM judgements")[0]["n"] == 8
    sel = json.loads(rows(db_path, "SELECT selection FROM runs")[0]["selection"])
    assert len(sel["resumed"]) == 1 and sel["remaining"]["cases"] == 8 - done


def _count(db_path) -> int:
    try:
        return rows(db_path, "SELECT count(*) AS n FROM results")[0]["n"]
    except sqlite3.OperationalError:  # the run has not made its tables yet
        return 0


def test_fail_fast_stops_and_resume_finishes(cli, db, data_dir):
    perturb = ("--backend", "casedb_test_perturb", "--device", "cpu", "--import", str(data_dir / "custom_ops.py"),
               "-j", "0")
    first = run_json(cli, "--model", "ra", *perturb, "--fail-fast", code=1)
    assert (first["status"], first["executed"], first["failed"]) == ("interrupted", 1, 1)
    # a selection given with --resume would be silently ignored: refused, naming it
    other = cli("run", "--resume", str(first["run_id"]), "--model", "rb", "--backend", "eager", "-j", "0",
                "--import", data_dir / "custom_ops.py")
    assert other.exit_code == 2
    assert f"--resume {first['run_id']} runs what run {first['run_id']} selected" in other.stderr
    assert "--model rb, --backend eager would be ignored" in other.stderr
    rest = run_json(cli, "--resume", str(first["run_id"]), "-j", "0", "--import", data_dir / "custom_ops.py", code=1)
    assert (rest["status"], rest["executed"], rest["failed"], rest["skipped"]) == ("finished", 3, 3, 1)


def test_import_by_name_finds_a_file_in_the_working_directory(cli, db, data_dir, tmp_path, monkeypatch):
    # `casedb` is a console script: its sys.path lacks the working directory, as `python -m` has it
    shutil.copy(data_dir / "custom_ops.py", tmp_path / "my_wrong_backend.py")
    monkeypatch.chdir(tmp_path)
    out = run_json(cli, "--model", "ra", "--backend", "casedb_test_perturb", "--device", "cpu",
                   "--import", "my_wrong_backend", "-j", "0", code=1)
    assert out["failed"] > 0


def test_unusable_target_and_bad_options_exit_2(cli, db):
    bad_backend = cli("run", "--model", "ra", "--backend", "nosuch_backend", "--device", "cpu", "-j", "0")
    assert bad_backend.exit_code == 2
    assert "unknown compile backend 'nosuch_backend'" in bad_backend.output
    bad_import = cli("run", "--model", "ra", *CPU, "--import", "no_such_module_here")
    assert bad_import.exit_code == 2 and "no module named 'no_such_module_here'" in bad_import.output
    assert cli("run", "--resume", "99", *CPU).exit_code == 2
    unknown = cli("run", "--model", "nosuchmodel", *CPU)
    assert unknown.exit_code == 2 and "known models: ra, rb" in unknown.output


# ------------------------------------------------------------------------------------ merge

def test_merge_folds_shards_once_and_can_combine_them(cli, db, tmp_path):
    base = tmp_path / "base.db"
    shutil.copy(db, base)
    shards = []
    for i in (1, 2):
        shard = tmp_path / f"shard{i}.db"
        shutil.copy(base, shard)
        run_json(cli, "--model", "ra", "--model", "rb", *CPU, "-j", "0", "--shard", f"{i}/2", db=shard)
        shards.append(shard)
    target = tmp_path / "all.db"
    shutil.copy(base, target)
    res = cli("merge", str(shards[0]), str(shards[1]), "--into", str(target), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (report["runs"], report["results"], report["judgements"]) == (2, 4, 6)
    assert len(rows(target, "SELECT DISTINCT signature FROM results")) == 4
    again = json.loads(cli("merge", str(shards[0]), str(shards[1]), "--into", str(target), "--json").stdout)
    assert (again["runs"], again["results"], [p["runs_already_merged"] for p in again["sources"]]) == (0, 0, [1, 1])
    # into a DB that lacks the cases: they come along
    empty = tmp_path / "empty.db"
    combined = json.loads(cli("merge", str(shards[0]), str(shards[1]), "--into", str(empty), "--combine",
                              "--json").stdout)
    assert combined["run_id"] == 1 and combined["sources"][0]["new_cases"] > 0
    s = combined["summary"]
    assert (s["status"], s["executed"], s["passed"], s["skipped"], s["occurrences"], s["duplicates_skipped"]) == (
        "finished", 4, 4, 1, 6, 1)
    assert rows(empty, "SELECT count(*) AS n FROM runs")[0]["n"] == 1
    again = json.loads(cli("merge", str(shards[1]), "--into", str(empty), "--combine", "--json").stdout)
    assert again["runs"] == 0


# ---------------------------------------------------------------------------- fresh clone

def test_fresh_clone_runs_a_shipped_model_from_the_default_db(tmp_path, monkeypatch):
    """No import: the shipped manifests become the default DB (data/casedb.sqlite) on first use."""
    from typer.testing import CliRunner

    from casedb.cli import app
    from casedb.store.database import SHIPPED_MANIFESTS

    if not (SHIPPED_MANIFESTS / "granite4h.yaml").exists():
        pytest.fail("manifests/granite4h.yaml is not shipped")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CASEDB_DB", raising=False)
    res = CliRunner().invoke(app, ["run", "--model", "granite4h", *CPU, "-j", "0", "--limit", "3", "--json"])
    assert res.exit_code in (0, 1), res.output
    s = json.loads(res.stdout)
    assert s["cases"] == 3 and s["executed"] + s["skipped"] == 3
    assert (tmp_path / "data" / "casedb.sqlite").exists()


def test_a_run_stored_with_one_op_resumes_with_that_op():
    from casedb.run.runspec import RunSpec

    assert RunSpec.from_selection({"op": "torch.relu", "models": ["ra"]}).op == ["torch.relu"]
    assert RunSpec.from_selection({"op": None}).op == []
