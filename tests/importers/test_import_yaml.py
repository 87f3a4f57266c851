"""RFC YAML manifests: import, dedupe, export round trip, bad input."""

import json

import pytest

from tests.helpers import rows, sha256_of

BROKEN = ["syntax_error", "unknown_dtype", "negative_dim", "unknown_preset", "forbidden_py", "forbidden_skip_if",
          "unknown_key"]




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
    # the case sets no tolerance of its own: casedb.judge.numerics gives one per compared dtype (the
    # manifest default for its fp16 outputs), at run time
    assert (r["op"], r["cdtype"], json.loads(r["derived"]), r["rtol"], r["atol"]) == (
        "torch.getitem", "float16", ["constant"], None, None)
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
         "rtol": 0.05, "atol": None, "marks": '["hot_path"]', "dtype": "bfloat16"},
        {"model": "model_a", "name": "a_add", "description": "model_a residual add",
         "rtol": None, "atol": None, "marks": "[]", "dtype": None},
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


def test_export_of_an_unknown_model_leaves_the_file_as_it_was(cli, data_dir, tmp_path):
    cli("import", data_dir / "template.yaml")
    out = tmp_path / "template.yaml"
    assert cli("export", "--model", "template", "-o", out).exit_code == 0
    before = out.read_bytes()
    res = cli("export", "--model", "templat", "-o", out)
    assert res.exit_code == 2 and "templat" in res.stderr
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


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


EDGE_DOCUMENTS = [
    "=: 1", "a: !!binary aGVsbG8=", "a: 2001-12-14", "a: !!str 12", 'a: !!int "12"', "a: ! 12", "a: 0o17",
    "a: 017", "a: 1_000", "a: 190:20:30", "a: .inf", "a: .nan", "a: -.inf", "a: yes", "a: off", "a: Null", "a: ~",
    "b: &b {x: 1, y: 2}\nc: &c {y: 3, z: 4}\na: {<<: [*b, *c], x: 9}", "a: {<<: {k: 1}, <<: {j: 2}}",
    "- &a {x: 1}\n- {<<: *a, y: 2}", "<<: {a: 1}\nb: 2", "", "# only a comment", "[1, 2]", "a:\n  - !!null ~",
    "a: &s hello\nb: *s", "a: &l [1, 2]\nb: [*l, *l]", "x: {a: 1, a: 2}", 'x: "\\u00e9\\t"', "x: 'it''s'",
    "x: |\n  a\n  b\n", "x: >-\n  a\n  b\n", "a: !!float 1", "a: 1e3", "a: 1.0e3", '[1, "1", 1.0, x, x, true, "true"]',
    '{1: a, "1": b}', "a: &n 5\nb: [*n, *n]",
]


def _loaders():
    from importers import yaml_manifest

    return [yaml_manifest._PyLoader] + ([yaml_manifest._CLoader] if yaml_manifest.CParser else [])


def _same(a, b, ordered: bool = True) -> bool:
    """Equal, with the same types and (``ordered``) key order all the way down (NaN equal to NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys_match = list(a) == list(b) if ordered else sorted(map(repr, a)) == sorted(map(repr, b))
        return keys_match and all(_same(a[k], b[k], ordered) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, ordered) for x, y in zip(a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))


@pytest.mark.parametrize("loader", _loaders(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("text", EDGE_DOCUMENTS)
def test_manifest_loader_reads_what_safe_loader_reads(text, loader, tmp_path):
    """The bounded loader (importers.yaml_manifest) builds objects from parser events itself,
    on libyaml's parser or PyYAML's; it must give exactly what yaml.SafeLoader gives."""
    import yaml

    from importers import yaml_manifest

    (tmp_path / "doc.yaml").write_text(text)
    got = yaml_manifest.load(tmp_path / "doc.yaml", loader_class=loader)
    # the order of a merged mapping's keys is not the spec's (PyYAML 6.0.4 changed it): not compared
    assert _same(got, yaml.load(text, Loader=yaml.SafeLoader), ordered="<<" not in text)


@pytest.mark.parametrize("loader", _loaders(), ids=lambda c: c.__name__)
def test_merge_keys_follow_the_yaml_spec(loader, tmp_path):
    """https://yaml.org/type/merge.html: keys of the mapping itself win over merged ones, and
    in a list of merged mappings an earlier one wins over a later one."""
    from importers import yaml_manifest

    (tmp_path / "doc.yaml").write_text(
        "b: &b {x: 1, y: 2}\nc: &c {y: 3, z: 4}\nlist: {<<: [*b, *c], x: 9}\none: {<<: *c, z: 5}\n")
    got = yaml_manifest.load(tmp_path / "doc.yaml", loader_class=loader)
    assert dict(got["list"]) == {"x": 9, "y": 2, "z": 4}
    assert dict(got["one"]) == {"y": 3, "z": 5}


@pytest.mark.slow
@pytest.mark.parametrize("loader", _loaders(), ids=lambda c: c.__name__)
def test_shipped_manifests_load_as_safe_loader_reads_them(data_dir, loader):
    import yaml

    from importers import yaml_manifest
    from casedb.store.database import SHIPPED_MANIFESTS

    paths = sorted(SHIPPED_MANIFESTS.glob("**/*.yaml")) + sorted(data_dir.glob("**/*.yaml"))
    assert len(paths) > 20
    for path in paths:
        if path.parent.name == "broken":
            continue
        got = yaml_manifest.load(path, loader_class=loader)
        assert _same(got, yaml.load(path.read_text(), Loader=yaml.SafeLoader)), path
        if isinstance(got, dict):
            assert got.line == 1 + next(i for i, line in enumerate(path.read_text().splitlines())
                                        if line.strip() and not line.lstrip().startswith(("#", "---")))


@pytest.mark.parametrize("text, message", [
    ("a: !!set {x, y}", "doc.yaml:1: the YAML tag tag:yaml.org,2002:set is not used in manifests; write a plain map"),
    ("a: !!omap [{x: 1}]", "doc.yaml:1: the YAML tag tag:yaml.org,2002:omap is not used in manifests; write a plain"),
    ("? [1, 2]\n: x", "doc.yaml:1: found an unhashable key"),
    ("a: &x 1\nb: &x 2", "doc.yaml:2: found duplicate anchor &x"),
    ("a: *nowhere", "doc.yaml:1: found undefined alias *nowhere"),
    ("a: 1\n---\nb: 2", "doc.yaml:2: expected a single document in the stream"),
    ("a: {<<: [1]}", "doc.yaml:1: a merge key (<<) takes a mapping or a list of mappings"),
    ("a: !foo 1", "doc.yaml:1: YAML syntax error: could not determine a constructor for the tag '!foo'"),
])
@pytest.mark.parametrize("loader", _loaders(), ids=lambda c: c.__name__)
def test_manifest_loader_refusals_name_the_line(text, message, loader, tmp_path):
    from casedb.errors import InputError
    from importers import yaml_manifest

    (tmp_path / "doc.yaml").write_text(text)
    with pytest.raises(InputError) as e:
        yaml_manifest.load(tmp_path / "doc.yaml", loader_class=loader)
    assert message in str(e.value)


@pytest.mark.parametrize("loader", _loaders(), ids=lambda c: c.__name__)
def test_surrogate_escapes_are_refused_by_either_parser(loader, tmp_path):
    from casedb.errors import InputError
    from importers import yaml_manifest

    (tmp_path / "doc.yaml").write_text('a: ok\nb: "x\\udc80y"\n')
    with pytest.raises(InputError) as e:
        yaml_manifest.load(tmp_path / "doc.yaml", loader_class=loader)
    assert str(e.value).startswith(f"{tmp_path / 'doc.yaml'}:2: ")
    assert ("lone surrogate \\udc80" in str(e.value)) if loader is yaml_manifest._PyLoader else (
        "found invalid Unicode character escape code" in str(e.value))
