"""`casedb run --measure`: latencies measured with torch.utils.benchmark, stored per result, read
back by `casedb report` (text and --json), the run summary and Datasette; a backend slower on
matmul-like ops is flagged there and nowhere else, a 5 % slower one and an unchanged rerun are not."""

from __future__ import annotations

import json
import random
import sqlite3
import statistics
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
def test_a_backend_slower_on_matmul_is_flagged_there(cli, perf_db):
    """End to end, a real 1.5x slowdown: flagged on the matmul-like ops, in --json and text. Whether
    an unchanged or a 1.05x backend stays unflagged depends on how quiet the machine is between two
    runs (a loaded 2-core CI box is not), so that is checked on the runs' own stored times below."""
    plain = _measured_run(cli, "casedb_test_plain")
    assert plain["latency"]["measured"] == 6 and plain["latency"]["baseline"] == "eager"
    slow = _measured_run(cli, "casedb_test_slow_mm_150")
    lat = cli.json("report", "--run", slow["run_id"], "--compare", plain["run_id"], "--latency-threshold", "25")["latency"]
    slower = {e["op"] for e in lat["slower"]}
    assert MATMUL_LIKE <= slower and lat["threshold"] == 0.25
    assert all(e["ratio"] > 1.25 and e["raw_ratio"] > 1.25 and e["p_value"] < 0.01 for e in lat["slower"])
    assert MATMUL_LIKE <= {o["op"] for o in lat["ops_slower"]}
    text = cli("report", "--run", slow["run_id"], "--compare", plain["run_id"]).stdout
    assert f"Latency: slower vs run {plain['run_id']} (beyond 10.0% and the noise)" in text
    assert "torch.bmm" in text.split("Latency: slower")[1]
    _noise_and_small_changes_are_not_flagged(perf_db, plain["run_id"])


def _scaled(lat: dict, factor: float, jitter: list[float]) -> dict:
    """``lat`` (a stored latency) as if the target took ``factor`` times as long, each block off by
    its ``jitter`` (the baseline beside it too: the load both share)."""
    target = dict(lat["target"], times=[t * factor * j for t, j in zip(lat["target"]["times"], jitter)])
    target["median_s"] = statistics.median(target["times"])
    out = dict(lat, target=target)
    if lat.get("relative"):
        out["relative"] = dict(lat["relative"], ratio=lat["relative"]["ratio"] * factor)
    return out


def _noise_and_small_changes_are_not_flagged(db, run_id: int) -> None:
    rng = random.Random(0)
    from casedb.store import latency as stored
    with sqlite3.connect(db) as con:
        rows = stored.measured(con, run_id)
    assert len(rows) == 6
    checked = 0
    for row in rows:
        lat = row["latency"]
        jitter = [rng.uniform(0.97, 1.03) for _ in lat["target"]["times"]]
        moved = {f: latency._moved({**row, "latency": _scaled(lat, f, jitter)}, row, latency.DEFAULT_THRESHOLD)
                 for f in (1.0, 1.05, 0.95, 1.5)}
        assert moved[1.0] is None and moved[1.05] is None and moved[0.95] is None, (row["op"], moved)
        if abs(lat["target"]["median_s"] * 0.5) >= latency.MIN_CHANGE_S and len(lat["target"]["times"]) >= 5:
            assert moved[1.5] is not None and moved[1.5]["ratio"] > 1.4, (row["op"], moved)
            checked += 1
    assert checked >= 3  # the 1.5x change is checked where it is measurable (5 us, 5 blocks)


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


@pytest.mark.parametrize("threshold", ["0", "-5", "1000"])
def test_the_latency_threshold_is_a_percentage_in_range(cli, perf_db, threshold):
    result = cli("report", "--latency-threshold", threshold)
    assert result.exit_code != 0 and "--latency-threshold takes a percentage above 0 and below 1000" in result.output
