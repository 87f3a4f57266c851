"""Issue 46 item 8: op names whole in tables, `report | head` quiet and 0, a manifest-declared
expected error neither the worst op nor a blocking op."""

import io
import json
import os
import subprocess
import sys

from rich.console import Console

from tests import runs_data

HISTC = """\
model: moe
default: {dtype: fp32}
cases:
  - name: histc_int
    op: torch.histc
    attrs: {bins: 32, max: 31, min: 0}
    inputs:
      - tensor: {shape: [1024], dtype: int32}
    expects_error: {cpu: {match: histogram_cpu, type: RuntimeError}, ref: {match: histogram_cpu, type: RuntimeError}}
  - name: mul_a
    op: torch.mul
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: mul_b
    op: torch.mul
    inputs:
      - tensor: {shape: [8, 64]}
      - tensor: {shape: [8, 64]}
"""


def test_a_declared_expected_error_is_neither_the_worst_op_nor_a_blocker(cli, db_path, tmp_path):
    (tmp_path / "moe.yaml").write_text(HISTC)
    assert cli("import", tmp_path / "moe.yaml").exit_code == 0
    run = runs_data.record_run(db_path, {("moe", "histc_int"): ("xfailed", 0.0), ("moe", "mul_a"): ("failed", 0.5),
                                         ("moe", "mul_b"): ("passed", 0.0)})
    report = cli.json("report", "--run", run)
    assert [r["op"] for r in report["ops"]] == ["torch.mul", "torch.histc"]
    histc = report["ops"][1]
    assert (histc["expected_errors"], histc["xfailed"], histc["executed"], histc["pass_rate"]) == (1, 0, 0, None)
    assert [r["op"] for r in report["blocking"]] == ["torch.mul"]
    assert {r["op"] for r in report["blocking_matrix"]} == {"torch.mul"}


def test_op_names_are_whole_in_a_narrow_table():
    from casedb.read import tables

    op = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"
    row = {"model": "granite4h", "name": "sdpa_0123456789", "op": op, "shapes": "bf16[1, 32, 8448, 128] transposed, "
           "bf16[1, 32, 8448, 128] transposed", "marks": "bf16operation,largedimtensor", "sig": "0123456789ab"}
    out = io.StringIO()
    tables.emit([row], ("model", "name", "op", "shapes", "marks", "sig"), console=Console(width=100, file=out),
                fmt=tables.Format.table)
    assert op in out.getvalue()  # on one line, not cut to "torch.ops.aten._scaled_dot_pro…"


def test_report_into_a_closed_pipe_exits_0_quietly(cli, db_path, tmp_path):
    (tmp_path / "moe.yaml").write_text(HISTC)
    assert cli("import", tmp_path / "moe.yaml").exit_code == 0
    runs_data.record_run(db_path, {("moe", "mul_a"): ("failed", 0.5)})
    env = {**os.environ, "CASEDB_DB": str(db_path)}
    for args in (("report",), ("cases", "--format", "table"), ("cases", "--json")):
        # the reader is gone before anything is written (what `| head -1` does to a long report)
        r, w = os.pipe()
        os.close(r)
        proc = subprocess.run([sys.executable, "-m", "casedb", *args], stdout=w, stderr=subprocess.PIPE, env=env,
                              timeout=120)
        os.close(w)
        assert (proc.returncode, proc.stderr.decode()) == (0, ""), args
    # a verdict command keeps its status: what it would say cannot be read
    r, w = os.pipe()
    os.close(r)
    proc = subprocess.run([sys.executable, "-m", "casedb", "check", str(tmp_path / "moe.yaml"), "--json"], stdout=w,
                          stderr=subprocess.PIPE, env=env, timeout=120)
    os.close(w)
    assert proc.returncode != 0 and json is not None
