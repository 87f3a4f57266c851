"""`casedb mutants --backend tensor` on the PrivateUse1 test device, which dynamo cannot trace: the
mutants wrap the op call, the control raises no false alarm and a bug is caught (issue 45)."""

import pytest

from device_helpers import TESTDEV, as_json, casedb

pytestmark = pytest.mark.slow


def test_mutants_around_the_op_call_on_an_eager_only_device(small_db):
    report = as_json(casedb(small_db, "mutants", "--model", "devsmall", "--import", TESTDEV, "--device", "testdev",
                            "--backend", "tensor", "--mutant", "zeros", "--mutant", "broadcast", "--json",
                            "--no-progress"))
    assert report["control"]["false_alarms"] == 0 and report["control"]["passed"] == 6
    by_name = {m["name"]: m for m in report["mutants"]}
    assert by_name["zeros"]["changed"] == by_name["zeros"]["caught"] == 6
    assert by_name["broadcast"]["changed"] == 0  # it reads the traced graph: none without dynamo
