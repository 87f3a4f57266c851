"""A v2 model-ops config on the PrivateUse1 test device: the modes as the client's runner does them
(xfail not strict, xfail_strict strict, skip not run unless --run-skipped), and a device_layout kept
when a stride preset applies too (issue 45)."""

import json

import pytest

from device_helpers import DEVICE_DIR, as_json, casedb, run_on_testdev
from tests.conftest import rows

pytestmark = pytest.mark.slow


@pytest.fixture
def v2_db(tmp_path):
    db = tmp_path / "v2.db"
    done = casedb(db, "import", DEVICE_DIR / "modes-v2.yaml")
    assert done.returncode == 0, done.stderr
    return db


def _by_op(db, run_id) -> dict:
    return {r["op"]: r for r in rows(db, "SELECT c.op, r.outcome, r.reason, r.metrics FROM results r "
                                         "JOIN cases c USING (signature) WHERE r.run_id = ?", [run_id])}


def test_modes_as_the_clients_runner_and_skipped_cases_on_purpose(v2_db):
    out = as_json(run_on_testdev(v2_db))
    got = {op: r["outcome"] for op, r in _by_op(v2_db, out["run_id"]).items()}
    assert got == {"torch.add": "passed", "torch.sin": "passed", "torch.cos": "xpassed"}
    assert out["skipped"] == 1  # torch.tanh: mode skip
    again = as_json(run_on_testdev(v2_db, "--run-skipped", "--op", "tanh"))
    assert (again["passed"], again["skipped"]) == (1, 0)


def test_device_layout_kept_when_a_stride_preset_applies(v2_db):
    out = as_json(run_on_testdev(v2_db, "--op", "torch.add"))
    notes = json.loads(_by_op(v2_db, out["run_id"])["torch.add"]["metrics"])["notes"]
    assert notes["testdev_layout"]["layouts"] == [{"device_size": [1, 4, 64], "stride_map": [64, -1, 1],
                                                    "device_dtype": "float16"}]
    assert notes["testdev_layout"]["strides"][0] == [1, 4]  # the preset's strides, with the layout
