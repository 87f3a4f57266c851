"""`casedb coverage` on the PrivateUse1 test device: the cases a missing kernel blocks predicted
before anything runs, and a real run agreeing (issue 45)."""

import pytest

from device_helpers import TESTDEV, as_json, casedb, run_on_testdev

pytestmark = pytest.mark.slow
NO_NONZERO = {"TESTDEV_MISSING": "aten::nonzero"}


def _coverage(db, *more, env=None):
    return as_json(casedb(db, "coverage", "--device", "testdev", "--import", TESTDEV, "--json", *more, env=env))


def test_coverage_predicts_the_no_kernel_cases_and_the_run_agrees(small_db):
    full = _coverage(small_db)
    assert full["dispatch_key"] == "PrivateUse1" and full["missing"] == []
    assert full["totals"]["enabled_cases"] == 6 and full["totals"]["untraced"] == 1  # histc: the CPU raises

    cov = _coverage(small_db, env=NO_NONZERO)
    blocked = {c["signature"]: c["missing"] for c in cov["cases"] if c["enabled"] is False}
    assert list(blocked.values()) == [["aten::nonzero"]]
    assert cov["missing"][0] | {"models": None} == {"kernel": "aten::nonzero", "cases": 1, "unblocks": 1,
                                                    "models": None, "ops": ["torch.Tensor.nonzero"]}
    row = cov["models"][0]
    assert (row["enabled_cases"], row["traced"], row["enabled_ops"], row["ops"]) == (5, 6, 5, 6)
    assert row["enabled_aten_ops_pct"] == round(100 * 5 / 6, 1)

    run = as_json(run_on_testdev(small_db, env=NO_NONZERO))
    assert run["errors"] == 1 and run["passed"] == 5
    checked = _coverage(small_db, "--against", run["run_id"], env=NO_NONZERO)["against"]
    assert (checked["compared"], checked["agree"], checked["disagree"]) == (6, 6, [])


def test_coverage_of_an_unknown_device_is_an_input_error(small_db):
    done = casedb(small_db, "coverage", "--device", "nosuchdev")
    assert done.returncode == 2 and "--device nosuchdev" in done.stderr
