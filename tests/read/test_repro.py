"""`casedb repro`: a standalone script (torch only) that rebuilds a case's exact inputs and reproduces it."""

import ast
import os
import runpy
import subprocess
import sys

import pytest
import torch

RICH = """\
model: rich
default: {dtype: fp16, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: many_inputs
    op: torch.add
    inputs:
      - tensor: {shape: [3, 5], init: randn, init_args: {mean: 0.5, std: 2.0}}
      - tensor: {shape: [4], dtype: int64, init: randint, init_args: {low: -3, high: 9}}
      - tensor: {shape: [2, 3], dtype: bf16, init: uniform, init_args: {low: -1.0, high: 1.0}}
      - tensor: {shape: [2, 4], dtype: fp32, init: arange, init_args: {start: 1, step: 0.5}}
      - tensor: {shape: [6], dtype: bool}
      - tensor: {shape: [2, 2], dtype: fp32, data: [[1.5, -2.0], [3.25, 4.0]]}
      - file: weights.pt
      - tensor: {shape: [2, 3, 8], preset: noncontig_slice, preset_args: {dim: 1, step: 2}}
      - tensor: {shape: [3, 4], preset: transpose_view, preset_args: {dim0: 0, dim1: 1}}
      - tensor: {shape: [2, 3], preset: strided, preset_args: {stride: [1, 2]}}
      - tensor_list:
          - {shape: [2, 3], init: rand}
          - {shape: [2, 5], dtype: int32}
      - py: (Ellipsis, None, slice(None, None, None), -inf)
      - value: torch.float16
      - value: [2, 24]
      - value: 3.0
    attrs:
      other: {tensor: {shape: [3], init: ones}}
      dim: -1
      device: "cuda:0"
  - name: residual
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: inplace
    op: torch.Tensor.mul_
    inputs:
      - tensor: {shape: [3, 64]}
      - value: 3.0
  - name: wrong
    op: torch.ops.casedb_repro_test.wrong_second_call
    inputs:
      - tensor: {shape: [4, 64]}
"""

OTHER = """\
model: other
cases:
  - name: residual
    op: torch.mul
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
"""

WRONG_OPS = '''\
import itertools

import torch

_calls = itertools.count()


@torch.library.custom_op("casedb_repro_test::wrong_second_call", mutates_args=())
def wrong_second_call(x: torch.Tensor) -> torch.Tensor:
    # right on the first call (the reference), off by one on the second (the target)
    return x * 2 + next(_calls) % 2


@wrong_second_call.register_fake
def _fake(x):
    return torch.empty_like(x)
'''


@pytest.fixture
def db(imported_db, tmp_path):
    torch.save(torch.arange(6, dtype=torch.float16).reshape(2, 3) / 7, tmp_path / "weights.pt")
    return imported_db({"rich.yaml": RICH, "other.yaml": OTHER})


@pytest.fixture
def wrong_ops(tmp_path):
    path = tmp_path / "wrong_ops.py"
    path.write_text(WRONG_OPS)
    return path


def write_repro(cli, tmp_path, name, *args, file="repro.py"):
    out = tmp_path / file
    res = cli("repro", name, *args, "-o", out)
    assert res.exit_code == 0, res.output
    return out


def run_script(path):
    # plain python, casedb made unimportable: the script must need torch only
    code = ("import runpy, sys; sys.modules['casedb'] = None; "
            f"runpy.run_path({str(path)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def same(a, b, where="args"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.device) == (
            b.dtype, b.shape, b.stride(), b.storage_offset(), b.device), where
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a,
                           b.view(torch.uint8) if b.dtype == torch.bool else b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


def test_script_rebuilds_exactly_the_inputs_materialize_makes(cli, db, tmp_path):
    from casedb.cases.materialize import materialize
    from casedb.store.database import Store

    path = write_repro(cli, tmp_path, "rich::many_inputs", "--device", "cpu", "--backend", "eager")
    ns = runpy.run_path(str(path), run_name="repro")
    got = ns["arguments"](ns["generate"](), "cpu", False)
    with Store(db) as store:
        case = store.case(store.find("rich::many_inputs")[0]["signature"])
        want = materialize(case, "cpu", load_blob=store.load_blob)
    same(list(got[0]), list(want[0]))
    same(got[1], want[1], "kwargs")
    assert got[1]["device"] == "cpu"  # the recorded cuda:0, replaced like casedb replaces it


def test_script_needs_only_torch(cli, db, tmp_path):
    path = write_repro(cli, tmp_path, "rich::many_inputs", "--device", "cpu", "--backend", "eager")
    tree = ast.parse(path.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "casedb" not in imported
    assert imported - {"torch"} <= set(sys.stdlib_module_names), imported


@pytest.mark.slow
def test_passing_case_runs_with_plain_python(cli, db, tmp_path):
    path = write_repro(cli, tmp_path, "rich::residual", "--device", "cpu", "--backend", "eager")
    done = run_script(path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "OK: torch.add on cpu (eager) matches the CPU reference (rtol=0.001, atol=0.001)"


@pytest.mark.slow
def test_inplace_op_compares_the_written_argument(cli, db, tmp_path):
    path = write_repro(cli, tmp_path, "inplace", "--device", "cpu", "--backend", "eager")
    assert runpy.run_path(str(path), run_name="repro")["WRITES"] == ["args[0]"]
    done = run_script(path)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_wrong_backend_result_is_reproduced(cli, db, tmp_path, data_dir):
    path = write_repro(cli, tmp_path, "rich::residual", "--device", "cpu", "--backend", "casedb_test_perturb",
                       "--import", data_dir / "custom_ops.py")
    done = run_script(path)
    assert done.returncode == 1
    # casedb's own comparison, as a run reports it
    assert ("AssertionError: torch.add on cpu (casedb_test_perturb) vs CPU eager: output: 256 of 256 elements "
            "(100%) exceed atol=0.001 + rtol=0.001*|ref|") in done.stderr


@pytest.mark.slow
def test_custom_op_from_an_import_line_reproduces_its_failure(cli, db, tmp_path, wrong_ops):
    # judged by tolerance (given): no high-precision call comes between the reference's call and the target's
    path = write_repro(cli, tmp_path, "wrong", "--device", "cpu", "--backend", "eager", "--import", wrong_ops,
                       "--rtol", "1e-3", "--atol", "1e-3")
    # the file by its absolute path, its module name as a fallback: the script runs from any folder
    assert runpy.run_path(str(path), run_name="repro")["CASE"]["imports"] == [
        {"module": "wrong_ops", "file": str(wrong_ops), "folder": str(tmp_path), "given": "file"}]
    done = run_script(path)
    assert done.returncode == 1 and "exceed atol=0.001 + rtol=0.001*|ref|" in done.stderr
    # the same case with the run's own tolerance relaxed passes: the failure is the values, not the script
    loose = write_repro(cli, tmp_path, "wrong", "--device", "cpu", "--backend", "eager", "--import", wrong_ops,
                        "--atol", "1.5", file="loose.py")
    assert run_script(loose).returncode == 0


def test_a_name_two_cases_share_asks_which(cli, db):
    res = cli("repro", "residual")
    assert res.exit_code == 2
    assert "'residual' names 2 different cases; give one of: other::residual" in res.output
    assert "rich::residual" in res.output


def test_unknown_case_is_a_clear_error(cli, db):
    res = cli("repro", "nosuchcase")
    assert res.exit_code == 2 and "no case named 'nosuchcase'" in res.output
