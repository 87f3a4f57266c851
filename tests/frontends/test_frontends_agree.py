"""Issue 46 items 3 and 6: the pytest front end reads like `casedb run` (no empty torch trace
lines, the failures by cause at the end, a compile error counted as an error in both), and
`casedb cases` takes every selection option of `run` with the same meaning and count."""

import json
import re

import pytest
import torch
import torch._dynamo
from typer.testing import CliRunner

import casedb.run.execute  # noqa: F401
import casedb.run.runner  # noqa: F401
import casedb.store.database  # noqa: F401
import importers.yaml_manifest  # noqa: F401 (see tests/frontends/test_plugin.py: imported before pytester snapshots)

torch._dynamo.list_backends(exclude_tags=())
pytest_plugins = ("pytester",)

MANIFEST = """\
model: agree
default: {dtype: fp32}
cases:
  - name: add_a
    op: torch.add
    inputs:
      - tensor: {shape: [4, 8]}
      - tensor: {shape: [4, 8]}
  - name: rsqrt_a
    op: torch.rsqrt
    inputs:
      - tensor: {shape: [4, 8], init: uniform, init_args: {low: 1, high: 2}}
  - name: neg_t
    op: torch.neg
    inputs:
      - tensor: {shape: [16, 64], preset: transpose_view}
  - name: relu_big
    op: torch.relu
    inputs:
      - tensor: {shape: [64, 1024]}
  - name: mul_bc
    op: torch.mul
    inputs:
      - tensor: {shape: [8, 64], preset: strided, preset_args: {stride: [0, 1]}}
      - tensor: {shape: [8, 64]}
  - name: abs_a
    op: torch.abs
    inputs:
      - tensor: {shape: [3, 5]}
"""
# twice the right answer for everything it compiles, and no lowering for rsqrt
BACKEND = """\
import torch


def _compile(gm, example_inputs):
    targets = {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}
    if any("rsqrt" in t for t in targets):
        raise NotImplementedError("no lowering for rsqrt")

    def run(*args):
        out = gm(*args)
        return type(out)(y * 2 for y in out) if isinstance(out, (tuple, list)) else out * 2

    return run


try:
    torch._dynamo.register_backend(_compile, name="casedb_test_agree")
except Exception:  # registered by an earlier import of this file
    pass
"""
TEST_FILE = "from casedb.pytest_plugin import test_model_op  # noqa: F401\n"


@pytest.fixture
def db(tmp_path):
    from casedb.cli import app

    (tmp_path / "agree.yaml").write_text(MANIFEST)
    path = tmp_path / "cases.db"
    res = CliRunner().invoke(app, ["--db", str(path), "import", str(tmp_path / "agree.yaml")])
    assert res.exit_code == 0, res.output
    return path


@pytest.fixture
def ptr(pytester, db, monkeypatch):
    monkeypatch.setenv("CASEDB_DB", str(db))
    monkeypatch.delenv("TEST_COMPILE_BACKEND", raising=False)
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb=TEST_FILE)
    (pytester.path / "agree_backend.py").write_text(BACKEND)
    return pytester


def test_pytest_reads_like_casedb_run(ptr, db):
    from casedb.cli import app

    faulty = ("--device", "cpu", "--casedb-no-shipped-triage", "--casedb-import", "agree_backend.py")
    res = ptr.runpytest("--model", "agree", "-m", "", "-k", "torch.add or rsqrt", "--compile-backend",
                        "casedb_test_agree", *faulty)
    res.assert_outcomes(failed=1, errors=1)  # the wrong add fails; rsqrt's compile error is an error
    text = res.stdout.str()
    assert "torch.__trace" not in text
    assert "casedb: run 1 recorded in" in text and "1 failed, 1 error\n" in text + "\n"
    assert "casedb: 2 failing case(s), 2 cause(s):" in text
    assert re.search(r"casedb: +1 × torch.rsqrt: compile: backend compiler: NotImplementedError: no lowering "
                     r"for rsqrt \(e.g. agree::rsqrt_a: fp32\[4, 8\]\)", text)
    assert "casedb:   details: casedb report --run 1" in text
    # casedb run, same cases, same target: the same counts, worded alike
    ran = CliRunner().invoke(app, ["--db", str(db), "run", "--model", "agree", "-k", "torch.add or rsqrt", "-j", "0",
                                   "--no-progress", "--device", "cpu", "--backend", "casedb_test_agree",
                                   "--no-shipped-triage", "--import", str(ptr.path / "agree_backend.py"), "--json"])
    summary = json.loads(ran.stdout)
    assert (summary["failed"], summary["errors"]) == (1, 1)


@pytest.mark.parametrize("selection", [
    ("--shard", "1/3"), ("--shard", "2/3"), ("--max-numel", "1000"), ("-m", "noncontiguous"),
    ("-m", "broadcast or transposed"), ("-k", "relu or abs"), ("--op", "mul"), ("--limit", "2"),
    ("--shard", "3/3", "--max-numel", "4000"), ("-k", "add"),  # (add: paddedtensor too, as pytest reads -k)
])
def test_cases_selects_what_run_runs(cli, db, selection):
    listed = cli.json("cases", "--model", "agree", *selection)
    ran = cli("run", "--model", "agree", *selection, "-j", "0", "--no-progress", "--device", "cpu",
              "--backend", "eager", "--no-shipped-triage", "--json", db=db)
    summary = json.loads(ran.stdout)
    assert len(listed) == summary["executed"] > 0
    plain = cli("cases", "--model", "agree", *selection)
    assert plain.stderr.strip() == f"{len(listed)} cases"


def test_cases_refuses_a_bad_selection_as_run_does(cli, db):
    for args, said in ((("--shard", "4/3"), "--shard takes I/N"), (("--max-numel", "0"), "--max-numel must be at least 1"),
                       (("-m", "offset"), "no case here has the derived mark 'offset'")):
        listed, ran = cli("cases", *args), cli("run", *args, "--device", "cpu", "--backend", "eager", "-j", "0")
        assert listed.exit_code == ran.exit_code == 2
        assert said in " ".join(listed.stderr.split()) and said in " ".join(ran.stderr.split())


def test_layout_marks_in_the_pytest_front_end(ptr):
    res = ptr.runpytest("--model", "agree", "-m", "noncontiguous", "--collect-only", "-q")
    picked = sorted(ln.split("[", 1)[1].split("-", 1)[0] for ln in res.outlines if "::test_model_op[" in ln)
    assert picked == ["torch.mul", "torch.neg"]
    none = ptr.runpytest("--model", "agree", "-m", "offset", "--collect-only", "-q")
    assert none.ret == pytest.ExitCode.USAGE_ERROR
    assert "no case here has the derived mark 'offset'" in " ".join(none.stderr.str().split())
