"""The RFC runner's JUnit view of a run (issue 26, item 5): per test, the ``capability.*`` and
``tag`` properties their CI reads, written by casedb's pytest front end (``--junitxml``)."""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import torch._dynamo
from typer.testing import CliRunner

import casedb.run.execute  # noqa: F401
import casedb.run.runner  # noqa: F401
import casedb.store.database  # noqa: F401
import importers.model_ops_v2  # noqa: F401
import importers.yaml_manifest  # noqa: F401 (its PyYAML classes must not be re-imported by a pytester session)
from casedb.run import junit

# Imported before a pytester session snapshots sys.modules (see tests/frontends/test_plugin.py).
torch._dynamo.list_backends(exclude_tags=())
pytest_plugins = ("pytester",)

TOY = Path(__file__).parents[1] / "data" / "v2" / "toy-v2.yaml"


@pytest.fixture
def ptr(pytester, tmp_path, monkeypatch):
    from casedb.cli import app

    db = tmp_path / "cases.db"
    res = CliRunner().invoke(app, ["--db", str(db), "import", str(TOY)])
    assert res.exit_code == 0, res.output
    monkeypatch.setenv("CASEDB_DB", str(db))
    monkeypatch.delenv("TEST_COMPILE_BACKEND", raising=False)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb="from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    return pytester


@pytest.mark.slow
def test_junit_report_carries_their_capability_properties(ptr):
    res = ptr.runpytest("test_from_casedb.py", "--model", "toy-v2", "--device", "cpu", "--compile-backend", "eager",
                        "-m", "", "-k", "torch.mul.1 or torch.getitem.1", "--junitxml", "report.xml")
    res.assert_outcomes(passed=2)
    cases = ET.parse(ptr.path / "report.xml").getroot().iter("testcase")
    props = {}
    for tc in cases:
        got = [(p.get("name"), p.get("value")) for p in tc.iter("property") if p.get("name") != "casedb"]
        props[next(v for k, v in got if k == "capability.tag")] = got
    assert props["torch.mul.1"] == [
        ("tag", "model__toy-v2"), ("capability.test_type", "model_ops"), ("capability.subject", "toy-v2"),
        ("capability.name", "torch.mul"), ("capability.sig.input_shapes", '["[4,3]"]'),
        ("capability.sig.input_dtypes", '["torch.float32"]'), ("capability.tag", "torch.mul.1"),
        ("capability.prop.input_strides", '["[1,4]"]'), ("capability.backend", "cpu")]
    assert ("capability.sig.input_shapes", '["[2,4,6]"]') in props["torch.getitem.1"]


@pytest.mark.parametrize("op, inputs, shapes", [
    ("torch.arange", [{"value": 24}], ["[24]"]),
    ("torch.zeros", [{"value": [2, 3]}], ["[2,3]"]),
    ("torch.add", [{"tensor": {"shape": [], "dtype": "float32"}}, {"value": 1}], ["[1]"]),
    ("torch.cat", [{"tensor_list": [{"shape": [2, 2], "dtype": "bfloat16"}, {"shape": [1, 2], "dtype": "bfloat16"}]}],
     ["[2,2]", "[1,2]"]),
])
def test_signature_follows_their_rules(op, inputs, shapes):
    assert junit.signature(op, inputs)["input_shapes"] == shapes


@pytest.mark.parametrize("op, name", [
    ("torch.ops.aten.mm.default", "torch.mm"), ("torch.Tensor.embedding_bag", "torch.nn.functional.embedding"),
    ("torch.index_copy", "torch.index_copy_"), ("operator.getitem", "operator.getitem"),
])
def test_op_names_normalize_as_theirs(op, name):
    assert junit.capability_name(op) == name
