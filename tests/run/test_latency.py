"""`casedb run --measure`: latencies measured with torch.utils.benchmark, stored per result, read
back by `casedb report` (text and --json), the run summary and Datasette; a backend slower on
matmul-like ops is flagged there and nowhere else, a 5 % slower one and an unchanged rerun are not."""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from pathlib import Path

import pytest

from casedb.read import latency
from tests import runs_data

SLOW = Path(__file__).parents[1] / "data" / "perf" / "slow_backends.py"
MANIFEST = """
model: perf
default: {dtype: fp32}
cases:
  - {name: mm, op: torch.mm, inputs: [{tensor: {shape: [192, 192]}}, {tensor: {shape: [192, 192]}}]}
  - {name: linear, op: torch.nn.functional.linear, inputs: [{tensor: {shape: [128, 256]}}, {tensor: {shape: [256, 256]}}]}
  - {name: bmm, op: torch.bmm, inputs: [{tensor: {shape: [8, 64, 96]}}, {tensor: {shape: [8, 96, 64]}}]}
  - {name: add, op: torch.add, inputs: [{tensor: {shape: [512, 512]}}, {tensor: {shape: [512, 512]}}]}
  - {name: relu, op: torch.nn.functional.relu, inputs: [{tensor: {shape: [512, 512]}}]}
  - {name: mul, op: torch.mul, inputs: [{tensor: {shape: [512, 512]}}, {tensor: {shape: [512, 512]}}]}
"""
MATMUL_LIKE = {"torch.mm", "torch.nn.functional.linear", "torch.bmm"}


@pytest.fixture
def perf_db(cli, tmp_path, db_path):
    (tmp_path / "perf.yaml").write_text(MANIFEST)
    assert cli("import", tmp_path / "perf.yaml").exit_code == 0
    return db_path


def _measured_run(cli, backend: str) -> dict:
    out = cli.json("run", "--device", "cpu", "--backend", backend, "--import", SLOW, "-m", "", "--measure",
                   "--measure-budget", "1", "--no-reference-cache")
    assert (out["passed"], out["unexpected"]) == (6, 0)
    return out


@pytest.mark.slow
def test_a_backend_slower_on_matmul_is_flagged_there_only_and_noise_is_not(cli, perf_db):
    plain = _measured_run(cli, "casedb_test_plain")
    assert plain["latency"]["measured"] == 6 and plain["latency"]["baseline"] == "eager"
    again = _measured_run(cli, "casedb_test_plain")
    slow = _measured_run(cli, "casedb_test_slow_mm_150")
    slight = _measured_run(cli, "casedb_test_slow_mm_105")

    def moved(run, base):
        lat = cli.json("report", "--run", run["run_id"], "--compare", base["run_id"])["latency"]
        return {e["op"] for e in lat["slower"]}, {e["op"] for e in lat["faster"]}, lat

    assert moved(again, plain)[:2] == (set(), set())          # an unchanged rerun: nothing flagged
    slower, faster, lat = moved(slow, plain)
    assert (slower, faster) == (MATMUL_LIKE, set())
    assert all(e["ratio"] > 1.1 and e["raw_ratio"] > 1.1 and e["p_value"] < 0.01 for e in lat["slower"])
    assert {o["op"] for o in lat["ops_slower"]} == MATMUL_LIKE
    assert moved(slight, plain)[:2] == (set(), set())         # 5 %: under the threshold
    text = cli("report", "--run", slow["run_id"], "--compare", plain["run_id"]).stdout
    assert f"Latency: slower vs run {plain['run_id']} (beyond 10.0% and the noise)" in text
    assert "torch.bmm" in text.split("Latency: slower")[1]


def test_measured_figures_round_trip_through_the_db_report_and_json(cli, perf_db):
    run = cli.json("run", "--device", "cpu", "--backend", "eager", "-m", "", "--measure", "--measure-budget", "0.2",
                   "--op", "torch.mm", "--op", "torch.add")
    con = sqlite3.connect(perf_db)
    stored = {op: json.loads(m)["latency"] for op, m in con.execute(
        "SELECT c.op, r.metrics FROM results r JOIN cases c USING (signature) WHERE r.run_id = ?", [run["run_id"]])}
    con.close()
    assert set(stored) == {"torch.mm", "torch.add"}
    mm = stored["torch.mm"]
    assert mm["flops"] == 2 * 192 ** 3 and mm["bytes"] == 3 * 192 * 192 * 4
    assert mm["target"]["median_s"] > 0 and mm["target"]["blocks"] >= 1 and mm["baseline"]["same_as_target"]
    assert mm["peaks"]["flops_per_s"] > 0 and mm["peaks"]["source"].startswith("measured on cpu")
    report = cli.json("report", "--run", run["run_id"])["latency"]
    by_op = {o["op"]: o for o in report["ops"]}
    assert by_op["torch.mm"]["speedup"] == 1.0 and report["measured"] == 2
    case = next(c for c in report["cases"] if c["op"] == "torch.mm")
    assert case["target_s"] == mm["target"]["median_s"] and case["limit"] in ("compute", "memory")
    assert 0 < case["roofline_fraction"] <= 1
    assert run["latency"] == {"measured": 2, "cost_s": report["cost_s"], "speedup": 1.0, "baseline": "eager"}
    # and in Datasette: the `latencies` query, as `casedb serve` serves it
    with runs_data.Server(perf_db, perf_db.parent / "serve.log") as server:
        rows = server.json("/casedb/latencies.json?" + urllib.parse.urlencode({"op": "torch.mm", "_shape": "array"}))
    assert [(r["op"], r["target_us"], r["flops"], r["speedup"]) for r in rows] == [
        ("torch.mm", mm["target"]["median_s"] * 1e6, 2 * 192 ** 3, 1.0)]


def test_a_run_without_measure_has_no_latency(cli, perf_db):
    run = cli.json("run", "--device", "cpu", "--backend", "eager", "-m", "", "-k", "add")
    assert run["latency"] is None and cli.json("report")["latency"] is None
    assert "Speedup per op" not in cli("report").stdout


@pytest.mark.parametrize("budget", ["0", "nan", "1000"])
def test_the_measure_budget_is_bounded(cli, perf_db, budget):
    result = cli("run", "--measure", "--measure-budget", budget, "--device", "cpu", "--backend", "eager")
    assert result.exit_code == 2 and "--measure-budget takes seconds from 0.01 to 600" in result.stderr


def test_the_rank_test_and_geometric_mean():
    assert latency.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) < 0.02
    assert latency.mann_whitney_p([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) > 0.5
    assert latency.mann_whitney_p([1, 2, 3], [4, 5, 6]) is None  # too few to say
    assert latency.geomean([2.0, 0.5, None]) == 1.0


def test_measured_figures_that_are_not_finite_are_stored_as_text():
    """A result's metrics are figures of a backend's output: an infinity there is stored as text (JSON
    SQLite reads), where a setting that is not finite is refused."""
    import sqlite3 as sq

    from casedb.serial import NonFiniteValue, dumps, dumps_measured

    text = dumps_measured({"ulp": float("inf"), "xs": [1.5, float("nan")], "latency": {"speedup": 2.0}})
    assert text == '{"latency":{"speedup":2.0},"ulp":"inf","xs":[1.5,"nan"]}'
    assert sq.connect(":memory:").execute("SELECT json_valid(?)", [text]).fetchone() == (1,)
    with pytest.raises(NonFiniteValue):
        dumps({"rtol": float("inf")})
