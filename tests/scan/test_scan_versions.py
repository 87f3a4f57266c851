"""Issue 27: cases only an older transformers records. ``casedb scan --device cpu`` (the
depth-shrunk model on real CPU tensors), version manifests (``<model>@transformers-X.Y.yaml``:
the scan's cases no shipped manifest holds) and ``--compare FILE --shipped`` (their ops against
every shipped manifest of a model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from casedb.ingest.save import import_paths
from casedb.scan import cpu_device, scanner as scan, versions
from casedb.scan.recipes import ScanPath
from casedb.store.database import SHIPPED_MANIFESTS, Store

DATA = Path(__file__).parents[1] / "data" / "scan"
OPS = DATA / "versions-ops.txt"


# ------------------------------------------------------------------------------- cpu device

def test_shrink_keeps_the_first_layer_of_each_kind_in_every_config():
    doc = {"num_hidden_layers": 5, "layer_types": ["mamba", "mamba", "attention", "mamba", "attention"],
           "hidden_size": 64, "text_config": {"num_hidden_layers": 40, "hidden_size": 2048},
           "encoder_config": {"num_layers": 16}, "projector_config": {"num_hidden_layers": 2}}
    small, notes = cpu_device.shrink(doc)
    assert small == {"num_hidden_layers": 2, "layer_types": ["mamba", "attention"], "hidden_size": 64,
                     "text_config": {"num_hidden_layers": 2, "hidden_size": 2048},
                     "encoder_config": {"num_layers": 2}, "projector_config": {"num_hidden_layers": 2}}
    assert notes == ["text_config.num_hidden_layers 40 -> 2", "encoder_config.num_layers 16 -> 2",
                     "num_hidden_layers 5 -> 2 (layer_types cut alike)"]
    assert doc["num_hidden_layers"] == 5  # the config read is left as it was


def test_paths_an_older_transformers_cannot_take_are_left_out():
    class NoExperts:  # transformers 5.2's classes have no _can_set_experts_implementation
        pass

    paths = [ScanPath("dynamic-grouped_mm-b1", experts="grouped_mm", axes={"experts": "grouped_mm", "batch": 1}),
             ScanPath("dynamic-grouped_mm-b2", experts="grouped_mm", axes={"experts": "grouped_mm", "batch": 2}),
             ScanPath("dynamic-eager-b1", experts="eager", axes={"experts": "eager", "batch": 1})]
    kept, left_out = cpu_device.supported_paths(paths, NoExperts)
    assert [(p.name, p.experts, p.axes) for p in kept] == [("dynamic-b1", None, {"batch": 1}),
                                                           ("dynamic-b2", None, {"batch": 2})]
    assert left_out == ["dynamic-eager-b1"]


def test_real_inputs_replace_meta_tensors_with_seeded_values():
    inputs = {"input_ids": torch.tensor([[1, 2]]), "pixel_values": torch.empty(1, 3, 4, 4, device="meta"),
              "use_cache": True}
    first, second = cpu_device.real_inputs(inputs), cpu_device.real_inputs(inputs)
    assert first["input_ids"] is inputs["input_ids"] and first["use_cache"] is True
    assert first["pixel_values"].device.type == "cpu" and first["pixel_values"].shape == (1, 3, 4, 4)
    assert torch.equal(first["pixel_values"], second["pixel_values"]) and first["pixel_values"].std() > 0


def _recipe(tmp_path: Path) -> Path:
    """tiny granite4h with 4 layers (two of each kind): the CPU scan keeps one of each."""
    config = json.loads((DATA / "tiny-granite4h.json").read_text())
    config.update(num_hidden_layers=4, layer_types=["mamba", "mamba", "attention", "attention"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"model": "m", "config": "config.json", "arch": "GraniteMoeHybridForCausalLM",
                                    "defaults": {"dtype": "fp32", "seed": 0}, "dtype": "fp32",
                                    "inputs": {"batch": 1, "seq_len": 12}}))
    return path


@pytest.fixture(scope="module")
def cpu_scan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpu")
    result = scan.scan(_recipe(tmp), device="cpu")
    return result, result.write(tmp / "m.jsonl")


def test_cpu_scan_runs_the_shrunk_model_and_says_so(cpu_scan):
    result, _ = cpu_scan
    header = result.header
    assert (header["device"], header["shrunk"], header["unsupported_paths"]) == \
        ("cpu", ["num_hidden_layers 4 -> 2 (layer_types cut alike)"], [])
    assert header["config"].endswith("config.json") and "casedb-scan-cpu-" not in header["config"]
    assert {r["model"] for r in result.cases} == {"m"}
    ops = {r["case"]["op"] for r in result.cases}
    assert {"torch.nn.functional.embedding", "torch.nn.functional.linear"} <= ops


def test_cpu_scan_refuses_a_model_over_its_memory_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_device, "MAX_CPU_BYTES", 1 << 10)
    with pytest.raises(scan.ScanError, match=r"the depth-shrunk model takes .* GiB on the CPU, more than 0 GiB"):
        scan.scan(_recipe(tmp_path), device="cpu")


def test_unknown_device_is_refused(tmp_path):
    with pytest.raises(scan.ScanError, match="unknown device 'cuda'; choose one of meta, cpu"):
        scan.scan(_recipe(tmp_path), device="cuda")


# -------------------------------------------------------------------------- version manifests

def _manifest_cases(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["cases"]


def test_version_manifest_holds_only_the_cases_no_shipped_manifest_has(cpu_scan, tmp_path):
    _, scan_file = cpu_scan
    everything = versions.write_version_manifest(scan_file, tmp_path / "all.yaml", root=tmp_path / "none")
    root = tmp_path / "manifests"
    (root / "fam").mkdir(parents=True)
    doc = yaml.safe_load((tmp_path / "all.yaml").read_text())
    doc["cases"] = doc["cases"][:3]  # the model's manifest: three of the scan's cases
    (root / "fam" / "m.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    out = versions.write_version_manifest(scan_file, root=root)
    minor = ".".join(json.loads(scan_file.read_text().splitlines()[0])["transformers"].split(".")[:2])
    version_file = root / "fam" / f"m@transformers-{minor}.yaml"
    assert out == {"model": "m", "file": str(version_file), "scanned": everything["scanned"],
                   "new": everything["scanned"] - 3, "already_shipped": 3, "index_repeats": 0,
                   "transformers": out["transformers"],
                   "base": [str(root / "fam" / "m.yaml")]}
    assert yaml.safe_load(version_file.read_text())["model"] == "m"
    assert versions.shipped_files("m", root) == [root / "fam" / "m.yaml", version_file]
    with Store(tmp_path / "db.sqlite") as store:
        report = import_paths(store, versions.shipped_files("m", root))
        assert [f.new_cases for f in report.files] == [3, everything["scanned"] - 3]
        assert len(store.occurrences(["m"], markexpr="")) == everything["scanned"]


def test_index_repeats_keep_the_first_and_last_index_of_one_call():
    def occ(sig, index, site="File: m.py:7", op="torch.getitem", shape=(8, 4)):
        return {"signature": sig, "op": op, "inputs": [{"tensor": {"shape": list(shape)}}, {"value": index}],
                "attrs": {}, "description": f"{site}\nCode: w[i]"}

    occurrences = [occ("a", 0), occ("b", 5), occ("c", 2), occ("d", 7), occ("e", 3, site="File: m.py:9"),
                   occ("f", 4, site="File: m.py:9"), occ("g", 1, shape=(2, 4)), occ("h", 3, op="torch.Tensor.select")]
    assert versions.index_repeats(occurrences) == {"b", "c"}  # m.py:7 keeps w[0] and w[7]


def test_version_manifest_needs_the_models_manifest(cpu_scan, tmp_path):
    _, scan_file = cpu_scan
    with pytest.raises(scan.ScanError, match="no shipped manifest of model 'm'"):
        versions.write_version_manifest(scan_file, root=tmp_path)


def test_version_manifest_refuses_a_file_that_is_no_scan(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"model": "m"}\n')
    with pytest.raises(scan.ScanError, match="x.jsonl: not a casedb scan file"):
        versions.write_version_manifest(path, tmp_path / "out.yaml")
    assert not (tmp_path / "out.yaml").exists()


# ------------------------------------------------------------------------- compare --shipped

def test_shipped_granite4h_manifests_include_its_transformers_52_cases():
    files = versions.shipped_files("granite4h")
    assert files == [SHIPPED_MANIFESTS / "granite4h.yaml", SHIPPED_MANIFESTS / "granite4h@transformers-5.2.yaml"]
    cases = _manifest_cases(files[1])
    assert cases and {yaml.safe_load(files[1].read_text())["model"]} == {"granite4h"}
    main = {(c["op"], json.dumps(c["inputs"], sort_keys=True), json.dumps(c.get("attrs"), sort_keys=True))
            for c in _manifest_cases(files[0])}
    assert not [c["name"] for c in cases
                if (c["op"], json.dumps(c["inputs"], sort_keys=True), json.dumps(c.get("attrs"), sort_keys=True))
                in main]


def test_compare_shipped_counts_the_version_manifests(cli):
    out = cli.json("scan", "granite4h", "--compare", OPS, "--shipped")
    assert out["shipped"] == ["manifests/granite4h.yaml", "manifests/granite4h@transformers-5.2.yaml"] or \
        [Path(p).name for p in out["shipped"]] == ["granite4h.yaml", "granite4h@transformers-5.2.yaml"]
    result = out["compare"]
    assert (result["theirs"], result["matched"], result["coverage"]) == (5, 4, 80.0)
    assert result["missing"] == ["torch.not_an_op_anyone_records"]
    assert result["not_operators"] == ["torch.nn.attention.sdpa_kernel"]
    assert result["from_version_manifests"] == ["torch.Tensor.flatten", "torch.Tensor.long", "torch.Tensor.scatter"]


def test_compare_shipped_needs_their_file_and_a_shipped_model(cli):
    result = cli("scan", "granite4h", "--shipped")
    assert result.exit_code == 2 and "give --compare FILE" in result.stderr
    result = cli("scan", "no-such-model", "--compare", OPS, "--shipped")
    assert result.exit_code == 2 and "no shipped manifest has model 'no-such-model'" in result.stderr


def test_scan_new_cases_writes_the_version_manifest(cli, tmp_path):
    out = cli.json("scan", _recipe(tmp_path), "--device", "cpu", "-o", tmp_path / "m.jsonl",
                   "--new-cases", tmp_path / "m@transformers-x.yaml")
    written = out["new_cases"]
    assert (written["model"], written["new"], written["already_shipped"]) == ("m", written["scanned"], 0)
    assert written["scanned"] > 0 and len(_manifest_cases(tmp_path / "m@transformers-x.yaml")) == written["new"]
