"""RFC YAML manifests: import, dedupe, export round trip, bad input."""

import json
import sqlite3

import pytest

from tests.conftest import sha256_of

BROKEN = ["syntax_error", "unknown_dtype", "negative_dim", "unknown_preset", "forbidden_py", "forbidden_skip_if",
          "unknown_key"]


def rows(db, sql):
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql)]
    finally:
        con.close()


def test_rfc_template_imports_13_cases_and_is_idempotent(cli, data_dir, db_path):
    first = cli.json("import", data_dir / "template.yaml")
    assert first["totals"] == {"records": 13, "occurrences": 13, "new_cases": 13, "duplicates": 0, "skipped": 0,
                               "files": 1}
    again = cli.json("import", data_dir / "template.yaml")
    assert again["totals"]["new_cases"] == 0
    assert again["totals"]["duplicates"] == 13
    stats = cli.json("stats")
    assert {k: stats[k] for k in ("models", "cases", "occurrences", "duplicates")} == {
        "models": 1, "cases": 13, "occurrences": 13, "duplicates": 0}


def test_template_rows_are_normalized(cli, data_dir, db_path):
    cli("import", data_dir / "template.yaml")
    by_name = {r["name"]: r for r in rows(db_path, "SELECT mc.*, c.op, c.inputs, c.attrs, c.marks AS derived, c.dtype AS cdtype "
                                                   "FROM model_cases mc JOIN cases c USING (signature)")}
    r = by_name["getitem_ellipsis_none_fullslice"]
    assert json.loads(r["inputs"]) == [
        {"tensor": {"shape": [32, 5760], "dtype": "float16", "init": "rand"}},
        {"py": "(Ellipsis, None, slice(None, None, None))"},
    ]
    assert (r["op"], r["cdtype"], json.loads(r["derived"]), r["rtol"], r["atol"]) == (
        "torch.getitem", "float16", ["constant"], 0.001, 0.001)
    r = by_name["rsqrt_skip_example"]
    assert json.loads(r["skip_if"]) == [
        {"expr": "cfg.test_device.type == 'spyre' and dtype_str == 'fp16'", "reason": "Spyre fp16 rsqrt not supported yet"}]
    r = by_name["view_should_error_on_noncontig"]
    assert json.loads(r["expects_error"]) == {"type": "RuntimeError", "match": "view"}
    assert json.loads(r["inputs"])[0] == {"tensor": {"shape": [2, 3, 8], "dtype": "float16", "init": "randn",
                                                     "preset": "noncontig_slice", "preset_args": {"dim": 1, "step": 2}}}
    r = by_name["op_different_dtypes"]
    assert json.loads(r["inputs"]) == [
        {"tensor": {"shape": [11, 6], "dtype": "float32", "init": "randn"}},
        {"tensor": {"shape": [11, 6], "dtype": "int64", "init": "randint", "init_args": {"high": 100, "low": 0}}},
    ]
    assert json.loads(r["derived"]) == ["fp32operation", "paddedtensor"]
    assert json.loads(by_name["softmax_lastdim"]["attrs"]) == {"dim": -1}
    model = rows(db_path, "SELECT name, key, family, variant_of, defaults FROM models")
    assert model == [{"name": "template", "key": "template", "family": None, "variant_of": None,
                      "defaults": '{"atol":0.001,"dtype":"float16","rtol":0.001,"seed":123}'}]


def test_two_models_share_one_case(cli, data_dir, db_path):
    report = cli.json("import", data_dir / "shared")
    assert [(f["model"], f["new_cases"], f["duplicates"]) for f in report["files"]] == [
        ("model_a", 2, 0), ("model-b", 0, 1)]
    stats = cli.json("stats")
    assert (stats["cases"], stats["occurrences"], stats["duplicates"], stats["cross_model_cases"]) == (2, 3, 1, 1)
    occ = rows(db_path, "SELECT model, name, description, rtol, atol, marks, dtype FROM model_cases "
                        "WHERE name LIKE '%add%' ORDER BY model")
    assert occ == [
        {"model": "model-b", "name": "residual_add_b", "description": "model_b residual add, spelled differently",
         "rtol": 0.05, "atol": 1e-5, "marks": '["hot_path"]', "dtype": "bfloat16"},
        {"model": "model_a", "name": "a_add", "description": "model_a residual add",
         "rtol": 0.01, "atol": 0.01, "marks": "[]", "dtype": None},
    ]
    listed = cli.json("cases", "--model", "model_b")
    assert [(c["model"], c["name"], c["op"], c["marks"]) for c in listed] == [
        ("model-b", "residual_add_b", "torch.add", ["bf16operation", "hot_path"])]
    models = cli.json("models")
    assert [(m["name"], m["cases"], m["unique_cases"]) for m in models] == [("model-b", 1, 1), ("model_a", 2, 2)]


def test_export_reimport_round_trip(cli, data_dir, db_path, tmp_path):
    cli("import", data_dir / "template.yaml", data_dir / "shared")
    fresh = tmp_path / "fresh.db"
    for model in ("template", "model_a", "model-b"):
        out = tmp_path / "out" / f"{model}.yaml"
        assert cli("export", "--model", model, "-o", out).exit_code == 0
        assert cli("import", out, db=fresh).exit_code == 0
    q = ("SELECT mc.model, mc.name, mc.signature, mc.description, mc.marks, mc.rtol, mc.atol, mc.skip_if, "
         "mc.expects_error, mc.xfail, mc.dtype, mc.count FROM model_cases mc ORDER BY model, name")
    assert [r["count"] for r in rows(db_path, "SELECT count FROM model_cases WHERE name = 'a_silu'")] == [24]
    assert rows(fresh, q) == rows(db_path, q)
    assert rows(fresh, "SELECT * FROM cases ORDER BY signature") == [
        {**r, "created_at": r2["created_at"]} for r, r2 in zip(rows(db_path, "SELECT * FROM cases ORDER BY signature"),
                                                                rows(fresh, "SELECT * FROM cases ORDER BY signature"))]


@pytest.mark.parametrize("name", BROKEN)
def test_broken_manifest_rejected_and_db_unchanged(cli, data_dir, db_path, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    cli("import", data_dir / "template.yaml")
    before = sha256_of(db_path)
    result = cli("import", data_dir / "broken" / f"{name}.yaml")
    assert result.exit_code == 2
    assert f"broken/{name}.yaml" in result.stderr
    assert sha256_of(db_path) == before
    assert not (tmp_path / "CASEDB_PWNED").exists()


@pytest.mark.parametrize("name, expected", [
    ("syntax_error", "syntax_error.yaml:7: YAML syntax error"),
    ("unknown_dtype", "unknown_dtype.yaml:8: case 'add_fp12': inputs[0]: unknown dtype 'fp12'; known: float16, bfloat16"),
    ("negative_dim", "negative_dim.yaml:3: case 'relu_negative': inputs[0]: shape [4, -1] has negative dimension -1"),
    ("unknown_preset", "case 'contiguous_weird': inputs[0]: unknown preset 'zigzag'; known presets: noncontig_slice"),
    ("forbidden_py", "case 'getitem_evil': py literal"),
    ("forbidden_skip_if", "case 'rsqrt_evil_skip': expression"),
    ("unknown_key", "case 'add_typo': unknown key 'input' — did you mean 'inputs'?"),
])
def test_broken_manifest_messages(cli, data_dir, name, expected):
    result = cli("import", data_dir / "broken" / f"{name}.yaml")
    assert expected in " ".join(result.stderr.split())


def test_bad_folder_is_one_transaction(cli, data_dir, db_path, tmp_path):
    # A good file followed by a bad one: nothing from the good one is kept either.
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a_good.yaml").write_text((data_dir / "template.yaml").read_text())
    (folder / "b_bad.yaml").write_text((data_dir / "broken" / "negative_dim.yaml").read_text())
    cli("stats")
    before = sha256_of(db_path)
    assert cli("import", folder).exit_code == 2
    assert sha256_of(db_path) == before
    assert cli.json("stats")["cases"] == 0


def test_dry_run_writes_nothing(cli, data_dir, db_path):
    cli("stats")
    before = sha256_of(db_path)
    report = cli.json("import", "--dry-run", data_dir / "template.yaml")
    assert report["dry_run"] is True and report["totals"]["new_cases"] == 13
    assert sha256_of(db_path) == before


def test_rfc_implementation_spellings(cli, tmp_path, db_path):
    (tmp_path / "gpt_oss-spyre.yaml").write_text("""
model: gpt_oss
defaults: {dtype: torch.float16}
cases:
  - name: mul_kw
    op: torch.Tensor.mul
    kwmap: {other: 2.0}
    marks: fp32operation
    expects_error: {ref: {type: RuntimeError, match: x}, spyre: {type: ValueError}}
    xfail_if: backend == 'inductor'
    xfail_reason: known inductor issue
    inputs:
      - tensor: {shape: [2, 64], dtype: float16}
  - name: to_device
    op: torch.to
    attrs: {device: "cuda:0", dtype: torch.bfloat16}
    inputs:
      - tensor: {shape: [2, 64]}
""")
    assert cli("import", tmp_path / "gpt_oss-spyre.yaml").exit_code == 0
    assert rows(db_path, "SELECT name, variant_of FROM models") == [{"name": "gpt_oss-spyre", "variant_of": "gpt_oss"}]
    occ = rows(db_path, "SELECT name, marks, expects_error, xfail FROM model_cases ORDER BY name")
    assert occ == [
        {"name": "mul_kw", "marks": '["fp32operation"]',
         "expects_error": '{"ref":{"match":"x","type":"RuntimeError"},"spyre":{"type":"ValueError"}}',
         "xfail": '{"expr":"backend == \'inductor\'","reason":"known inductor issue"}'},
        {"name": "to_device", "marks": "[]", "expects_error": None, "xfail": None},
    ]
    listed = cli.json("cases", "--model", "GPT-OSS-spyre", "-k", "to_device")
    assert [(c["name"], c["marks"]) for c in listed] == [("to_device", [])]


def test_file_and_data_inputs_go_to_blobs(cli, tmp_path, db_path):
    import torch

    torch.save(torch.arange(6, dtype=torch.float32).reshape(2, 3), tmp_path / "x.pt")
    (tmp_path / "m.yaml").write_text("""
model: blobby
cases:
  - name: from_file
    op: torch.relu
    inputs: [{file: x.pt}]
  - name: inline
    op: torch.relu
    inputs: [{tensor: {shape: [2, 3], init: data, data: [[0, 1, 2], [3, 4, 5]], dtype: fp32}}]
""")
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    blobs = rows(db_path, "SELECT sha256, size FROM blobs")
    assert len(blobs) == 1 and blobs[0]["size"] == 24  # same values: one blob
    out = tmp_path / "exp" / "blobby.yaml"
    assert cli("export", "--model", "blobby", "-o", out).exit_code == 0
    assert "data: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in out.read_text()
    fresh = tmp_path / "fresh.db"
    assert cli("import", out, db=fresh).exit_code == 0
    q = "SELECT name, signature FROM model_cases ORDER BY name"
    assert rows(fresh, q) == rows(db_path, q)
