"""The RFC implementation's files in, and what casedb exports run by its runner's rules (issue 47):
v1 bookkeeping records skipped as v2's are (one rule), an op item's own ``kwargs:`` accepted and, as
their runner does, not used, and the spyre-v2 export read by casedb's own loader of their rules
(tests/spyre_loader.py): every case collected, every op name in their table, each passing on the CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from casedb.read import spyre_calls
from tests import spyre_loader
from tests.conftest import rows, sha256_of

CLIENT = Path(__file__).parents[1] / "data" / "client"
MANIFESTS = Path(__file__).parents[2] / "manifests"


# ----------------------------------------------------------------------------------- item 1

def test_v1_bookkeeping_records_are_skipped_and_listed(cli, db_path):
    r = cli.json("import", CLIENT / "v1-bookkeeping.yaml")
    (f,) = r["files"]
    assert f["occurrences"] == 2 and f["skipped"] == 3
    listed = {s["op"]: s for s in f["skipped_reasons"]}
    assert set(listed) == {"torch.nn.attention._backend_from_string", "torch.nn.attention._sdpa_kernel",
                           "torch._C._functorch._vmap_increment_nesting"}
    assert listed["torch._C._functorch._vmap_increment_nesting"]["where"].endswith("v1-bookkeeping.yaml:32")
    assert all("a call casedb cannot run as a case" in s["reason"] for s in listed.values())
    names = {r["name"] for r in rows(db_path, "SELECT name FROM model_cases")}
    assert names == {"torch.nn.functional.silu.1", "torch.transpose.1"}


def test_an_unsafe_op_refuses_a_v2_file_as_it_does_a_v1_file(cli, db_path, tmp_path):
    assert cli("import", CLIENT / "item-kwargs.yaml").exit_code == 0
    before = sha256_of(db_path)
    text = (CLIENT / "item-kwargs.yaml").read_text().replace("- name: torch.sum", "- name: torch.ops.aten.from_file")
    (tmp_path / "evil.yaml").write_text(text.replace("model__item-kwargs", "model__evil"))
    r = cli("import", tmp_path / "evil.yaml")
    assert r.exit_code == 2 and "evil.yaml:34" in r.stderr and "is not a tensor operation casedb runs" in r.stderr
    assert sha256_of(db_path) == before


# ----------------------------------------------------------------------------------- item 2

def test_an_item_level_kwargs_is_accepted_and_not_used_as_their_runner_does(cli, db_path):
    assert cli("import", CLIENT / "item-kwargs.yaml").exit_code == 0
    got = {r["name"]: json.loads(r["attrs"]) for r in rows(
        db_path, "SELECT mc.name, c.attrs FROM model_cases mc JOIN cases c ON c.signature = mc.signature")}
    assert got == {"torch.softmax.1": {"dim": -1}, "torch.sum.1": {}}  # sample_inputs_func.kwargs only


# ----------------------------------------------------------------------------------- items 3, 4

def export(cli, model: str, out: Path) -> dict:
    r = cli("export", "--model", model, "--format", "spyre-v2", "-o", out)
    assert r.exit_code == 0, r.output
    return yaml.safe_load(out.read_text())["test_suite_config"]


def items(doc: dict) -> list:
    return [i for t in doc["files"][0]["tests"] for i in t["edits"]["ops"]["include"]]


def their_root(tmp_path: Path, monkeypatch) -> Path:
    """The folder a user copies an export into: ``$TORCH_DEVICE_ROOT/tests/configs/model_ops_tests``."""
    folder = tmp_path / "root" / "tests" / "configs" / "model_ops_tests"
    folder.mkdir(parents=True)
    monkeypatch.setenv("TORCH_DEVICE_ROOT", str(tmp_path / "root"))
    monkeypatch.chdir(tmp_path)  # their plain paths are the working folder's: not where the export is
    return folder


def test_export_is_what_their_runner_collects_and_runs(cli, db_path, tmp_path, monkeypatch):
    assert cli("import", CLIENT / "adapt.yaml").exit_code == 0
    folder = their_root(tmp_path, monkeypatch)
    doc = export(cli, "adapt", folder / "adapt.yaml")
    by_name = {i["tags"][-1]: i for i in items(doc)}
    assert set(by_name) == {"torch.transpose.1", "torch.reshape.1", "torch.to.1", "torch.functional.einsum.1",
                            "torch.conv1d.1", "torch.nn.functional.layer_norm.1",
                            "torch.nn.functional.scaled_dot_product_attention.1", "torch.where.1", "torch.add.1",
                            "torch.histc.1"}
    assert by_name["torch.reshape.1"]["sample_inputs_func"]["args"][1] == {"value": [6, 4]}
    assert by_name["torch.to.1"]["sample_inputs_func"] == {
        "args": by_name["torch.to.1"]["sample_inputs_func"]["args"][:1], "kwargs": {"dtype": "torch.bfloat16"}}
    ln = by_name["torch.nn.functional.layer_norm.1"]["sample_inputs_func"]
    assert [list(a) for a in ln["args"]] == [["tensor"], ["value"], ["tensor"], ["tensor"]] and ln["kwargs"] == {"eps": 1e-05}
    assert "tensor" in by_name["torch.nn.functional.scaled_dot_product_attention.1"]["sample_inputs_func"]["args"][3]
    zero_d = by_name["torch.where.1"]["sample_inputs_func"]["args"][1]["tensor"]
    assert zero_d["init"] == "file" and zero_d["init_args"]["path"].startswith(
        "${TORCH_DEVICE_ROOT}/tests/configs/model_ops_tests/adapt.files/")
    assert {"name": "bfloat16", "precision": {"atol": 0.01, "rtol": 0.016}} in doc["global"]["supported_dtypes"]
    assert "shape: [2, 3, 4]" in (folder / "adapt.yaml").read_text()  # flow lists, as their configs write
    # a call that raises by design (expects_error) is their strict xfail: their runner runs it, reports
    # the error as xfailed and a pass (the error gone) as a failure; the error itself in casedb's record
    (strict,) = [t for t in doc["files"][0]["tests"] if t["mode"] == "xfail_strict"]
    assert [i["name"] for i in strict["edits"]["ops"]["include"]] == ["torch.histc"]
    assert strict["edits"]["ops"]["include"][0]["casedb"] == {"expects_error": {
        "cpu": {"match": "histogram_cpu", "type": "RuntimeError"}, "ref": {"match": "histogram_cpu", "type": "RuntimeError"}}}
    collected = spyre_loader.collect(folder / "adapt.yaml")
    assert collected.dropped == [] and len(collected.tests) == 10
    assert [t.op for t in collected.tests if t.mode == "xfail_strict"] == ["torch.histc"]
    seed = doc["global"]["input_config"]["seed"]
    for test in collected.tests:
        if test.mode == "xfail_strict":
            with pytest.raises(RuntimeError, match="histogram_cpu"):  # their reference raises: xfailed
                spyre_loader.run_on_cpu(test, seed)
        else:
            spyre_loader.run_on_cpu(test, seed)


def test_an_op_their_table_lacks_is_left_out_and_named(cli, db_path, tmp_path, monkeypatch):
    assert cli("import", CLIENT / "adapt.yaml").exit_code == 0
    folder = their_root(tmp_path, monkeypatch)
    r = cli("export", "--model", "adapt", "--format", "spyre-v2", "-o", folder / "adapt.yaml")
    assert "adapt::roll_a: left out: torch.Tensor.roll is not in their op table" in " ".join(r.stderr.split())
    assert "torch.Tensor.roll" not in (folder / "adapt.yaml").read_text()


def test_the_op_table_names_its_source():
    src = spyre_calls.source()
    assert src["repository"] == "torch-spyre/torch-spyre" and src["path"] == "tests/models/op_registry.py"
    assert len(src["commit"]) == 40 and len(spyre_calls.table()) == 142
    assert {"torch.transpose", "torch.reshape", "torch.functional.einsum", "torch.conv1d"} <= spyre_calls.table()


@pytest.mark.slow
@pytest.mark.parametrize("manifest, model", [("granite-speech.yaml", "granite-speech"),
                                             ("llama/llama3.1-8b.yaml", "llama3.1-8b")])
def test_a_shipped_model_exports_to_names_their_runner_collects(cli, db_path, tmp_path, monkeypatch, manifest, model):
    assert cli("import", MANIFESTS / manifest).exit_code == 0
    folder = their_root(tmp_path, monkeypatch)
    doc = export(cli, model, folder / f"{model}.yaml")
    written = {i["name"] for i in items(doc)}
    assert written <= spyre_calls.table()
    collected = spyre_loader.collect(folder / f"{model}.yaml")
    assert collected.dropped == [] and len(collected.tests) == len(items(doc))
    assert len(collected.tests) == rows(db_path, "SELECT count(*) AS n FROM model_cases WHERE model = ?", (model,))[0]["n"]
    shutil.rmtree(folder)
