"""`casedb repro` and triage with the PrivateUse1 test device: the script imports the device module
and reproduces the wrong op; a failure triaged from a run is known in the next (issue 45)."""

import subprocess
import sys

import pytest

from device_helpers import TESTDEV, as_json, casedb, run_on_testdev
from tests.conftest import rows

pytestmark = pytest.mark.slow
WRONG = {"TESTDEV_WRONG": "aten::mul.Tensor"}


def test_repro_script_runs_on_the_test_device(small_db, tmp_path):
    sig = rows(small_db, "SELECT signature FROM cases WHERE op = 'torch.Tensor.mul'")[0]["signature"]
    made = casedb(small_db, "repro", sig[:16], "--import", TESTDEV, "--device", "testdev", "--backend", "eager")
    assert made.returncode == 0, made.stderr
    script = tmp_path / "repro_mul.py"
    script.write_text(made.stdout)
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TESTDEV_")}
    ok = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0 and "OK: torch.Tensor.mul on testdev" in ok.stdout
    bad = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env={**env, **WRONG},
                         timeout=300)
    assert bad.returncode != 0 and "torch.Tensor.mul on testdev (eager) vs CPU eager" in bad.stderr


def test_a_triaged_device_failure_is_known_in_the_next_run(small_db, tmp_path):
    first = as_json(run_on_testdev(small_db, "--op", "mul", env=WRONG))
    assert first["failed"] == 1
    entries = tmp_path / "testdev.yaml"
    done = casedb(small_db, "triage", "update", "--from-run", first["run_id"], "-o", entries)
    assert done.returncode == 0, done.stderr
    second = as_json(run_on_testdev(small_db, "--op", "mul", "--triage", entries, env=WRONG))
    assert second["unexpected"] == 0
