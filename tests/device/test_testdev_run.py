"""`casedb run` on the PrivateUse1 test device: eager results judged right, nothing of the judgement
on the target, a wrong op caught and named, the device index honoured, a run's software recorded,
compile backends the device cannot use refused once at the start (issue 45)."""

import pytest

from device_helpers import TESTDEV, as_json, casedb, run_on_testdev
from tests.conftest import rows

pytestmark = pytest.mark.slow


def _outcomes(db) -> dict:
    return {r["name"]: r["outcome"] for r in rows(db, "SELECT mc.name, j.outcome FROM judgements j "
                                                      "JOIN model_cases mc ON mc.id = j.model_case_id")}


def test_eager_run_on_the_test_device_passes_and_records_its_software(small_db):
    out = as_json(run_on_testdev(small_db, env={"TESTDEV_SPEED": "fast"}))
    assert (out["passed"], out["xfailed"], out["unexpected"]) == (6, 1, 0)
    # the CPU's declared histc limitation is the reference's, whatever the target: no triage entry
    assert _outcomes(small_db)["histc_i32"] == "xfailed"
    run = rows(small_db, "SELECT software, torch_version FROM runs")[0]
    import json

    sw = json.loads(run["software"])
    assert sw["imports"][0]["file"] == str(TESTDEV.resolve()) and sw["imports"][0]["version"] == "0.1"
    assert len(sw["imports"][0]["sha256"]) == 64 and sw["torch"] == run["torch_version"]
    # (the environment of the process: another test's TORCH* settings may be there too)
    assert sw["environment"]["TESTDEV_SPEED"] == "fast"
    assert all(k.startswith(("TORCH", "PYTORCH_", "TESTDEV_")) for k in sw["environment"])


def test_ties_are_ordered_on_the_cpu_not_on_the_target(small_db):
    # a device without eq: its sort and topk are right, only casedb's tie order used eq
    out = as_json(run_on_testdev(small_db, "--op", "sort", "--op", "topk", env={"TESTDEV_MISSING": "aten::eq"}))
    assert (out["passed"], out["errors"]) == (2, 0)


def test_a_device_wrong_in_one_op_is_caught_and_named(small_db):
    out = as_json(run_on_testdev(small_db, env={"TESTDEV_WRONG": "aten::mul.Tensor"}))
    assert out["failed"] == 1
    assert {n: o for n, o in _outcomes(small_db).items() if o == "failed"} == {"mul_f32": "failed"}
    report = as_json(casedb(small_db, "report", "--json"))
    assert [f["op"] for f in report["failures"]] == ["torch.Tensor.mul"]


def test_outputs_on_another_index_do_not_exercise_the_target(small_db):
    ok = as_json(run_on_testdev(small_db, "--op", "torch.add", device="testdev:1"))
    assert ok["passed"] == 1
    off = as_json(run_on_testdev(small_db, "--op", "torch.add", device="testdev:1", env={"TESTDEV_IGNORE_INDEX": "1"}))
    assert off["not_exercised"] == 1
    reason = rows(small_db, "SELECT reason FROM results WHERE outcome = 'not_exercised'")[0]["reason"]
    assert "testdev:0" in reason and "testdev:1" in reason


def test_inductor_on_the_device_is_refused_once_at_the_start(small_db):
    done = casedb(small_db, "run", "--import", TESTDEV, "--device", "testdev", "--backend", "inductor")
    assert done.returncode == 2
    assert done.stderr.count("inductor has no backend registered for device 'testdev'") == 1
    assert "--backend eager" in done.stderr
    assert rows(small_db, "SELECT count(*) AS n FROM results")[0]["n"] == 0
