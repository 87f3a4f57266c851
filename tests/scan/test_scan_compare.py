"""Issue 27: `casedb scan MODEL --compare FILE` (another tracer's ops against a scan's), the op
readers (v2, v1, op list), and the input builders of the new model kinds (encoders, CLIP,
Mistral3) scanned from tiny configs on the meta device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from casedb.scan import compare, scanner as scan

DATA = Path(__file__).parents[1] / "data" / "scan"
V2 = """\
test_suite_config:
  files:
    - path: ${TORCH_DEVICE_ROOT}/tests/models/test_model_ops_v2.py
      tests:
        - names: [TestSpyreModelOps::test_model_ops_db]
          edits:
            ops:
              include:
                - name: torch.nn.functional.linear
                  sample_inputs_func: {args: []}
                - name: torch.truediv
                - name: torch.and_
                - name: torch.nn.functional.linear
                - name: torch.nn.attention.sdpa_kernel
                - name: torch.scatter
"""


def write_recipe(directory: Path, model: str, config: str, arch: str, **inputs) -> Path:
    path = directory / f"{model}.yaml"
    path.write_text(yaml.safe_dump({"model": model, "config": str(DATA / config), "arch": arch,
                                    "defaults": {"dtype": "fp32", "seed": 0}, "inputs": inputs}))
    return path


# ------------------------------------------------------------------------------------ readers

def test_v2_file_yields_include_names_once_in_order(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(V2)
    assert compare.read_ops(path) == ["torch.nn.functional.linear", "torch.truediv", "torch.and_",
                                      "torch.nn.attention.sdpa_kernel", "torch.scatter"]


def test_v1_file_yields_case_ops(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({"model": "m", "cases": [{"name": "a", "op": "torch.long"},
                                                            {"name": "b", "op": "torch.getitem"},
                                                            {"name": "c", "op": "torch.long"}]}))
    assert compare.read_ops(path) == ["torch.long", "torch.getitem"]


def test_op_list_skips_comments_and_counts(tmp_path):
    path = tmp_path / "ops.txt"
    path.write_text("# cases: 3\ntorch.truediv\t7\n\ntorch.Tensor.view  # a method\ntorch.truediv\n")
    assert compare.read_ops(path) == ["torch.truediv", "torch.Tensor.view"]


@pytest.mark.parametrize("name,text,message", [
    ("bad.txt", "torch.add\nx = y(\n", "bad.txt: line 2 is not an op name ('x = y(')"),
    ("empty.txt", "# nothing\n", "empty.txt: no op names in the file"),
    ("other.yaml", "a: 1\n", "other.yaml: neither a v2 file"),
    ("noname.yaml", "cases:\n  - {op: torch.add}\n  - {name: x}\n", "noname.yaml: cases[].op: item 2 has no op name"),
])
def test_bad_files_name_the_file_and_what_is_wrong(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(scan.ScanError) as e:
        compare.read_ops(path)
    assert message in str(e.value)


# --------------------------------------------------------------------------------- comparing

@pytest.mark.parametrize("theirs,ours", [
    ("torch.truediv", "torch.Tensor.div"), ("torch.and_", "torch.Tensor.__and__"), ("torch.ne", "torch.Tensor.ne"),
    ("torch.sub", "torch.Tensor.__rsub__"), ("torch.invert", "torch.Tensor.__invert__"),
    ("torch.functional.split", "torch.Tensor.split"), ("torch.long", "torch.Tensor.long"),
    ("torch.ops.aten.index", "torch.getitem"), ("torch.floordiv", "torch.Tensor.__floordiv__"),
    ("torch.gt", "torch.greater"), ("torch.ops.aten.mm.default", "torch.mm"),
])
def test_both_spellings_of_an_operator_have_one_key(theirs, ours):
    assert compare.op_key(theirs) == compare.op_key(ours)


def test_compare_lists_each_side_and_leaves_bookkeeping_out():
    theirs = ["torch.nn.functional.linear", "torch.truediv", "torch.and_", "torch.nn.attention.sdpa_kernel",
              "torch._C._functorch._add_batch_dim", "torch.scatter"]
    ours = {"torch.nn.functional.linear", "torch.Tensor.div", "torch.Tensor.__and__", "torch.Tensor.view"}
    assert compare.compare(ours, theirs) == {
        "theirs": 4, "ours": 4, "matched": 3, "coverage": 75.0, "missing": ["torch.scatter"],
        "extra": ["torch.Tensor.view"],
        "not_operators": ["torch.nn.attention.sdpa_kernel", "torch._C._functorch._add_batch_dim"],
    }


# ------------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_recipe(tmp_path_factory.mktemp("recipes"), "tiny-bert", "tiny-bert.json", "BertForMaskedLM",
                        batch=2, seq_len=8)


def test_cli_compare_reports_both_sides(cli, bert, tmp_path):
    theirs = tmp_path / "ops.txt"
    theirs.write_text("torch.nn.functional.linear\ntorch.nn.functional.gelu\ntorch.add\ntorch.scatter\n"
                      "torch.amp.autocast_mode._enter_autocast\n")
    res = cli("scan", str(bert), "--compare", str(theirs), "-o", str(tmp_path / "s.jsonl"), "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["compare"]
    extra = got.pop("extra")
    assert got == {"file": str(theirs), "theirs": 4, "ours": len(extra) + 3, "matched": 3, "coverage": 75.0,
                   "missing": ["torch.scatter"], "not_operators": ["torch.amp.autocast_mode._enter_autocast"],
                   "dropped": {}}
    assert "torch.nn.functional.layer_norm" in extra and not [op for op in extra if op.endswith(".add")]


def test_ops_a_scan_saw_but_dropped_are_named_with_the_reason():
    records = [{"type": "case", "case": {"op": "torch.Tensor.long"}}, {"type": "case", "case": {"op": "torch.add"}}]
    header = {"dropped_ops": {"no-op conversion": ["torch.Tensor.int", "torch.Tensor.long"],
                              "no tensor result": ["torch.Tensor.size"]}}
    result = scan.ScanResult(header=header, records=records, seconds=0.0)
    got = compare.compare_scan(result, ["torch.long", "torch.int", "torch.size", "torch.scatter"])
    assert (got["missing"], got["dropped"]) == (["torch.int", "torch.scatter", "torch.size"],
                                                {"torch.int": "no-op conversion", "torch.size": "no tensor result"})


def test_a_scan_header_lists_the_ops_it_dropped(bert):
    dropped = scan.scan(bert).header["dropped_ops"]
    assert "torch.Tensor.size" in dropped["no tensor result"] and "torch.Tensor.to" in dropped["no-op conversion"]


def test_cli_compare_prints_markdown(cli, bert, tmp_path):
    theirs = tmp_path / "ops.txt"
    theirs.write_text("torch.nn.functional.linear\ntorch.scatter\n")
    res = cli("scan", str(bert), "--compare", str(theirs), "-o", str(tmp_path / "s.jsonl"))
    assert res.exit_code == 0, res.output
    assert f"## tiny-bert against {theirs}: 50.0 % of their 2 operators (1 matched;" in res.stdout
    assert "- theirs, not ours: torch.scatter\n" in res.stdout


def test_cli_compare_bad_file_fails_before_the_scan(cli, bert, tmp_path):
    theirs = tmp_path / "ops.yaml"
    theirs.write_text("just: a mapping\n")
    out = tmp_path / "s.jsonl"
    res = cli("scan", str(bert), "--compare", str(theirs), "-o", str(out))
    assert res.exit_code == 2
    assert f"{theirs}: neither a v2 file" in res.output
    assert not out.exists()


# ------------------------------------------------------------------------- new model kinds

def test_encoder_scans_one_forward_with_right_padded_mask(bert):
    result = scan.scan(bert)
    assert result.header["phase"] == "prefill+decode" and result.header["inputs"] == {"batch": 2, "seq_len": 8}
    ops = {r["case"]["op"] for r in result.cases}
    assert {"torch.nn.functional.embedding", "torch.nn.functional.layer_norm", "torch.nn.functional.gelu",
            "torch.nn.functional.scaled_dot_product_attention"} <= ops
    # no decode step: every call sees the 8-token texts, none a 1-token step
    linears = [r["case"]["inputs"][0]["tensor"]["shape"] for r in result.cases
               if r["case"]["op"] == "torch.nn.functional.linear"]
    assert linears and all(shape[:2] == [2, 8] for shape in linears)


def test_clip_scans_texts_and_images(tmp_path):
    recipe = write_recipe(tmp_path, "tiny-clip", "tiny-clip.json", "CLIPModel", batch=3, seq_len=8, images=1)
    result = scan.scan(recipe)
    convs = [r["case"] for r in result.cases if r["case"]["op"] == "torch.nn.functional.conv2d"]
    assert [c["inputs"][0]["tensor"]["shape"] for c in convs] == [[1, 3, 32, 32]]
    embeds = [r["case"]["inputs"][0]["tensor"]["shape"] for r in result.cases
              if r["case"]["op"] == "torch.nn.functional.embedding"]
    assert [3, 8] in embeds


def test_mistral3_image_sizes_stay_real(tmp_path):
    # Mistral3 reads the image sizes back with as_tensor(image_sizes, device=<meta>).tolist():
    # they must stay on the CPU, or the forward fails on the meta device.
    recipe = write_recipe(tmp_path, "tiny-mistral3", "tiny-mistral3.json", "Mistral3ForConditionalGeneration",
                          batch=1, text_len=5, image_size=[16, 24])
    result = scan.scan(recipe)
    scatters = [r["case"] for r in result.cases if r["case"]["op"] == "torch.Tensor.masked_scatter"]
    # 16x24 pixels / (patch 4 x merge 2) = 2x3 = 6 image tokens among 5 text tokens
    assert scatters and scatters[0]["inputs"][0]["tensor"]["shape"] == [1, 11, 64]


def test_unknown_architecture_names_the_supported_kinds(tmp_path):
    recipe = write_recipe(tmp_path, "bart", "tiny-bert.json", "BartForConditionalGeneration", batch=1)
    with pytest.raises(scan.ScanError, match="no input builder for architecture 'BartForConditionalGeneration'.*"
                                             "encoders.*T5ForConditionalGeneration.*WhisperForConditionalGeneration"):
        scan.load_recipe(recipe)


def test_sentence_embedding_pooling_is_recorded_at_its_lines(tmp_path):
    path = tmp_path / "st.yaml"
    path.write_text(yaml.safe_dump({"model": "st", "config": str(DATA / "tiny-bert.json"), "arch": "BertModel",
                                    "pooling": "mean", "inputs": {"batch": 2, "seq_len": 8}}))
    result = scan.scan(path)
    pooled = {r["case"]["op"]: r["where"] for r in result.cases if r["where"].startswith("casedb/scan/pooling.py")}
    assert sorted(pooled) == ["torch.Tensor.div", "torch.Tensor.expand_as", "torch.Tensor.mul", "torch.Tensor.sum",
                              "torch.Tensor.to", "torch.Tensor.unsqueeze", "torch.clamp", "torch.nn.functional.normalize",
                              "torch.sum"]


def test_pooling_is_for_encoders(tmp_path):
    path = tmp_path / "st.yaml"
    path.write_text(yaml.safe_dump({"model": "st", "config": str(DATA / "tiny-clip.json"), "arch": "CLIPModel",
                                    "pooling": "mean"}))
    with pytest.raises(scan.ScanError, match="st.yaml: pooling applies to encoders; CLIPModel is not one"):
        scan.load_recipe(path)


def test_roberta_buffer_moved_to_real_positions_stays_meta(tmp_path):
    # RobertaEmbeddings: self.token_type_ids.to(position_ids.device), a meta buffer meeting the real
    # (CPU) positions made from the ids: it stays meta instead of failing "Cannot copy out of meta".
    recipe = write_recipe(tmp_path, "tiny-roberta", "tiny-roberta.json", "RobertaForQuestionAnswering",
                          batch=1, seq_len=8)
    result = scan.scan(recipe)
    embeds = [r["case"]["inputs"][0]["tensor"]["shape"] for r in result.cases
              if r["case"]["op"] == "torch.nn.functional.embedding"]
    assert [1, 8] in embeds and "torch.cumsum" in {r["case"]["op"] for r in result.cases}
