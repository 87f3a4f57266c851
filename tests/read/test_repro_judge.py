"""`casedb repro --run N` reproduces what run N judged (issue 28): its target, the --import
modules given again, its judge (ULPs and bias as well as tolerance)
and its tolerances; the script exits 1 exactly when the run failed the case."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "data" / "repro"

MANIFEST = """\
model: ulp
default: {dtype: bf16, rtol: 1.6e-2, atol: 1.0e-5}
cases:
  - name: add_f32
    op: torch.add
    inputs:
      - tensor: {shape: [8, 64], dtype: fp32}
      - tensor: {shape: [8, 64], dtype: fp32}
"""


@pytest.fixture
def project(tmp_path, monkeypatch, cli):
    """A working directory holding the backends module and the case; runs recorded from it."""
    shutil.copy(DATA / "ulp_backend.py", tmp_path / "ulp_backend.py")
    (tmp_path / "ulp.yaml").write_text(MANIFEST)
    monkeypatch.chdir(tmp_path)
    assert cli("import", "ulp.yaml").exit_code == 0
    return tmp_path


def run_and_repro(cli, project, backend: str) -> tuple[int, subprocess.CompletedProcess, str]:
    done = cli("run", "--import", "ulp_backend", "--backend", backend, "--device", "cpu", "-j", "0",
               "--no-progress", "--json")
    run_id = __import__("json").loads(done.stdout)["run_id"]
    script = project / f"repro_{backend}.py"
    # the run's --import given again: repro never imports what a database names
    made = cli("repro", "ulp::add_f32", "--run", run_id, "--import", "ulp_backend", "-o", script)
    assert made.exit_code == 0, made.output
    # the script runs where it was written, casedb made unimportable: it needs torch only
    code = ("import runpy, sys; sys.modules['casedb'] = None; "
            f"runpy.run_path({script.name!r}, run_name='__main__')")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=project)
    return done.exit_code, ran, script.read_text()


@pytest.mark.slow
def test_a_case_failing_only_by_ulps_fails_its_repro_and_the_fixed_backend_passes(cli, project):
    run_rc, ran, text = run_and_repro(cli, project, "casedb_ulp_off")
    assert run_rc == 1  # every element is 16 ULPs off: within rtol/atol, outside the ULP judge
    assert ran.returncode == 1, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("run ") and lines[0].endswith(" recorded this case as failed")
    # the tolerance printed is the float32 output's, not the manifest's bf16 default
    assert lines[1].startswith("judge both: float32 output at rtol=1.3e-06, atol=1e-05 (the run's: float32: "
                               "the float32 default)")
    assert lines[2].startswith("first difference: output[0, 0]: target ")
    assert lines[3].startswith("pattern: ")
    assert "ULPs of float32" in ran.stderr and "AssertionError" in ran.stderr
    # given by name: imported by name, the file and its folder kept as a fallback (issue 46 item 5)
    assert f'"file": "{project / "ulp_backend.py"}", "folder": "{project}", "given": "name", "module": "ulp_backend"' in text

    run_rc, ran, text = run_and_repro(cli, project, "casedb_ulp_fixed")
    assert run_rc == 0
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1].startswith("OK: torch.add on cpu (casedb_ulp_fixed) matches the CPU reference")


@pytest.mark.slow
def test_the_shown_repro_command_names_the_run(cli, project):
    run_rc, _, _ = run_and_repro(cli, project, "casedb_ulp_off")
    report = cli.json("report")
    [failure] = report["failures"]
    assert failure["repro"].endswith(f" --run {report['run']['run_id']}")


def test_a_run_that_did_not_run_the_case_is_a_clear_error(cli, project):
    done = cli("run", "--import", "ulp_backend", "--backend", "casedb_ulp_fixed", "--device", "cpu", "-j", "0",
               "--no-progress", "-k", "nothing_matches")
    res = cli("repro", "ulp::add_f32", "--run", 1)
    assert res.exit_code == 2 and "run 1 did not run case" in res.output, (done.output, res.output)


GPU_LIKE = """\
model: gpu
cases:
  - name: sort_ids
    op: torch.sort
    inputs:
      - tensor: {shape: [512], dtype: int64, init: randint, init_args: {low: 0, high: 8}}
  - name: sum_rows
    op: torch.sum
    inputs:
      - tensor: {shape: [16, 65536], dtype: fp32}
      - value: -1
  - name: mean_rows
    op: torch.mean
    inputs:
      - tensor: {shape: [512, 2880], dtype: fp32, init: uniform, init_args: {low: 1.5e+9, high: 6.6e+9}}
      - value: -1
  - name: softmax_f32
    op: torch.nn.functional.softmax
    inputs:
      - tensor: {shape: [2048, 320], dtype: bf16, init: uniform, init_args: {low: 95.0, high: 99.0}}
    attrs: {dim: -1, dtype: torch.float32}
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sort_ids", "sum_rows", "mean_rows", "softmax_f32"])
def test_what_a_gpu_computes_differently_passes_in_the_run_and_in_its_repro(cli, tmp_path, monkeypatch, name):
    # the repro carries casedb.judge.ties and .accumulation: it judges as the run did
    shutil.copy(DATA / "gpu_like_backend.py", tmp_path / "gpu_like_backend.py")
    (tmp_path / "gpu.yaml").write_text(GPU_LIKE)
    monkeypatch.chdir(tmp_path)
    assert cli("import", "gpu.yaml").exit_code == 0
    done = cli("run", "--import", "gpu_like_backend", "--backend", "casedb_gpu_like", "--device", "cpu", "-j", "0",
               "-k", name, "--no-progress", "--json")
    summary = __import__("json").loads(done.stdout)
    assert (done.exit_code, summary["executed"], summary["passed"]) == (0, 1, 1), done.output
    script = tmp_path / f"repro_{name}.py"
    assert cli("repro", f"gpu::{name}", "--run", summary["run_id"], "--import", "gpu_like_backend",
               "-o", script).exit_code == 0
    code = ("import runpy, sys; sys.modules['casedb'] = None; "
            f"runpy.run_path({script.name!r}, run_name='__main__')")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    op = "torch.nn.functional.softmax" if name == "softmax_f32" else f"torch.{name.split('_')[0]}"
    assert ran.stdout.splitlines()[-1].startswith(f"OK: {op} on cpu (casedb_gpu_like)")
