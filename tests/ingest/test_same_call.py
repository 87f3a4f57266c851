"""Issue 44 item 4: one canonical op identity whatever the front end. The same call from a scan
(``torch.nn.functional.linear``), a Kineto trace and an Execution Trace (``aten::linear``) is one
case; ``casedb scan --compare`` reads a trace and does not report the same work spelt otherwise
(``aten::slice`` for ``getitem``) as missing.

Fixtures: tests/data/frontends/ (one forward of a small module through every front end, written by
make_frontends.py there)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from casedb.scan import compare

DATA = Path(__file__).parents[1] / "data" / "frontends"
SCAN, KINETO, ET = DATA / "block.scan.jsonl", DATA / "block.kineto.json", DATA / "block.et.json"
# calls the module makes that every front end records with the same arguments
SAME = {"linear", "mul", "matmul", "softmax", "transpose"}


def _import(cli, path, *args):
    res = cli("import", "--json", *args, path)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["files"][0]


def _cases(db_path) -> dict[str, dict]:
    """signature -> {op, models} of every stored case."""
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("""SELECT c.signature, c.op, group_concat(mc.model, ',') FROM cases c
                               JOIN model_cases mc ON mc.signature = c.signature GROUP BY c.signature""").fetchall()
    return {sig: {"op": op, "models": set(models.split(","))} for sig, op, models in rows}


def _by_operator(cases: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for case in cases.values():
        short = case["op"].replace("torch.ops.aten.", "").split(".")[0] if case["op"].startswith("torch.ops.") \
            else case["op"].rsplit(".", 1)[1]
        out.setdefault(short, []).append(case)
    return out


def test_the_same_call_from_a_scan_a_kineto_trace_and_an_et_trace_is_one_case(cli, db_path):
    scan = _import(cli, SCAN)
    kineto = _import(cli, KINETO, "--model", "block-kineto")
    et = _import(cli, ET, "--model", "block-et", "--format", "et")
    by_op = _by_operator(_cases(db_path))
    for op in SAME:
        assert [c["models"] for c in by_op[op]] == [{"block", "block-kineto", "block-et"}], op
        # the first spelling stays the case's (the scan came first)
        assert not by_op[op][0]["op"].startswith("torch.ops."), by_op[op]
    assert (scan["new_cases"], kineto["linked"], et["linked"]) == (10, 5, 7)
    assert kineto["duplicates"] == 5 and et["new_cases"] == 0
    # a second import of a trace finds its calls where the first left them
    before = _cases(db_path)
    again = _import(cli, KINETO, "--model", "block-kineto")
    assert _cases(db_path) == before and (again["new_cases"], again["linked"]) == (0, 5)


def test_traces_first_keep_the_trace_spelling_and_the_scan_joins_it(cli, db_path):
    _import(cli, ET, "--model", "block-et", "--format", "et")
    scan = _import(cli, SCAN)
    by_op = _by_operator(_cases(db_path))
    assert by_op["linear"] == [{"op": "torch.ops.aten.linear.default", "models": {"block", "block-et"}}]
    assert scan["linked"] == 7
    # the occurrence keeps the scan's own name; the case its first spelling
    res = cli("cases", "--json", "--model", "block")
    linear = next(r for r in json.loads(res.stdout) if r["name"].startswith("linear_"))
    assert linear["op"] == "torch.ops.aten.linear.default"


@pytest.mark.parametrize("torch_call,aten_call", [
    (("torch.nn.functional.linear", ["x", "w", None], {}), ("torch.ops.aten.linear.default", ["x", "w", None], {})),
    (("torch.Tensor.to", ["x", "torch.float32"], {}),
     ("torch.ops.aten.to.dtype", ["x", "torch.float32", False, False, None], {})),
    (("torch.Tensor.mul", ["x", 2], {}), ("torch.ops.aten.mul.Scalar", ["x", 2], {})),
    (("torch.Tensor.add", ["x", "y"], {}), ("torch.ops.aten.add.Tensor", ["x", "y"], {"alpha": 1})),
    (("torch.Tensor.mean", ["x", -1], {"keepdim": True}), ("torch.ops.aten.mean.dim", ["x", [-1], True], {"dtype": None})),
    (("torch.nn.functional.dropout", ["x"], {"p": 0.1, "training": False, "inplace": False}),
     ("torch.ops.aten.dropout.default", ["x", 0.1, False], {})),
    (("torch.nn.functional.embedding", ["ids", "w"], {"padding_idx": None, "max_norm": None, "norm_type": 2.0}),
     ("torch.ops.aten.embedding.default", ["w", "ids", -1, False, False], {})),
    (("torch.Tensor.view", ["x", 2, 8], {}), ("torch.ops.aten.view.default", ["x", [2, 8]], {})),
    (("torch.arange", [16], {"dtype": "torch.int64", "device": "cpu"}),
     ("torch.ops.aten.arange.default", [16], {"dtype": "torch.int64", "layout": None, "device": "cpu",
                                              "pin_memory": False})),
])
def test_a_torch_call_and_its_aten_call_have_one_identity(torch_call, aten_call):
    assert _identity(*torch_call) == _identity(*aten_call)


@pytest.mark.parametrize("one,other", [
    (("torch.Tensor.mul", ["x", 2], {}), ("torch.ops.aten.mul.Scalar", ["x", 3], {})),          # another value
    (("torch.Tensor.add", ["x", "y"], {}), ("torch.ops.aten.add.Tensor", ["x", "y"], {"alpha": 2})),
    (("torch.Tensor.to", ["x", "torch.float32"], {}), ("torch.ops.aten.to.dtype", ["x", "torch.float16"], {})),
    (("torch.nn.functional.embedding", ["ids", "w"], {"max_norm": 1.0}),                        # renormalises
     ("torch.ops.aten.embedding.default", ["w", "ids"], {})),
    (("torch.getitem", ["x", slice(1, 3)], {}), ("torch.ops.aten.slice.Tensor", ["x", 0, 1, 3, 1], {})),
    (("torch.Tensor.mul", ["x", "y"], {}), ("torch.Tensor.__rmul__", ["x", "y"], {})),          # the operands swapped
])
def test_different_calls_keep_different_identities(one, other):
    assert _identity(*one) != _identity(*other)


_ITEMS = {"x": {"tensor": {"shape": [4, 16], "dtype": "float32", "init": "randn"}},
          "y": {"tensor": {"shape": [4, 16], "dtype": "float32", "init": "randn"}},
          "w": {"tensor": {"shape": [32, 16], "dtype": "float32", "init": "randn"}},
          "ids": {"tensor": {"shape": [2, 3], "dtype": "int64", "init": "randint",
                             "init_args": {"low": 0, "high": 32}}}}


def _item(v):
    if isinstance(v, str) and v in _ITEMS:
        return _ITEMS[v]
    if isinstance(v, slice):
        return {"py": f"slice({v.start}, {v.stop}, {v.step})"}
    return {"value": v}


def _identity(op, inputs, attrs):
    from casedb.cases import call_identity

    return call_identity.identity(op, [_item(v) for v in inputs],
                                  {k: (_ITEMS[v] if isinstance(v, str) and v in _ITEMS else v) for k, v in attrs.items()},
                                  None)


def test_an_existing_db_gets_identities_by_migration_signatures_unchanged(cli, db_path, tmp_path):
    from casedb.store.database import Store
    from casedb.store.migrations import migrations

    _import(cli, SCAN)
    with sqlite3.connect(db_path) as conn:
        conn.row_factory = sqlite3.Row
        now = {r["signature"]: dict(r) for r in conn.execute("SELECT * FROM cases")}
    old_path = tmp_path / "old.db"
    old = sqlite_utils.Database(old_path)
    migrations.apply(old, stop_before="m202_opid44")
    for r in now.values():
        old["cases"].insert({k: v for k, v in r.items() if k != "identity"})
    old.close()
    with Store(old_path):
        pass
    with sqlite3.connect(old_path) as conn:
        conn.row_factory = sqlite3.Row
        assert {r["signature"]: dict(r) for r in conn.execute("SELECT * FROM cases")} == now
    assert all(r["identity"] for r in now.values())


# ------------------------------------------------------------------------------ scan --compare

def _scan_ops() -> list[str]:
    lines = SCAN.read_text().splitlines()[1:]
    return [json.loads(line)["case"]["op"] for line in lines]


@pytest.mark.parametrize("trace,fmt", [(KINETO, "kineto"), (ET, "et")])
def test_compare_reads_a_kineto_or_et_trace(trace, fmt):
    theirs = compare.read_ops(trace)
    assert "torch.ops.aten.linear.default" in theirs and "torch.ops.aten.slice.Tensor" in theirs


@pytest.mark.parametrize("trace", [KINETO, ET])
def test_compare_does_not_report_the_same_work_spelt_otherwise_as_missing(trace):
    got = compare.compare(set(_scan_ops()), compare.read_ops(trace))
    missing = {compare.op_key(op) for op in got["missing"]}
    assert not missing & {"slice", "select", "index_put_", "fill_", "lift_fresh", "linear", "mul", "softmax"}, got
    # the scan's getitem, setitem and torch.tensor are the trace's slice/select, fill_ and lift_fresh
    assert not {"torch.getitem", "torch.setitem", "torch.tensor"} & set(got["extra"]), got


def test_compare_after_a_yaml_detour_counts_index_put_slice_and_lift_fresh(tmp_path):
    exported = tmp_path / "trace.yaml"
    exported.write_text("model: t\ncases:\n" + "".join(
        f"  - {{op: {op}, inputs: []}}\n" for op in ("torch.ops.aten.index_put_.default", "torch.ops.aten.slice.Tensor",
                                                    "torch.ops.aten.lift_fresh.default", "torch.ops.aten.linear.default")))
    got = compare.compare({"torch.setitem", "torch.getitem", "torch.tensor", "torch.nn.functional.linear"},
                          compare.read_ops(exported))
    assert (got["missing"], got["extra"], got["coverage"]) == ([], [], 100.0)


def test_cli_scan_compare_accepts_a_trace(cli, tmp_path):
    import yaml

    recipe = tmp_path / "tiny-bert.yaml"
    recipe.write_text(yaml.safe_dump({"model": "tiny-bert", "config": str(DATA.parent / "scan" / "tiny-bert.json"),
                                      "arch": "BertForMaskedLM", "defaults": {"dtype": "fp32", "seed": 0},
                                      "inputs": {"batch": 2, "seq_len": 8}}))
    res = cli("scan", recipe, "--compare", KINETO, "-o", tmp_path / "s.jsonl", "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["compare"]
    assert "torch.ops.aten.linear.default" not in got["missing"] and got["matched"] >= 4, got


# ------------------------------------------------------------------------- version manifests

def test_a_version_manifest_leaves_out_calls_shipped_under_another_layout(tmp_path):
    """``scan --new-cases``: linear(x, w, None) of a newer transformers is the shipped linear(x, w)."""
    from casedb.scan.versions import write_version_manifest

    root = tmp_path / "manifests"
    root.mkdir()
    (root / "toy.yaml").write_text("model: toy\ndefault: {dtype: fp32}\ncases:\n"
                                   "  - {op: torch.nn.functional.linear, inputs: [{tensor: {shape: [4, 16]}}, "
                                   "{tensor: {shape: [8, 16]}}]}\n")
    scan = tmp_path / "toy.jsonl"
    header = {"casedb_scan": 1, "model": "toy", "level": "torch", "phase": "prefill", "transformers": "9.9",
              "torch": "2.13", "defaults": {"dtype": "fp32"}}
    calls = [("torch.nn.functional.linear", [[4, 16], [8, 16]], [{"value": None}]),  # the shipped call
             ("torch.Tensor.mul", [[4, 8], [4, 8]], [])]                                # a new one
    scan.write_text("\n".join([json.dumps(header)] + [json.dumps(
        {"type": "case", "model": "toy", "where": f"toy.py:{i}", "count": 1,
         "case": {"op": op, "inputs": [{"tensor": {"shape": s}} for s in shapes] + extra}})
        for i, (op, shapes, extra) in enumerate(calls)]) + "\n")
    got = write_version_manifest(scan, tmp_path / "toy@transformers-9.9.yaml", root)
    assert (got["scanned"], got["new"], got["already_shipped"]) == (2, 1, 1)
