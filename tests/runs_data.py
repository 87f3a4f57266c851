"""A small DB with two recorded runs, for the report, serve and browser tests.

Cases come in through `casedb import` (a YAML manifest); runs, results and judgements are
recorded through casedb.store (run_lifecycle, recorder), as the runner records them, so these tests do not need
the runner.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests import helpers

MANIFEST_A = """\
model: model_a
default: {dtype: bf16, rtol: 1.0e-2, atol: 1.0e-2}
cases:
  - name: a_add
    op: torch.add
    inputs:
      - tensor: {shape: [1, 11, 2880]}
      - tensor: {shape: [1, 11, 2880]}
    description: residual add after attention
  - name: a_silu
    op: torch.nn.functional.silu
    inputs:
      - tensor: {shape: [1, 11, 5760]}
    description: gate activation of the expert MLP
  - name: a_softmax
    op: torch.nn.functional.softmax
    attrs: {dim: -1}
    inputs:
      - tensor: {shape: [1, 64, 11, 11]}
    xfail_if: "True"
    xfail_reason: softmax on 4d inputs is known to fail
  - name: a_mul
    op: torch.mul
    inputs:
      - tensor: {shape: [1, 11, 2880]}
      - tensor: {shape: [1, 11, 2880], init: randn}
"""

# model_b shares a_add's case (same op, inputs, dtype) with its own, tighter tolerance.
MANIFEST_B = """\
model: model_b
default: {dtype: bf16, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: b_residual
    op: torch.add
    inputs:
      - tensor: {shape: [1, 11, 2880]}
      - tensor: {shape: [1, 11, 2880]}
    description: residual add in the decoder block
  - name: b_rsqrt
    op: torch.rsqrt
    inputs:
      - tensor: {shape: [1, 11, 1], init: uniform, init_args: {low: 0.1, high: 2.0}}
"""

CPU = ("cpu", "inductor")

# (model, case) -> (judgement outcome, max_abs_err) per run.
RUN1 = {
    ("model_a", "a_add"): ("passed", 1.0e-4),
    ("model_b", "b_residual"): ("passed", 1.0e-4),
    ("model_a", "a_silu"): ("passed", 2.0e-3),
    ("model_a", "a_softmax"): ("xfailed", 0.5),
    ("model_a", "a_mul"): ("failed", 0.25),
    ("model_b", "b_rsqrt"): ("passed", 1.0e-5),
}
RUN2 = {
    ("model_a", "a_add"): ("passed", 1.0e-4),
    ("model_b", "b_residual"): ("passed", 1.0e-4),
    ("model_a", "a_silu"): ("failed", 0.5),       # regression: passed in run 1
    ("model_a", "a_softmax"): ("xpassed", 1.0e-3),  # marked xfail, now passes: remove xfail
    ("model_a", "a_mul"): ("passed", 1.0e-3),      # fix: failed in run 1
    ("model_b", "b_rsqrt"): ("passed", 1.0e-3),    # still passes, error grew 100x
}


def import_manifests(cli, tmp_path: Path) -> None:
    for name, text in (("model_a.yaml", MANIFEST_A), ("model_b.yaml", MANIFEST_B)):
        helpers.import_manifests(cli, tmp_path, {name: text})


def occurrences(db_path: Path) -> dict:
    """(model, case name) -> (model_case id, signature, rtol, atol): the tolerance a judgement of
    it records, the case's own, else (the outputs here are of the manifest's dtype) the manifest
    default."""
    con = sqlite3.connect(db_path)
    try:
        return {(m, n): (i, s, rtol, atol) for i, m, n, s, rtol, atol in con.execute(
            "SELECT mc.id, mc.model, mc.name, mc.signature, coalesce(mc.rtol, json_extract(m.defaults, '$.rtol')),"
            " coalesce(mc.atol, json_extract(m.defaults, '$.atol'))"
            " FROM model_cases mc JOIN models m ON m.name = mc.model")}
    finally:
        con.close()


def record_run(db_path: Path, outcomes: dict, *, device: str = CPU[0], backend: str = CPU[1],
               started_at: str = "2025-01-01T00:00:00+00:00", timings: dict | None = None) -> int:
    """Record one run through casedb.store.recorder, as the runner does: one results row per
    distinct case executed, one judgements row per model occurrence. A case shared by models is
    executed once; its results row takes the first occurrence's error. Returns the run id."""
    from casedb.store import recorder, run_lifecycle, run_rows
    from tests.helpers import store_conn

    occ = occurrences(db_path)
    conn = store_conn(db_path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        run_id = run_lifecycle.start_run(conn, selection={}, args=[], device=device, backend=backend)
        run_rows.set_run(conn, run_id, started_at=started_at, torch_version="2.13.0", casedb_version="0.1.0",
                        host="test")
        result_ids = {}
        for (model, name), (outcome, err) in outcomes.items():
            mc_id, sig, rtol, atol = occ[(model, name)]
            if sig not in result_ids:
                result_ids[sig] = recorder.insert_result(conn, _result(run_id, sig, mc_id, outcome, err, started_at,
                                                                      (timings or {}).get(name)))
            recorder.insert_judgement(conn, {
                "run_id": run_id, "result_id": result_ids[sig], "model_case_id": mc_id, "model": model,
                "signature": sig, "outcome": outcome, "reason": None if outcome == "passed" else f"{outcome} at {err}",
                "rtol": rtol, "atol": atol, "created_at": started_at})
        run_rows.set_run(conn, run_id, status="finished", finished_at=started_at)
        conn.execute("COMMIT")
        return run_id
    finally:
        conn.close()


def _result(run_id: int, sig: str, mc_id: int, outcome: str, err: float, at: str, timing) -> dict:
    t_ref, t_compile, t_exec = timing or (0.001, 0.01, 0.002)
    failed = outcome in ("failed", "xfailed")
    return {"run_id": run_id, "signature": sig, "model_case_id": mc_id, "outcome": outcome, "compare_mode": "allclose",
            "max_abs_err": err, "max_rel_err": err * 2, "mismatch_count": 7 if failed else 0, "nan_inf_mismatch": 0,
            "t_ref": t_ref, "t_compile": t_compile, "t_exec": t_exec,
            "error_type": "AssertionError" if failed else None,
            "error_message": f"max abs error {err} exceeds tolerance" if failed else None, "created_at": at}


def two_runs(cli, tmp_path: Path, db_path: Path) -> tuple[int, int]:
    """Import the two manifests and record RUN1 then RUN2 on cpu/inductor."""
    import_manifests(cli, tmp_path)
    first = record_run(db_path, RUN1, started_at="2025-01-01T00:00:00+00:00",
                       timings={"a_silu": (0.002, 0.5, 0.004)})
    second = record_run(db_path, RUN2, started_at="2025-01-02T00:00:00+00:00",
                        timings={"a_silu": (0.002, 0.7, 0.008), "a_mul": (0.003, 1.5, 0.1)})
    return first, second


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`casedb serve` in a subprocess on a free loopback port (the real server, as a user starts it)."""

    def __init__(self, db_path: Path, log_path: Path):
        self.db_path = db_path
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self) -> "Server":
        import subprocess
        import sys
        import time
        import urllib.request

        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "casedb", "--db", str(self.db_path), "serve",
                                     "--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"casedb serve exited with {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/-/versions.json", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"casedb serve did not answer on {self.url}: {self.log_path.read_text()}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()

    def get(self, path: str, *, method: str = "GET", data: bytes | None = None):
        """(status, body text) of a request to the server."""
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url + path, method=method, data=data)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def json(self, path: str):
        import json

        status, body = self.get(path)
        assert status == 200, body
        return json.loads(body)


def make_cli(db_path: Path):
    """`casedb --db db_path ARGS...` through CliRunner (for module-scoped fixtures)."""
    from typer.testing import CliRunner

    from casedb.cli import app

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, ["--db", str(db_path), *map(str, args)], catch_exceptions=False)

    return invoke
