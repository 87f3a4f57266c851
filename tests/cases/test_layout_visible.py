"""Issue 43 item 1: a tensor input's layout (contiguous, strided, transposed, offset, broadcast)
is worked out from its stored spec and shown wherever inputs are."""

import pytest
import torch

from casedb.cases import presets
from casedb.cases.layout import input_label, tensor_layout


def _spec(shape, preset=None, dtype="float32", **args):
    spec = {"shape": shape, "dtype": dtype, "init": "randn"}
    if preset:
        spec.update(preset=preset, preset_args=args)
    return spec


@pytest.mark.parametrize("spec, word", [
    (_spec([1, 100, 128, 64]), "contiguous"),
    (_spec([4, 8], "noncontig_slice"), "strided"),
    (_spec([4, 8], "noncontig_slice", dim=0, step=3), "strided"),
    (_spec([4, 8], "noncontig_slice", step=1), "contiguous"),
    (_spec([4, 8], "transpose_view"), "transposed"),
    (_spec([2, 4, 8], "transpose_view", dim0=-1, dim1=-2), "transposed"),
    (_spec([1, 8], "transpose_view"), "contiguous"),  # a size-1 dimension's stride means nothing
    (_spec([4, 8], "strided", stride=[8, 1]), "contiguous"),
    (_spec([4, 8], "strided", stride=[8, 1], storage_offset=5), "offset"),
    (_spec([4, 8], "strided", stride=[0, 1]), "broadcast"),
    (_spec([4, 8], "strided", stride=[1, 4]), "transposed"),
    (_spec([4, 8], "strided", stride=[16, 1]), "strided"),
    (_spec([2, 3, 4], "strided", stride=[12, 1, 3], storage_offset=2), "transposed"),
    (_spec([0, 8], "strided", stride=[0, 1]), "contiguous"),
    (_spec([], "strided", stride=[]), "contiguous"),
])
def test_layout_word(spec, word):
    assert tensor_layout(spec) == word


@pytest.mark.parametrize("spec", [
    _spec([4, 8], "noncontig_slice"), _spec([3, 5, 7], "noncontig_slice", dim=1, step=4),
    _spec([4, 8], "transpose_view"), _spec([2, 4, 8], "transpose_view", dim0=0, dim1=2),
    _spec([4, 8], "strided", stride=[0, 1]), _spec([4, 8], "strided", stride=[8, 1], storage_offset=3),
    _spec([5], "noncontig_slice", step=2),
])
def test_layout_agrees_with_the_tensor_the_preset_builds(spec):
    # the word is computed without torch; the tensor the run builds must read the same way
    args = spec.get("preset_args") or {}
    t = presets.PRESETS[spec["preset"]].fn(torch.randn(spec["shape"]), **args)
    word = tensor_layout(spec)
    assert (word in ("contiguous", "offset")) == t.is_contiguous()
    assert (word == "broadcast") == (0 in t.stride())
    assert (word == "offset") == (t.storage_offset() > 0)
    assert presets.layout(spec) == (list(t.stride()), t.storage_offset())


def test_input_label_spells_dtype_and_shape_as_listings_do():
    assert input_label(_spec([1, 11, 2880], dtype="bfloat16")) == "bf16[1, 11, 2880]"
    assert input_label(_spec([1, 100, 128, 64], "strided", stride=[819200, 64, 6400, 1])) == \
        "fp32[1, 100, 128, 64] transposed"
    assert input_label(_spec([4, 8], "noncontig_slice")) == "fp32[4, 8] strided"
    assert input_label(_spec([4, 8], "strided", stride=[0, 1])) == "fp32[4, 8] broadcast"


# ------------------------------------------------------------------ shown wherever inputs are

import json  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

LAYOUTS = """\
model: lay
default: {dtype: fp32}
cases:
  - name: add_plain
    op: torch.add
    inputs:
      - tensor: {shape: [4, 8]}
      - tensor: {shape: [4, 8]}
  - name: add_transposed
    op: torch.add
    inputs:
      - tensor: {shape: [4, 8], preset: transpose_view}
      - tensor: {shape: [4, 8]}
  - name: mul_broadcast
    op: torch.mul
    inputs:
      - tensor: {shape: [4, 8], preset: strided, preset_args: {stride: [0, 1]}}
      - tensor: {shape: [4, 8]}
  - name: neg_sliced
    op: torch.neg
    inputs:
      - tensor: {shape: [4, 8], preset: noncontig_slice}
"""
# a backend that reads non-contiguous inputs wrong (what issue 43's user wrote): +1 on every output
FAULTY = """\
import torch


def _compile(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        if any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in args):
            return type(out)(y + 1 for y in out) if isinstance(out, (tuple, list)) else out + 1
        return out

    return run


try:
    torch._dynamo.register_backend(_compile, name="casedb_test_layout")
except Exception:  # registered by an earlier import of this file
    pass
"""


@pytest.fixture
def lay(cli, tmp_path):
    (tmp_path / "lay.yaml").write_text(LAYOUTS)
    assert cli("import", tmp_path / "lay.yaml").exit_code == 0
    return cli


def test_cases_and_show_give_each_input_its_layout(lay):
    listed = {ln.split("\t")[1]: ln.split("\t")[3] for ln in lay("cases").stdout.splitlines()[1:]}
    assert listed == {"add_plain": "fp32[4, 8], fp32[4, 8]", "add_transposed": "fp32[4, 8] transposed, fp32[4, 8]",
                      "mul_broadcast": "fp32[4, 8] broadcast, fp32[4, 8]", "neg_sliced": "fp32[4, 8] strided"}
    rows = {r["name"]: r for r in lay.json("cases")}
    assert [d["layout"] for d in rows["mul_broadcast"]["layouts"]] == ["broadcast", "contiguous"]
    assert rows["add_transposed"]["layouts"][0] == {"input": "inputs[0]", "label": "fp32[4, 8] transposed",
                                                    "layout": "transposed"}
    assert "noncontiguous" in rows["neg_sliced"]["marks"] and "noncontiguous" not in rows["add_plain"]["marks"]
    shown = lay("show", "lay::add_transposed")
    assert "fp32[4, 8] transposed, fp32[4, 8]" in shown.stdout
    assert lay.json("show", "lay::neg_sliced")["layouts"][0]["layout"] == "strided"


def test_layout_marks_select_and_a_derived_mark_no_case_has_says_so(lay):
    def names(*args):
        return sorted(r["name"] for r in lay.json("cases", *args))

    assert names("-m", "noncontiguous") == ["add_transposed", "mul_broadcast", "neg_sliced"]
    assert names("-m", "broadcast") == ["mul_broadcast"]
    assert names("-m", "transposed or broadcast") == ["add_transposed", "mul_broadcast"]
    assert names("-m", "not noncontiguous") == ["add_plain"]
    assert names("-m", "not offset") == ["add_plain", "add_transposed", "mul_broadcast", "neg_sliced"]
    none = lay("cases", "-m", "offset")
    assert none.exit_code == 2
    assert "-m 'offset' selects no case: no case here has the derived mark 'offset'" in " ".join(none.stderr.split())
    unknown = lay("cases", "-m", "noncontigous")  # a typo keeps the unknown-mark error, with its hint
    assert unknown.exit_code == 2 and "no case or model has the mark 'noncontigous'" in unknown.stderr
    ran = lay("run", "-m", "offset", "--device", "cpu", "--backend", "eager", "-j", "0", "--no-progress")
    assert ran.exit_code == 2 and "no case here has the derived mark 'offset'" in " ".join(ran.stderr.split())


def test_datasette_facets_the_cases_by_layout(lay, db_path):
    import casedb.read

    meta = yaml.safe_load((Path(casedb.read.__file__).parent / "datasette_metadata.yaml").read_text())
    assert "layout" in meta["databases"]["casedb"]["tables"]["cases"]["facets"]
    with sqlite3.connect(db_path) as conn:
        got = dict(conn.execute("SELECT layout, count(*) FROM cases GROUP BY layout"))
    assert got == {"contiguous": 1, "transposed": 1, "broadcast": 1, "strided": 1}


@pytest.mark.slow
def test_failures_the_report_and_the_repro_name_the_layout(lay, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layout_backend.py").write_text(FAULTY)
    monkeypatch.delitem(sys.modules, "casedb_import_layout_backend", raising=False)
    ran = lay("run", "--model", "lay", "--device", "cpu", "-j", "0", "--no-progress", "--no-shipped-triage",
              "--backend", "casedb_test_layout", "--import", tmp_path / "layout_backend.py", "--json")
    summary = json.loads(ran.stdout)
    assert ran.exit_code == 1 and summary["failed"] == 3
    inputs = sorted(i for g in summary["failures"] for i in g["example_inputs"])
    assert inputs == ["fp32[4, 8] broadcast, fp32[4, 8]", "fp32[4, 8] strided", "fp32[4, 8] transposed, fp32[4, 8]"]
    report = lay("report", "--run", str(summary["run_id"]), "--json")
    rows = json.loads(report.stdout)["failures"]
    assert sorted(r["inputs"] for r in rows) == inputs
    script = lay("repro", "lay::add_transposed", "--run", str(summary["run_id"])).stdout
    assert script.splitlines()[1].startswith("# case: torch.add(fp32[4, 8] transposed, fp32[4, 8]) computing in float32")


def test_an_existing_db_gets_layouts_and_marks_by_migration_signatures_unchanged(lay, db_path, tmp_path):
    # a DB as casedb stored it before m170: no cases.layout, shapes without layout words, no layout marks
    import sqlite_utils

    from casedb.store.database import Store
    from casedb.store.migrations import migrations

    old_path = tmp_path / "old.db"
    old = sqlite_utils.Database(old_path)
    migrations.apply(old, stop_before="m170_layout_marks")
    with sqlite3.connect(db_path) as conn:
        conn.row_factory = sqlite3.Row
        now = {r["signature"]: dict(r) for r in conn.execute("SELECT * FROM cases")}
    for r in now.values():
        stripped = {**r, "shapes": r["shapes"].replace(" transposed", "").replace(" broadcast", "").replace(
            " strided", ""), "marks": json.dumps([m for m in json.loads(r["marks"]) if m not in (
                "noncontiguous", "transposed", "broadcast", "offset")])}
        del stripped["layout"], stripped["identity"]  # columns of later migrations (m202: call identities)
        old["cases"].insert(stripped)
    old.close()
    with Store(old_path):
        pass
    with sqlite3.connect(old_path) as conn:
        conn.row_factory = sqlite3.Row
        migrated = {r["signature"]: dict(r) for r in conn.execute("SELECT * FROM cases")}
    assert migrated == now
