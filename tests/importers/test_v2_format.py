"""The RFC implementation's v2 model-ops configs in and out (issue 26): import with every input kind
and init, layouts in the signature, the judgement (precision, seed, modes, excludes), their dedupe
count beside casedb's, export and the round trip, and the v1 spellings that stopped importing."""

import json
import math
from collections import Counter
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from casedb.cases import materialize, ops, presets
from casedb.store.database import Store
from importers import model_ops_v2
from tests.helpers import rows, sha256_of

V2 = Path(__file__).parents[1] / "data" / "v2"
TOY = V2 / "toy-v2.yaml"


def cases(db, model=None) -> dict:
    """name -> the stored occurrence row with its case (inputs and attrs parsed)."""
    out = {}
    for r in rows(db, "SELECT mc.model, mc.name, c.signature, c.op, c.inputs, c.attrs, mc.rtol, mc.atol, mc.xfail, "
                      "mc.skip_if, mc.marks AS own_marks, mc.description FROM model_cases mc JOIN cases c "
                      "ON c.signature = mc.signature WHERE ? IS NULL OR mc.model = ?", (model, model)):
        for k in ("inputs", "attrs", "xfail", "skip_if", "own_marks"):
            r[k] = json.loads(r[k]) if r[k] else r[k]
        out[r["name"]] = r
    return out


def args_of(db, name, model="toy-v2"):
    with Store(db) as store:
        occ = next(o for o in store.occurrences([model], markexpr="") if o["name"] == name)
        return materialize.materialize(occ, "cpu", load_blob=store.load_blob)[0]


# ----------------------------------------------------------------------------------- import

def test_v2_config_imports_every_input_kind(cli, db_path):
    r = cli("import", TOY)
    assert r.exit_code == 0, r.output
    got = cases(db_path)
    assert len(got) == 15
    assert {k: got["torch.mul.1"][k] for k in ("model", "op", "inputs", "attrs", "rtol", "atol", "xfail", "skip_if",
                                                "own_marks", "description")} == {
        "model": "toy-v2", "op": "torch.mul",
        "inputs": [{"tensor": {"shape": [4, 3], "dtype": "float32", "init": "randn", "preset": "strided",
                               "preset_args": {"stride": [1, 4], "storage_offset": 0}}}, {"value": 0.5}],
        "attrs": {}, "rtol": 0.002, "atol": 0.001, "xfail": None, "skip_if": None, "own_marks": [],
        "description": "toy.py#L2 in forward, code: x.t() * 0.5"}
    # the tag `constant` is one of casedb's derived marks: kept with the case, not as the model's own
    derived = rows(db_path, "SELECT c.marks FROM cases c JOIN model_cases mc ON mc.signature = c.signature "
                            "WHERE mc.name = 'torch.mul.1'")[0]["marks"]
    assert "constant" in json.loads(derived)
    assert got["torch.sub.1"]["inputs"] == [{"tensor": {
        "shape": [1, 1, 4], "dtype": "float32", "init": "rand",
        "device_layout": {"device_size": [1, 1, 64], "stride_map": [64, -1, 1], "device_dtype": "float16"}}}]
    assert got["torch.sub.1"]["attrs"] == {"alpha": 2, "other": {"tensor": {"shape": [4], "dtype": "float32",
                                                                            "init": "rand"}}}
    assert got["torch.cat.1"]["inputs"] == [{"tensor_list": [
        {"shape": [2, 2], "dtype": "float16", "init": "zeros"}, {"shape": [1, 2], "dtype": "float16", "init": "ones"}]}]
    assert got["torch.cat.1"]["attrs"] == {"dim": 0}
    assert (got["torch.cat.1"]["rtol"], got["torch.cat.1"]["atol"]) == (0.02, 0.01)  # float16's precision
    assert got["torch.getitem.1"]["inputs"][1] == {"py": "(slice(None, None, None), 0)"}
    assert got["torch.Tensor.to.1"]["inputs"][1] == {"value": "torch.float16"}
    defaults = rows(db_path, "SELECT defaults FROM models WHERE name = 'toy-v2'")[0]["defaults"]
    assert json.loads(defaults) == {"seed": 123}


@pytest.mark.slow
def test_v2_fixture_runs_eager_on_cpu_without_failures(cli, db_path, tmp_path):
    assert cli("import", TOY).exit_code == 0
    r = cli("run", "--model", "toy-v2", "--device", "cpu", "--backend", "eager", "-j", "1", "--no-progress",
            "--json")
    summary = json.loads(r.stdout)
    assert (summary["executed"], summary["passed"], summary["failed"], summary["errors"],
            summary["ref_errors"]) == (15, 15, 0, 0, 0), r.stdout
    assert cli("check", "--model", "toy-v2").exit_code == 0


@pytest.mark.parametrize("name, check", [
    ("torch.add.1", lambda a: (a[0] >= 0).all() and (a[0] < 1).all() and a[1].std() > 0.1),   # rand, randn
    ("torch.add.2", lambda a: (a[0] >= -4).all() and (a[0] < 4).all() and (a[0] != a[0].round()).any()
     and (a[1] == 1).all()),                                               # randint on float: uniform; ones
    ("torch.nn.functional.embedding.1", lambda a: (a[0] >= 0).all() and (a[0] < 50).all()
     and a[1].abs().max() <= math.sqrt(6 / 58) and a[1].std() > 0.05),    # randint on int64; xavier's bound
    ("torch.cat.1", lambda a: (a[0][0] == 0).all() and (a[0][1] == 1).all()),                 # zeros, ones
    ("torch.matmul.1", lambda a: torch.equal(a[0], torch.eye(3)) and (a[1] == 2.5).all()),     # eye, full
    ("torch.mul.2", lambda a: a[0].tolist() == [0, 1, 2, 3, 4, 5]),                            # arange
    ("torch.diff.1", lambda a: a[0].dtype == torch.int32 and a[0][-1] == 10
     and (a[0].diff() >= 0).all()),                                                            # cumsum_offsets
    ("torch.add.3", lambda a: torch.equal(a[0], torch.arange(6.0).reshape(2, 3) / 8)
     and torch.equal(a[1], torch.arange(6.0).reshape(2, 3) - 2.5)),                            # file .pt, .npy
    ("torch.neg.1", lambda a: a[0].tolist() == [1.0, -2.0, 3.5, 0.25]),                         # .safetensors key
    ("torch.__and__.1", lambda a: a[0].dtype == torch.bool),                                    # bool, init omitted
])
def test_each_init_makes_their_kind_of_values(cli, db_path, name, check):
    assert cli("import", TOY).exit_code == 0
    assert check(args_of(db_path, name))


def test_their_integer_rand_is_zeros_and_bad_inits_are_refused():
    spec = {"shape": [3], "dtype": "torch.int64", "init": "rand"}
    assert model_ops_v2.tensor(spec, "args[0]") == {"shape": [3], "dtype": "int64", "init": "zeros"}
    with pytest.raises(ValueError, match="randint needs init_args.high"):
        model_ops_v2.tensor({"shape": [3], "dtype": "int64", "init": "randint"}, "args[0]")
    with pytest.raises(ValueError, match="arange needs a 1-d shape"):
        model_ops_v2.tensor({"shape": [2, 3], "dtype": "int64", "init": "arange"}, "args[0]")


@pytest.mark.parametrize("init, args, shape, message", [
    ("eye", None, [2, 3], "init 'eye' needs a square 2-d shape"),
    ("xavier", None, [5], "init 'xavier' needs at least 2 dimensions"),
    ("cumsum_offsets", None, [4], "needs init_args.total"),
    ("full", None, [4], "needs init_args.fill_value"),
])
def test_bad_init_is_refused_with_file_and_line(cli, db_path, tmp_path, init, args, shape, message):
    text = TOY.read_text().replace("init: xavier", f"init: {init}").replace("shape: [50, 8]", f"shape: {shape}")
    text = text.replace("stride: [8, 1]", f"stride: {presets.contiguous_strides(shape)}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    r = cli("import", bad)
    assert r.exit_code == 2
    assert f"{bad}:" in r.output and message in r.output


def test_file_init_keeps_a_recorded_layout(cli, db_path, tmp_path):
    text = TOY.read_text().replace("                            path: files/b.npy\n",
                                   "                            path: files/b.npy\n                          stride: [1, 2]\n")
    shutil.copytree(V2 / "files", tmp_path / "files")
    (tmp_path / "f.yaml").write_text(text)
    assert cli("import", tmp_path / "f.yaml").exit_code == 0
    b = args_of(db_path, "torch.add.3")[1]
    assert b.stride() == (1, 2) and torch.equal(b, torch.arange(6.0).reshape(2, 3) - 2.5)


def test_file_init_checks_shape_and_dtype(cli, tmp_path):
    (tmp_path / "files").mkdir()
    torch.save(torch.zeros(2, 2), tmp_path / "files" / "a.pt")
    text = TOY.read_text().replace("path: files/b.npy", "path: files/a.pt")
    for name in ("b.npy", "w.safetensors"):
        (tmp_path / "files" / name).write_bytes((V2 / "files" / name).read_bytes())
    (tmp_path / "bad.yaml").write_text(text)
    r = cli("import", tmp_path / "bad.yaml")
    assert r.exit_code == 2
    assert "holds a float32 tensor of shape [2, 2], but the spec says float32 [2, 3]" in r.output


def test_typo_key_is_refused_with_file_line_and_the_db_unchanged(cli, db_path):
    assert cli("import", TOY).exit_code == 0
    before = sha256_of(db_path)
    r = cli("import", V2 / "typo-key.yaml")
    assert r.exit_code == 2
    assert f"{V2 / 'typo-key.yaml'}:70" in r.output
    assert "unknown key 'storage_ofset' — did you mean 'storage_offset'?" in r.output
    assert sha256_of(db_path) == before


def test_typo_key_outside_a_tensor_is_refused_too(cli, db_path, tmp_path):
    """Their loader ignores it (the edits silently vanish); casedb refuses it."""
    bad = tmp_path / "typo.yaml"
    bad.write_text(TOY.read_text().replace("          edits:\n", "          edit:\n", 1))
    r = cli("import", bad)
    assert r.exit_code == 2
    assert f"{bad}:24" in r.output and "unknown key 'edit' in tests[] — did you mean 'edits'?" in r.output
    assert not db_path.exists() or not rows(db_path, "SELECT * FROM model_cases")


# ----------------------------------------------------------------------------------- layouts

def test_layout_is_the_recorded_one_and_part_of_the_signature(cli, db_path, tmp_path):
    assert cli("import", TOY).exit_code == 0
    transposed, offset = args_of(db_path, "torch.mul.1")[0], args_of(db_path, "torch.add.2")
    assert (transposed.shape, transposed.stride(), transposed.storage_offset()) == ((4, 3), (1, 4), 0)
    assert (offset[0].stride(), offset[0].storage_offset(), offset[1].stride()) == ((2, 1), 3, (0, 1))
    contiguous = TOY.read_text().replace("stride: [1, 4]", "stride: [3, 1]")
    shutil.copytree(V2 / "files", tmp_path / "files")
    (tmp_path / "c.yaml").write_text(contiguous.replace("model__toy-v2", "model__toy-c"))
    omitted = contiguous.replace("                          stride: [3, 1]\n", "")
    (tmp_path / "o.yaml").write_text(omitted.replace("model__toy-v2", "model__toy-o"))
    assert cli("import", tmp_path / "c.yaml", tmp_path / "o.yaml").exit_code == 0
    sig = {m: cases(db_path, m)["torch.mul.1"]["signature"] for m in ("toy-v2", "toy-c", "toy-o")}
    assert sig["toy-v2"] != sig["toy-c"] and sig["toy-c"] == sig["toy-o"]


def test_device_layout_goes_to_the_device_hook(cli, db_path, monkeypatch):
    assert cli("import", TOY).exit_code == 0
    seen = []
    monkeypatch.setitem(materialize.DEVICE_LAYOUT_HOOKS, "meta", lambda t, dev, lay: seen.append(lay) or t.to(dev))
    with Store(db_path) as store:
        occ = next(o for o in store.occurrences(["toy-v2"], markexpr="") if o["name"] == "torch.sub.1")
        args, kwargs = materialize.materialize(occ, "meta")
        assert args[0].device.type == "meta" and kwargs["other"].device.type == "meta"
        materialize.materialize(occ, "cpu")
    assert seen == [{"device_size": [1, 1, 64], "stride_map": [64, -1, 1], "device_dtype": "float16"}]


# ----------------------------------------------------------------------------------- judgement

def test_modes_excludes_precision_and_seed(cli, db_path):
    assert cli("import", V2 / "modes.yaml").exit_code == 0
    got = {n: (r["rtol"], r["atol"], r["xfail"], r["skip_if"]) for n, r in cases(db_path).items()}
    xfail = "device != 'cpu'"
    assert got == {
        "torch.exp.1": (0.0003, 0.0001, None, None),
        "torch.exp.2": (None, None, None, [{"expr": "True", "reason": "float16 is not in global.supported_dtypes "
                                                                      "(modes.yaml:18)"}]),
        "torch.sin.1": (0.0003, 0.0001, None, [{"expr": "True", "reason": "edits.ops.exclude: torch_sin "
                                                                          "(modes.yaml:18)"}]),
        # their runner's mode: xfail is not strict (issue 45)
        "torch.cos.1": (0.0003, 0.0001, {"expr": xfail, "reason": "mode: xfail (modes.yaml:52)", "strict": False},
                        None),
        "torch.neg.1": (None, None, None, [{"expr": "True", "reason": "edits.dtypes.exclude: int64 (modes.yaml:82)"}]),
        "torch.tanh.1": (0.0003, 0.0001, None, [{"expr": "True", "reason": "mode: skip (modes.yaml:107)"}]),
        "torch.tanh.2": (0.0003, 0.0001, None, [{"expr": "True", "reason": "mode: skip (modes.yaml:107)"}]),
    }
    assert json.loads(rows(db_path, "SELECT defaults FROM models")[0]["defaults"]) == {"seed": 7}


def test_an_exclude_reaches_the_cases_of_every_test_of_the_file(cli, db_path):
    """Every test entry is the one method test_model_ops_db: an exclude in one deletes that op's
    variants whichever entry lists the case (torch.sin is excluded by the first, listed by the second)."""
    assert cli("import", V2 / "modes.yaml").exit_code == 0
    got = cases(db_path)
    assert got["torch.sin.1"]["skip_if"][0]["reason"].startswith("edits.ops.exclude: torch_sin")
    assert got["torch.cos.1"]["skip_if"] is None


# ----------------------------------------------------------------------------------- dedupe

def test_their_dedupe_count_beside_ours(cli, db_path):
    data = cli.json("import", V2 / "modes.yaml")
    d = data["files"][0]["their_dedupe"]
    assert (d["theirs"], d["ours"], d["disagreements"]) == (7, 6, 1)
    assert d["disagree"][0].startswith("torch.tanh: 2 of their keys are one casedb case (args differ")
    assert "'device': 'cuda'" in d["disagree"][0] and "'device': 'cuda:0'" in d["disagree"][0]
    r = cli("import", V2 / "modes.yaml", "--dry-run")
    assert "7 unique by their runner's dedupe (op, repr(args), repr(kwargs), dtype), 6 by casedb's signatures" \
        in r.output


# ----------------------------------------------------------------------------------- export

def _signatures(db) -> dict:
    return {(r["model"], r["name"]): (r["signature"], r["rtol"], r["atol"], r["own_marks"], r["description"],
                        (r["xfail"] or {}).get("expr"), [s["expr"] for s in r["skip_if"] or []])
            for m in ("toy-v2", "modes-v2") for r in cases(db, m).values()}


def test_export_import_round_trip_keeps_every_signature(cli, db_path, tmp_path):
    assert cli("import", TOY, V2 / "modes.yaml").exit_code == 0
    for model in ("toy-v2", "modes-v2"):
        r = cli("export", "--model", model, "--format", "spyre-v2", "-o", tmp_path / "out" / f"{model}.yaml")
        assert r.exit_code == 0, r.output
    again = tmp_path / "again.db"
    r = cli("import", tmp_path / "out", db=again)
    assert r.exit_code == 0, r.output
    # every case keeps its signature, also the one their op table spells otherwise (issue 47): their
    # torch.to with kwargs {dtype: ...} in the file, casedb's Tensor.to with a positional dtype back
    before, after = _signatures(db_path), _signatures(again)
    assert before.pop(("toy-v2", "torch.Tensor.to.1")) == after.pop(("toy-v2", "torch.to.1"))
    assert before.pop(("toy-v2", "torch.diff.1"))  # not in their op table: left out, and named in a note
    assert after == before
    assert json.loads(rows(again, "SELECT c.inputs FROM model_cases mc JOIN cases c ON c.signature = mc.signature "
                              "WHERE mc.name = 'torch.to.1'")[0]["inputs"])[1] == {"value": "torch.float16"}
    doc = yaml.safe_load((tmp_path / "out" / "toy-v2.yaml").read_text())["test_suite_config"]
    assert doc["global"]["input_config"] == {"seed": 123}
    assert {d["name"]: d.get("precision") for d in doc["global"]["supported_dtypes"]} == {
        "bool": None, "float16": {"atol": 0.01, "rtol": 0.02}, "float32": {"atol": 0.001, "rtol": 0.002},
        "int64": None}  # int32 was torch.diff's, left out
    item = doc["files"][0]["tests"][0]["edits"]["ops"]["include"][1]
    to = next(i for i in doc["files"][0]["tests"][0]["edits"]["ops"]["include"] if i["name"] == "torch.to")
    assert to["sample_inputs_func"]["kwargs"] == {"dtype": "torch.float16"} and to["casedb"]["op"] == "torch.Tensor.to"
    assert item == {"name": "torch.mul", "sample_inputs_func": {"args": [
        {"tensor": {"shape": [4, 3], "stride": [1, 4], "storage_offset": 0, "dtype": "torch.float32",
                    "init": "randn"}}, {"value": 0.5}]},
        "description": "toy.py#L2 in forward, code: x.t() * 0.5", "tags": ["constant", "fp32operation", "torch.mul.1"]}
    modes = yaml.safe_load((tmp_path / "out" / "modes-v2.yaml").read_text())["test_suite_config"]
    assert [t["mode"] for t in modes["files"][0]["tests"]] == ["mandatory_success", "skip", "xfail"]


MIXTRAL = V2 / "mixtral-like.yaml"


def _judged(db) -> Counter:
    """(model, signature, expected error, xfail expr, xfail strict) of every occurrence, counted."""
    out = Counter()
    for r in rows(db, "SELECT model, signature, expects_error, xfail FROM model_cases"):
        xfail = json.loads(r["xfail"] or "null")
        expects = json.loads(r["expects_error"] or "null")
        out[(r["model"], r["signature"], json.dumps(expects, sort_keys=True) if expects else None,
             xfail and xfail["expr"], xfail and xfail.get("strict", True))] += 1
    return out


def _export_and_back(cli, db, tmp_path, models) -> tuple[Path, Path, int]:
    """Each model exported as spyre-v2 into one folder, the folder imported into a fresh DB:
    (the folder, the new DB, the cases left out)."""
    out, left_out = tmp_path / "out", 0
    for model in models:
        r = cli("export", "--model", model, "--format", "spyre-v2", "-o", out / f"{model}.yaml", db=db)
        assert r.exit_code == 0, r.output
        left_out += " ".join(r.stderr.split()).count(": left out: ")
    again = tmp_path / "again.db"
    r = cli("import", out, db=again)
    assert r.exit_code == 0, r.output
    return out, again, left_out


def test_round_trip_keeps_every_signature_and_expectation_of_a_mixture_of_experts(cli, db_path, tmp_path):
    """Issue 44 item 7: an arange with a start (and each other input v2 cannot say) no longer turns
    into another case, and an expected error stays an expected error."""
    assert cli("import", MIXTRAL).exit_code == 0
    out, again, left_out = _export_and_back(cli, db_path, tmp_path, ["mixtral-like"])
    assert left_out == 0
    assert _judged(again) == _judged(db_path) and sum(_judged(again).values()) == 14
    doc = yaml.safe_load((out / "mixtral-like.yaml").read_text())["test_suite_config"]
    modes = {t["mode"]: sorted(i["tags"][-1] for i in t["edits"]["ops"]["include"]) for t in doc["files"][0]["tests"]}
    assert modes["xfail_strict"] == ["torch.histc.1", "torch.topk.1"] and modes["xfail"] == ["torch.topk.2"]
    # their runner builds the values a generator of theirs cannot make from a file; casedb reads the case
    setitem = next(i for t in doc["files"][0]["tests"] for i in t["edits"]["ops"]["include"]
                   if i["name"] == "torch.setitem")
    assert setitem["sample_inputs_func"]["args"][1]["tensor"]["init"] == "file"
    assert setitem["casedb"]["inputs"][1] == {"tensor": {"shape": [8], "init": "arange",
                                                         "init_args": {"start": 7, "step": -1}, "dtype": "int64"}}
    # a fixpoint: the re-imported model exports to the same file, byte for byte
    r = cli("export", "--model", "mixtral-like", "--format", "spyre-v2", "-o", tmp_path / "again" / "mixtral-like.yaml",
            db=again)
    assert r.exit_code == 0 and (tmp_path / "again" / "mixtral-like.yaml").read_text() == \
        (out / "mixtral-like.yaml").read_text()
    histc = rows(again, "SELECT expects_error, xfail FROM model_cases WHERE name = 'torch.histc.1'")[0]
    assert json.loads(histc["expects_error"])["ref"] == {"type": "RuntimeError", "match": "histogram_cpu"}
    assert histc["xfail"] in (None, "null")


@pytest.mark.slow
def test_round_tripped_expected_errors_are_xfailed_not_reference_errors(cli, db_path, tmp_path):
    assert cli("import", MIXTRAL).exit_code == 0
    _, again, _ = _export_and_back(cli, db_path, tmp_path, ["mixtral-like"])
    r = cli("run", "--model", "mixtral-like", "--device", "cpu", "--backend", "eager", "-j", "1", "--no-progress",
            "--json", db=again)
    summary = json.loads(r.stdout)
    assert (summary["executed"], summary["passed"], summary["xfailed"], summary["ref_errors"], summary["failed"],
            summary["errors"]) == (14, 13, 1, 0, 0, 0), r.stdout


def test_an_item_edited_after_export_is_refused_and_the_db_unchanged(cli, db_path, tmp_path):
    assert cli("import", MIXTRAL).exit_code == 0
    out, again, _ = _export_and_back(cli, db_path, tmp_path, ["mixtral-like"])
    before = sha256_of(again)
    text = (out / "mixtral-like.yaml").read_text()
    edited = text.replace("shape: [2, 3, 4]", "shape: [2, 5, 4]", 1)  # the transpose's input, in their form
    assert edited != text
    (out / "mixtral-like.yaml").write_text(edited)
    r = cli("import", out / "mixtral-like.yaml", db=again)
    assert r.exit_code == 2
    assert f"{out / 'mixtral-like.yaml'}:" in r.output
    assert "changed after casedb exported it" in " ".join(r.output.split()) and "delete the item's casedb: key" in \
        " ".join(r.output.split())
    assert sha256_of(again) == before
    # without the record the edited call imports as written
    doc = yaml.safe_load(edited)
    for t in doc["test_suite_config"]["files"][0]["tests"]:
        for i in t["edits"]["ops"]["include"]:
            if i["name"] == "torch.transpose":
                del i["casedb"]
    (out / "mixtral-like.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert cli("import", out / "mixtral-like.yaml", db=again).exit_code == 0


@pytest.mark.slow
def test_round_trip_of_shipped_models_keeps_every_signature(cli, db_path, tmp_path):
    """Two shipped models with every kind of input v2 cannot say (histc's expected errors, aranges
    with a start, 0-d randn, data tensors in a tensor list, their op spellings): every case the
    export writes comes back with its signature."""
    manifests = Path(__file__).parent.parent / "manifests"
    assert cli("import", manifests / "gemma4" / "gemma4-26b-a4b.yaml", manifests / "mistral3" / "ministral3-14b.yaml"
               ).exit_code == 0
    _, again, left_out = _export_and_back(cli, db_path, tmp_path, ["gemma4-26b-a4b", "ministral3-14b"])
    before, after = _judged(db_path), _judged(again)
    assert after <= before and sum(after.values()) == sum(before.values()) - left_out
    assert sum(n for key, n in after.items() if key[2]) == 7  # gemma4's int32 histc calls, expected errors


@pytest.mark.slow
def test_exported_shipped_model_is_a_valid_v2_file(cli, db_path, tmp_path):
    assert cli("import", Path("manifests/granite4h.yaml")).exit_code == 0
    out = tmp_path / "granite4h.yaml"
    r = cli("export", "--model", "granite4h", "--format", "spyre-v2", "-o", out)
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    items = [i for t in doc["test_suite_config"]["files"][0]["tests"] for i in t["edits"]["ops"]["include"]]
    tensors = [a.get("tensor") or t for i in items for a in i["sample_inputs_func"]["args"]
               for t in (a.get("tensor_list") or [None])] + [
        v["tensor"] for i in items for v in (i["sample_inputs_func"].get("kwargs") or {}).values()
        if isinstance(v, dict) and "tensor" in v]
    tensors = [t for t in tensors if t]
    assert all(set(t) <= set(model_ops_v2.TENSOR_KEYS) and "stride" in t and t["dtype"].startswith("torch.")
               for t in tensors)
    tags = [next(t for t in i["tags"] if model_ops_v2.numbered_tag(i["name"], [t])) for i in items]
    left_out = " ".join(r.stderr.split()).count(": left out: ")  # ops their op table lacks (issue 47)
    assert len(tags) == len(set(tags)) == len(items) == 959 - left_out and left_out < 20
    used = {model_ops_v2.variant_dtype(i["sample_inputs_func"]["args"]) for i in items}
    assert used <= {d["name"] for d in doc["test_suite_config"]["global"]["supported_dtypes"]}
    data = cli.json("import", out, "--dry-run", db=tmp_path / "back.db")
    assert data["files"][0]["records"] == len(items) and data["files"][0]["skipped"] == 0


# ----------------------------------------------------------------------------------- v1 regressions

@pytest.mark.slow
def test_v1_dunders_and_tensor_list_spelling_import_and_run(cli, db_path):
    r = cli("import", V2 / "v1-dunders.yaml")
    assert r.exit_code == 0, r.output
    got = cases(db_path)
    assert got["torch.cat.1_spyre"]["inputs"] == [{"tensor_list": [
        {"shape": [2, 3], "dtype": "float16", "init": "rand"}, {"shape": [1, 3], "dtype": "float16", "init": "rand"}]}]
    assert got["torch.__eq__.1"]["op"] == "torch.__eq__"
    r = cli("run", "--model", "v1-dunders", "--device", "cpu", "--backend", "eager", "-j", "1", "--no-progress",
            "--json")
    summary = json.loads(r.stdout)
    assert (summary["executed"], summary["passed"]) == (3, 3), r.stdout


def test_torch_dunders_are_the_tensor_operators_and_nothing_else():
    assert ops.resolve_op("torch.__eq__") is torch.Tensor.__eq__
    assert ops.resolve_op("torch.__and__") is torch.Tensor.__and__
    a = torch.tensor([1, 2, 3])
    assert ops.resolve_op("torch.__eq__")(a, 2).tolist() == [False, True, False]
    for name in ("torch.__reduce_ex__", "torch.__init__", "torch.__setattr__", "torch.__class__", "torch.__dir__"):
        with pytest.raises(ops.UnsafeOpError):
            ops.resolve_op(name)
    with pytest.raises(ops.UnknownOpError):
        ops.resolve_op("torch.__loader__")
