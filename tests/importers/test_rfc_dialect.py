"""Manifests written by the RFC implementation (issue 13, items 1-4): string literals, indexing
the tuple a chunk returns, outputs that are not tensors, and index inputs invalid for the op."""

import json
import math
from pathlib import Path

import pytest
import torch

from casedb.cases import input_specs, spec as casespec, safe_eval, valid_inputs
from casedb.judge.verdict import judge
from casedb.run import execute
from casedb.judge.numerics import Policy
from casedb.store.database import Store
from tests.helpers import rows, sha256_of

DIALECT = Path(__file__).parents[1] / "data" / "rfc_dialect"
INVALID = {
    "torch.scatter_.1": ("rfc-dialect.yaml:142", "inputs[2] (int64 randint in [0, 1000)) must lie in [0, 32): it "
                         "indexes dim 1 (size 32) of inputs[0]; give it init_args {low: 0, high: 32}"),
    "torch.index_copy_.1": ("rfc-dialect.yaml:150", "inputs[2] (int64 randint in [0, 1000)) must lie in [0, 128): it "
                            "indexes dim 0 (size 128) of inputs[0]; give it init_args {low: 0, high: 128}"),
}
OPAQUE = {"torch.amp.autocast_mode._enter_autocast.1", "torch.autocast.1", "torch.no_grad.1", "torch.device.1"}




def stored(db, model, name):
    r = rows(db, "SELECT c.inputs, c.attrs FROM model_cases mc JOIN cases c ON c.signature = mc.signature "
                 "WHERE mc.model = ? AND mc.name = ?", (model, name))[0]
    return json.loads(r["inputs"]), json.loads(r["attrs"])


def normalize(case: dict):
    return casespec.normalize_case(case, {})


# ----------------------------------------------------------------------------- import / check

def test_dialect_imports_with_one_warning_per_invalid_case(cli, db_path):
    result = cli("import", DIALECT / "rfc-dialect.yaml", "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["totals"] == {"records": 25, "occurrences": 25, "new_cases": 25, "duplicates": 0, "skipped": 0,
                                "files": 1}
    assert report["files"][0]["warnings"] == [
        {"where": f"{DIALECT / where}", "case": name, "problem": problem} for name, (where, problem) in INVALID.items()]
    text = cli("import", DIALECT / "rfc-dialect.yaml")  # again: the same warnings, on stderr
    for name, (where, problem) in INVALID.items():
        assert f"warning: {DIALECT / where}: case {name!r}: {problem}" in " ".join(text.stderr.split())


def test_strict_makes_an_invalid_input_an_error_and_leaves_the_db_unchanged(cli, db_path):
    cli("import", DIALECT / "native.yaml")
    before = sha256_of(db_path)
    result = cli("import", "--strict", DIALECT / "rfc-dialect.yaml")
    assert result.exit_code == 2
    where, problem = INVALID["torch.scatter_.1"]
    message = " ".join(result.stderr.split())
    assert (f"{DIALECT / where}: case 'torch.scatter_.1': invalid input: {problem} (without --strict this is a "
            "warning; 1 more in this file)") in message
    assert sha256_of(db_path) == before


def test_check_lists_invalid_cases_of_any_db(cli, db_path):
    cli("import", DIALECT)
    result = cli("check", "--json")
    assert result.exit_code == 1
    found = json.loads(result.stdout)
    sigs = {r["name"]: r["signature"] for r in rows(db_path, "SELECT name, signature FROM model_cases")}
    assert found == [
        {"model": "rfc-dialect", "case": name, "signature": sigs[name], "op": name.rsplit(".", 1)[0],
         "source": str(DIALECT / where), "problems": [problem]} for name, (where, problem) in INVALID.items()]
    text = cli("check")
    assert text.exit_code == 1 and "2 invalid cases" in text.stderr
    assert f"rfc-dialect::torch.scatter_.1: {INVALID['torch.scatter_.1'][1]}" in " ".join(text.stdout.split())
    clean = cli("check", "--model", "rfc-native", "--json")
    assert clean.exit_code == 0 and json.loads(clean.stdout) == []


def test_shipped_manifests_have_no_invalid_cases(cli, db_path):
    manifests = sorted((Path(__file__).parents[2] / "manifests").glob("*.yaml"))
    assert manifests
    report = cli.json("import", *manifests)
    assert [f["warnings"] for f in report["files"]] == [[]] * len(manifests)
    result = cli("check", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == []


# ------------------------------------------------------------------------- 1. string literals

def test_string_literals_are_read_as_the_rfc_loader_reads_them(cli, db_path):
    cli("import", DIALECT / "rfc-dialect.yaml")
    assert stored(db_path, "rfc-dialect", "torch.reshape.1")[0][1] == {"py": "(1, 64, 128, 64)"}
    assert stored(db_path, "rfc-dialect", "torch.zeros.1") == (
        [{"py": "(2, 64)"}], {"device": "cuda:0", "dtype": "torch.float16"})
    assert stored(db_path, "rfc-dialect", "torch.zeros.2") == ([{"value": [3, 64]}], {"dtype": "torch.float16"})
    assert stored(db_path, "rfc-dialect", "torch.clamp.1")[1] == {"min": None, "max": math.inf}
    assert stored(db_path, "rfc-dialect", "torch.clamp.2")[0][1:] == [{"value": -math.inf}, {"value": 0.5}]
    assert stored(db_path, "rfc-dialect", "torch.mean.1")[1:] == ({"keepdim": True},)
    assert stored(db_path, "rfc-dialect", "torch.mean.1")[0][1] == {"value": -1}
    # strings that are not literals stay strings
    assert stored(db_path, "rfc-dialect", "torch.nn.functional.gelu.1")[1] == {"approximate": "tanh"}
    assert stored(db_path, "rfc-dialect", "torch.to.1")[0][1] == {"value": "cuda:0"}
    assert stored(db_path, "rfc-dialect", "torch.to.2")[0][1] == {"value": "torch.bfloat16"}
    assert stored(db_path, "rfc-dialect", "torch.getitem.2")[0][1] == {"py": "(Ellipsis, None)"}


def test_native_spellings_keep_their_form_and_share_the_dialects_signatures(cli, db_path):
    report = cli.json("import", DIALECT / "rfc-dialect.yaml", DIALECT / "native.yaml")
    assert report["files"][1]["duplicates"] == report["files"][1]["occurrences"] == 8
    sig = {(r["model"], r["name"]): r["signature"]
           for r in rows(db_path, "SELECT model, name, signature FROM model_cases")}
    native = [name for model, name in sig if model == "rfc-native"]
    assert len(native) == 8
    assert {n: sig["rfc-native", n] for n in native} == {n: sig["rfc-dialect", n] for n in native}
    # native values are stored as written (so manifests that spell them natively keep their keys)
    assert stored(db_path, "rfc-native", "torch.zeros.2")[0] == [{"value": [3, 64]}]
    assert stored(db_path, "rfc-native", "torch.clamp.1")[1] == {"min": None, "max": math.inf}


@pytest.mark.parametrize("text, expected", [
    ("(1, 64)", (1, 64)), ("None", None), ("True", True), ("-1", -1), ("1e-5", 1e-5), ("-inf", -math.inf),
    ("[1, None]", [1, None]), ("'mean'", "mean"), ("(Ellipsis, slice(None, 2, None))", (Ellipsis, slice(None, 2))),
    ("mean", "mean"), ("cuda:0", "cuda:0"), ("tanh", "tanh"), ("torch.bfloat16", "torch.bfloat16"), ("", ""),
    ("__import__('os').system('touch CASEDB_PWNED')", "__import__('os').system('touch CASEDB_PWNED')"),
    ("open('x')", "open('x')"),
])
def test_literal_string(text, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert input_specs.literal_string(text) == expected
    assert not (tmp_path / "CASEDB_PWNED").exists()


def test_py_literals_know_torch_dtypes_as_values():
    assert safe_eval.parse_py_literal("(torch.half, None)") == (torch.float16, None)
    assert safe_eval.canonical_py("[torch.bf16, torch.channels_last, torch.strided]") == \
        "[torch.bfloat16, torch.channels_last, torch.strided]"
    for text in ("torch.add", "torch._C", "torch.nn.functional", "torch.float99"):
        with pytest.raises(safe_eval.UnsafeExpression):
            safe_eval.parse_py_literal(text)
    case = normalize({"op": "torch.Tensor.to", "inputs": [{"tensor": {"shape": [2]}}, {"value": "(torch.float16,)"}]})
    assert case.inputs[1] == {"py": "(torch.float16,)"}


def test_export_reimport_keeps_the_signatures(cli, db_path, tmp_path):
    (tmp_path / "quoted.yaml").write_text("""
model: quoted
cases:
  - name: gelu_quoted
    op: torch.nn.functional.gelu
    inputs: [{tensor: {shape: [2, 64]}}]
    kwmap: {approximate: "'None'"}
  - name: full_quoted
    op: torch.full
    inputs: [{value: "(2, 3)"}, {value: "'1'"}]
""")
    cli("import", DIALECT, tmp_path / "quoted.yaml")
    assert stored(db_path, "quoted", "gelu_quoted")[1] == {"approximate": "None"}  # a string, not None
    assert stored(db_path, "quoted", "full_quoted")[0] == [{"py": "(2, 3)"}, {"value": "1"}]
    fresh = tmp_path / "fresh.db"
    for model in ("rfc-dialect", "rfc-native", "quoted"):
        out = tmp_path / "out" / f"{model}.yaml"
        assert cli("export", "--model", model, "-o", out).exit_code == 0
        assert cli("import", out, db=fresh).exit_code == 0
    q = "SELECT model, name, signature FROM model_cases ORDER BY model, name"
    assert rows(fresh, q) == rows(db_path, q)
    q = "SELECT signature, op, inputs, attrs, marks FROM cases ORDER BY signature"
    assert rows(fresh, q) == rows(db_path, q)


# ------------------------------------------------------------- running the dialect on the CPU

def _run_all(db_path, model):
    """Every occurrence of `model` through the execution core: {name: (verdict, comparison)}."""
    out = {}
    with Store(db_path) as store:
        for r in store.occurrences([model], markexpr=""):
            case = {k: r[k] for k in ("op", "inputs", "attrs", "signature", "seed", "dtype")}
            ex = execute.run_case(case, device="cpu", backend="eager", load_blob=store.load_blob)
            occ = {**r, "defaults": store.models_defaults(r["model"])}
            tolerances = {d: (t.rtol, t.atol) for d, t in Policy().tolerances(occ, case, ex.dtypes()).items()}
            verdict = judge(ex, tolerances=tolerances, expects_error=r["expects_error"])
            out[r["name"]] = (verdict, ex.comparison(tolerances=tolerances))
    return out


def test_dialect_runs_eager_on_cpu_with_reference_errors_only_for_invalid_cases(cli, db_path):
    cli("import", DIALECT / "rfc-dialect.yaml")
    with Store(db_path) as store:
        from casedb.ingest import check

        invalid = {r["case"] for r in check.check_store(store)}
    results = _run_all(db_path, "rfc-dialect")
    assert len(results) == 25 and invalid == set(INVALID)
    outcomes = {name: v.outcome for name, (v, _) in results.items()}
    assert {n for n, o in outcomes.items() if o == "ref_error"} == invalid
    assert {n for n, o in outcomes.items() if o != "ref_error"} == set(results) - invalid
    # opaque outputs prove nothing: never passed, never failed
    assert {n for n, o in outcomes.items() if o == "not_exercised"} == OPAQUE
    assert set(outcomes.values()) == {"passed", "ref_error", "not_exercised"}
    assert "index 887 is out of bounds for dimension 1 with size 32" in results["torch.scatter_.1"][0].reason
    not_comparable = {n for n, (_, c) in results.items() if c is not None and not c.comparable}
    assert not_comparable == OPAQUE
    assert results["torch.no_grad.1"][0].reason == (
        "not comparable: output (a torch.autograd.grad_mode.no_grad, which has no value equality); "
        "only their types were checked (they match)")
    assert not torch.is_autocast_enabled("cpu")  # the core left the autocast regions the ops entered


# ---------------------------------------------------------------- 2. indexing a tensor list

@pytest.mark.parametrize("index, expect", [
    ({"value": 0}, lambda xs: xs[0]), ({"value": "1"}, lambda xs: xs[1]), ({"value": -1}, lambda xs: xs[-1]),
    ({"py": "slice(0, 2, None)"}, lambda xs: xs[0:2]),
])
@pytest.mark.parametrize("op", ["torch.getitem", "operator.getitem", "operator.__getitem__"])
def test_getitem_indexes_the_sequence(op, index, expect):
    from casedb.cases.materialize import prepare

    chunks = {"tensor_list": [{"shape": [1, 4, 3, 2], "dtype": "bf16"} for _ in range(3)]}
    n = normalize({"op": op, "inputs": [chunks, index]})
    case = {"op": n.op, "inputs": n.inputs, "attrs": n.attrs, "signature": n.signature, "seed": n.seed}
    ex = execute.run_case(case, device="cpu", backend="eager")
    assert ex.ref_error is None and ex.target_error is None
    args, _ = prepare(case).place("cpu")
    want = expect(args[0])
    got = ex.reference["output"]
    if isinstance(want, list):
        assert [t.tolist() for t in got] == [t.tolist() for t in want]
    else:
        assert torch.equal(got, want)
    assert judge(ex, rtol=0, atol=0).outcome == "passed"


# --------------------------------------------------------------- 4. the invalid-input checker

def _problems(inputs, op="torch.getitem", attrs=None):
    n = normalize({"op": op, "inputs": inputs, "attrs": attrs or {}})
    return valid_inputs.problems({"op": n.op, "inputs": n.inputs, "attrs": n.attrs})


X = {"tensor": {"shape": [4, 32], "dtype": "fp16"}}


def _index(shape, **init):
    return {"tensor": {"shape": shape, "dtype": "int64", **init}}


def test_problems_reads_each_init_against_the_indexed_dim():
    assert _problems([X, _index([3], init="randint", init_args={"low": -4, "high": 4})]) == []  # negatives index too
    assert _problems([X, _index([3], init="randint", init_args={"low": -5, "high": 4})]) == [
        "inputs[1] (int64 randint in [-5, 4)) must lie in [-4, 4): it indexes dim 0 (size 4) of inputs[0]; "
        "give it init_args {low: 0, high: 4}"]
    # gather takes no negative index; the default integer init is randint [0, 10)
    assert _problems([X, {"value": 0}, _index([4, 32])], op="torch.gather") == [
        "inputs[2] (int64 randint in [0, 10)) must lie in [0, 4): it indexes dim 0 (size 4) of inputs[0]; "
        "give it init_args {low: 0, high: 4}"]
    assert _problems([X, {"value": 1}, _index([4, 32], init="arange")], op="torch.gather") == [
        "inputs[2] (int64 arange 0..127) must lie in [0, 32): it indexes dim 1 (size 32) of inputs[0]; "
        "give it init_args {low: 0, high: 32}"]
    assert _problems([X, {"value": 1}, _index([4, 8], init="ones")], op="torch.gather") == []
    assert _problems([X, {"value": 1}, _index([2], init="data", data=[31, 200])], op="torch.Tensor.index_fill_",
                     ) == []  # the model's own values are not second-guessed
    assert _problems([X, _index([0], init="randint", init_args={"high": 100})]) == []  # no values at all
    assert _problems([X, {"value": "1"}, _index([4, 8], init="randint", init_args={"high": 33})],
                     op="torch.scatter_") != []  # the RFC spellings (torch.scatter_, "1") reach the rule


def test_problems_is_pure():
    n = normalize({"op": "torch.histc", "inputs": [_index([8])]})
    case = {"op": n.op, "inputs": n.inputs, "attrs": n.attrs}
    before = json.dumps(case, sort_keys=True)
    assert valid_inputs.problems(case) == []
    assert json.dumps(case, sort_keys=True) == before and "expects_error" not in case
