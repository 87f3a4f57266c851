"""casedb mutants: faulty backends (casedb.mutation.mutants), each caught on a case made for it; the control clean."""

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from tests.helpers import import_manifests

# One case per bug class, float32 (a 0.1 % or 16-ULP error is far outside float32's tolerance).
# Which mutant changes which case follows from the mutants' rules (see EXPECTED).
TINY = """\
model: tiny
default: {dtype: fp32}
cases:
  - name: add_bcast        # [100] broadcast over 4 rows; last dim 100 is not a multiple of 64
    op: torch.add
    inputs:
      - tensor: {shape: [4, 100]}
      - tensor: {shape: [100]}
  - name: sum_rows         # a reduction over 4096 elements
    op: torch.sum
    inputs:
      - tensor: {shape: [8, 4096]}
      - value: -1
  - name: emb              # integer indices
    op: torch.nn.functional.embedding
    inputs:
      - tensor: {shape: [2, 7], dtype: int64, init: randint, init_args: {low: 0, high: 50}}
      - tensor: {shape: [50, 8]}
  - name: add_inplace      # writes into its first input
    op: torch.Tensor.add_
    inputs:
      - tensor: {shape: [8, 100]}
      - tensor: {shape: [8, 100]}
  - name: transposed       # a non-contiguous input
    op: torch.mul
    inputs:
      - tensor: {shape: [8, 128], preset: transpose_view}
      - tensor: {shape: [8, 128]}
  - name: big              # 64 Ki elements: tiled over cores
    op: torch.mul
    inputs:
      - tensor: {shape: [256, 256]}
      - tensor: {shape: [256, 256]}
  - name: log_nan          # log of negative numbers: NaN in the output
    op: torch.log
    inputs:
      - tensor: {shape: [64]}
"""

ALL = {"add_bcast", "sum_rows", "emb", "add_inplace", "transposed", "big", "log_nan"}
EXPECTED = {  # mutant -> the cases whose result it changes
    "padding": {"add_bcast", "sum_rows", "emb", "add_inplace"},   # last dim 100, 8 (sum: [8]), 8, 100
    "large_tensor": {"big"},
    "broadcast": {"add_bcast"},
    "noncontiguous": {"transposed"},
    "inplace_lost": {"add_inplace"},
    "lost_sign": ALL,
    "nan_inf": {"log_nan"},
    "low_precision_acc": {"sum_rows"},
    "fp32_as_bf16": ALL,
    # sum_rows: 16 ULPs of a result whose 4,096 terms cancel are within that sum's precision (the
    # CPU's own float32 sum is up to 5.7 ULPs off; casedb.judge.accumulation): within precision
    "ulp_error": ALL - {"sum_rows"},
    "rel_error": ALL,
    "zeros": ALL,
    "index_off_by_one": {"emb"},
    # computed in float64, truncated into float32: within a ULP, caught by the bias judge where the
    # mean has 64 elements or more (log_nan: 32 finite; emb: exact, unchanged); sum_rows (8 elements):
    # more exact than the CPU's float32 sum, within precision at its terms' magnitude
    "truncation": {"add_bcast", "transposed", "big"},
    "softmax_overflow": set(),   # no softmax here (tests/cases/test_value_ranges.py has one)
}

USER_MUTANTS = '''\
from casedb.mutation.mutants import mutant


@mutant("halved", kind="output")
def halved(y):
    """Floating outputs halved: a scale applied twice."""
    return y / 2 if y.is_floating_point() else y


@mutant("nudged", kind="output")
def nudged(y):
    """One part in 2**23 added: below what float32 can be judged at."""
    return y + y * 2**-23 if y.is_floating_point() else y
'''


def invoke(db, *args):
    from casedb.cli import app

    return CliRunner().invoke(app, ["--db", str(db), *map(str, args)], catch_exceptions=False)


def rows(db, sql, params=()):
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("mutants")
    db = d / "cases.db"
    import_manifests(lambda *args: invoke(db, *args), d, {"tiny.yaml": TINY})
    return db


@pytest.mark.slow
def test_every_mutant_over_a_tiny_model(tiny_db):
    """One command, every mutant (one test: the 14 runs are its cost, paid once under -n 2)."""
    from casedb.mutation import harness, mutants  # noqa: F401 (mutants: registers the bugs)

    res = invoke(tiny_db, "mutants", "--model", "tiny", "-j", "0", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)

    # the control is clean: no false alarm
    c = report["control"]
    assert {k: c[k] for k in ("executed", "passed", "false_alarms", "alarms", "outcomes")} == {
        "executed": 7, "passed": 7, "false_alarms": 0, "alarms": [], "outcomes": {"passed": 7}}
    assert (report["base"], report["device"], report["judge"], report["models"]) == ("eager", "cpu", "both", ["tiny"])

    # each mutant fails every case it changes, and only those: no survivors, no failure without a change
    got = {m["name"]: m for m in report["mutants"]}
    assert list(got) == harness.bugs() == list(EXPECTED)
    changed = {}
    for name, m in got.items():
        assert (m["survivors"], m["failed_unchanged"]) == ([], []), name
        score = 1.0 if EXPECTED[name] else None
        assert (m["executed"], m["caught"], m["score"]) == (7, m["changed"], score), name
        assert m["models"] == {"tiny": {"changed": m["changed"], "caught": m["changed"], "score": score}}
        assert (m["kind"], m["doc"]) == (harness.MUTANTS[name].kind, harness.MUTANTS[name].doc)
        changed[name] = {r["name"] for r in rows(tiny_db, """
            SELECT mc.name FROM results r JOIN judgements j ON j.result_id = r.id
            JOIN model_cases mc ON mc.id = j.model_case_id
            WHERE r.run_id = ? AND json_extract(r.metrics, '$.notes.mutant.changed') AND r.outcome = 'failed'""",
            [m["run_id"]])}
    assert changed == EXPECTED

    # each is a run in the DB, with its mutant and base; each result carries the mutant's note
    ids = [c["run_id"]] + [m["run_id"] for m in report["mutants"]]
    runs = rows(tiny_db, f"SELECT id, backend, device, status, selection FROM runs WHERE id IN "
                         f"({','.join('?' * len(ids))}) ORDER BY id", ids)
    assert [(r["backend"], r["device"], r["status"]) for r in runs] == [
        (harness.PREFIX + n, "cpu", "finished") for n in ["none", *EXPECTED]]
    for r in runs:
        sel = json.loads(r["selection"])
        assert sel["mutation"] == {"mutant": r["backend"][len(harness.PREFIX):], "base": "eager",
                                   "control_run": c["run_id"]}
        assert sel["options"]["markexpr"] == "" and sel["options"]["imports"] == ["casedb.mutation.mutants"]
    notes = rows(tiny_db, "SELECT json_extract(metrics, '$.notes.mutant') AS note FROM results WHERE run_id = ?",
                 [c["run_id"]])
    assert [json.loads(n["note"]) for n in notes] == [{"name": "none", "changed": False, "base": "eager"}] * 7


@pytest.mark.slow
def test_user_mutants_through_import_caught_and_surviving(tiny_db, tmp_path):
    path = tmp_path / "my_bugs.py"
    path.write_text(USER_MUTANTS)
    listed = invoke(tiny_db, "mutants", "--list", "--import", path, "--json")
    assert listed.exit_code == 0, listed.output
    assert [m for m in json.loads(listed.stdout) if m["name"] in ("halved", "nudged")] == [
        {"name": "halved", "kind": "output", "backend": "casedb_mutant_halved",
         "doc": "Floating outputs halved: a scale applied twice."},
        {"name": "nudged", "kind": "output", "backend": "casedb_mutant_nudged",
         "doc": "One part in 2**23 added: below what float32 can be judged at."}]
    args = ("mutants", "--model", "tiny", "--import", path, "--mutant", "halved", "--mutant", "nudged", "-j", "0",
            "--op", "torch.add")
    res = invoke(tiny_db, *args, "--json")
    assert res.exit_code == 0, res.output
    halved, nudged = json.loads(res.stdout)["mutants"]
    assert (halved["name"], halved["changed"], halved["caught"], halved["score"]) == ("halved", 1, 1, 1.0)
    # one part in 2**23 is within the ULP floor of the high-precision reference on every element, but
    # every element moves up: the bias judge (casedb.judge.bias) fails it, the per-element judges cannot
    assert (nudged["name"], nudged["changed"], nudged["caught"], nudged["score"], nudged["within_precision"]) == (
        "nudged", 1, 1, 1.0, [])
    found = rows(tiny_db, "SELECT reason, ulp_err, bias_toward FROM results WHERE run_id = ?", [nudged["run_id"]])
    (r,) = [r for r in found if "biased rounding" in r["reason"]]
    assert 0 < r["ulp_err"] <= 4 and r["bias_toward"] > 0.3
    # the tolerance judge measures no ULP error: there the same change is a survivor
    res = invoke(tiny_db, *args, "--judge", "tolerance", "--json")
    assert res.exit_code == 0, res.output
    _, nudged = json.loads(res.stdout)["mutants"]
    assert (nudged["changed"], nudged["caught"], nudged["score"], nudged["within_precision"]) == (1, 0, 0.0, [])
    (s,) = nudged["survivors"]
    assert {k: s[k] for k in ("op", "inputs", "cases", "outcome")} == {
        "op": "torch.add", "inputs": "fp32[4, 100], fp32[100]", "cases": ["tiny::add_bcast"], "outcome": "passed"}
    text = invoke(tiny_db, *args, "--judge", "tolerance", "--no-progress")
    assert text.exit_code == 0, text.output
    flat = " ".join(text.stdout.replace("│", " ").split())
    assert "halved" in flat and "100.0%" in flat and "0.0%" in flat
    assert "nudged survives: tiny::add_bcast: torch.add(fp32[4, 100], fp32[100]) passed" in flat


@pytest.mark.slow
def test_the_base_reaches_worker_processes(tiny_db):
    """-j 1: the mutants run in a pytest-xdist worker, which gets the base from the environment."""
    res = invoke(tiny_db, "mutants", "--model", "tiny", "--mutant", "zeros", "--backend", "aot_eager", "-j", "1",
                 "--op", "torch.log", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["base"], rep["control"]["passed"], rep["mutants"][0]["caught"]) == ("aot_eager", 1, 1)
    (note,) = rows(tiny_db, "SELECT json_extract(metrics, '$.notes.mutant') AS n FROM results WHERE run_id = ?",
                   [rep["mutants"][0]["run_id"]])
    assert json.loads(note["n"]) == {"name": "zeros", "changed": True, "base": "aot_eager"}


@pytest.mark.parametrize("args, message", [
    (("--model", "tiny", "--mutant", "nope"), "unknown mutant 'nope'; known: padding, large_tensor"),
    (("--model", "tiny", "--mutant", "none"), "unknown mutant 'none'"),
    (("--mutant", "zeros"), "give --model"),
    (("--model", "tiny", "--backend", "no_such_backend"), "--backend 'no_such_backend': not a registered"),
    (("--model", "nomodel"), "no model 'nomodel'"),
])
def test_bad_options_are_clear_errors(tiny_db, args, message):
    before = rows(tiny_db, "SELECT count(*) AS n FROM runs")
    res = invoke(tiny_db, "mutants", *args, "-j", "0")
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())
    assert rows(tiny_db, "SELECT count(*) AS n FROM runs") == before


def test_a_mutant_that_does_not_apply_changes_nothing():
    """Called directly as dynamo backends: no bug where the pattern is absent, the call as the base makes it."""
    import torch

    from casedb.run import execute  # noqa: F401 (registers the backends)
    from casedb.mutation import harness, mutants  # noqa: F401 (mutants: registers the bugs)

    x = torch.arange(12.0).reshape(3, 4)
    for name in ("noncontiguous", "index_off_by_one", "inplace_lost", "broadcast", "low_precision_acc", "nan_inf"):
        torch._dynamo.reset()
        execute._notes.clear()
        out = torch.compile(lambda a: a * 2, backend=harness.PREFIX + name, fullgraph=True)(x)
        assert torch.equal(out, x * 2) and execute._notes["mutant"] == {"name": name, "changed": False,
                                                                         "base": "eager"}, name


def test_copies_keep_the_layout_compiled_code_expects():
    import torch

    from casedb.mutation.harness import copy_input, same

    base = torch.randn(6, 10)
    for x in (base[:, 1:8:2], base.t(), torch.randn(1, 5).expand(4, 5), base[2:]):
        c = copy_input(x)
        assert (c.shape, c.stride(), c.storage_offset()) == (x.shape, x.stride(), x.storage_offset())
        assert same(c, x) and c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        z = copy_input(x, zeroed=True)
        assert (z.stride(), bool((z == 0).all())) == (x.stride(), True)


def test_low_precision_layer_norm_keeps_eager_dtypes_and_shapes():
    """The bf16-accumulating layer norm returns what the CPU kernel does, mean and rstd included."""
    import torch

    from casedb.mutation.mutants import _LowPrecisionAccumulation

    x = torch.randn(4, 640, dtype=torch.bfloat16)
    ref = torch.ops.aten.native_layer_norm(x, [640], None, None, 1e-5)
    mode = _LowPrecisionAccumulation()
    with mode:
        got = torch.ops.aten.native_layer_norm(x, [640], None, None, 1e-5)
    assert mode.hits == 1
    assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in ref]
