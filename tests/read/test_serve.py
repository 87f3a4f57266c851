"""`casedb serve`: the real Datasette server on a loopback port, over a DB with two recorded runs."""

import hashlib
import re
import sqlite3
import urllib.parse

import pytest
import yaml

from tests import runs_data


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    db = tmp / "cases.db"
    runs_data.two_runs(runs_data.make_cli(db), tmp, db)
    with runs_data.Server(db, tmp / "serve.log") as server:
        yield server


def one(db, sql, params=()):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, params).fetchone()
    finally:
        con.close()


def judgement_id(db, run_id, model, name):
    return one(db, "SELECT j.id FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id"
                   " WHERE j.run_id = ? AND mc.model = ? AND mc.name = ?", [run_id, model, name])[0]


def signature(db, model, name):
    return one(db, "SELECT signature FROM model_cases WHERE model = ? AND name = ?", [model, name])[0]


def repro_command(db, model, name, run_id: int = 2) -> str:
    """The repro command shown for a judged occurrence of run ``run_id``: the case by signature prefix."""
    return (f"casedb repro {signature(db, model, name)[:16]} --model {model} --device cpu --backend inductor"
            f" --run {run_id}")


def canned(served, name, **params):
    return served.json(f"/casedb/{name}.json?" + urllib.parse.urlencode({**params, "_shape": "array"}))


def test_latest_failures_and_regressions(served):
    db = served.db_path
    silu = {"run_id": 2, "model": "model_a", "case_name": "a_silu", "op": "torch.nn.functional.silu",
            "inputs": "bf16[1, 11, 5760]", "dtype": "bfloat16", "outcome": "failed", "stage": None,
            "reason": "failed at 0.5", "cause": "failed", "error_type": "AssertionError",
            "error_message": "max abs error 0.5 exceeds tolerance", "max_abs_err": 0.5, "rtol": 0.01, "atol": 0.01,
            "repro": repro_command(db, "model_a", "a_silu"),
            "judgement_id": judgement_id(db, 2, "model_a", "a_silu"), "signature": signature(db, "model_a", "a_silu")}
    assert canned(served, "latest_failures") == [silu]
    # an earlier run on request: run 1 failed a_mul (a_softmax xfailed: expected, not listed)
    assert [(r["run_id"], r["case_name"], r["outcome"]) for r in canned(served, "latest_failures", run=1)] == [
        (1, "a_mul", "failed")]
    assert canned(served, "latest_regressions") == [{
        "run_id": 2, "previous_run_id": 1, "device": "cpu", "backend": "inductor", "model": "model_a",
        "case_name": "a_silu", "op": "torch.nn.functional.silu", "inputs": "bf16[1, 11, 5760]", "dtype": "bfloat16",
        "previous_outcome": "passed", "outcome": "failed", "error_type": "AssertionError",
        "error_message": "max abs error 0.5 exceeds tolerance", "previous_max_abs_err": 0.002, "max_abs_err": 0.5,
        "rtol": 0.01, "atol": 0.01, "repro": repro_command(db, "model_a", "a_silu"),
        "judgement_id": silu["judgement_id"]}]


def test_canned_queries_do_not_shadow_tables(served):
    """A canned query named like a table hides the table's page: keep the names apart."""
    database = served.json("/casedb.json")
    tables = {t["name"] for t in database["tables"]} | {v["name"] for v in database["views"]}
    queries = {q["name"] for q in database["queries"]}
    assert queries == {"latest_failures", "failures_by_cause", "latest_regressions", "pass_rate_by_model", "slowest_cases",
                       "model_cases_by_op", "repro", "blocking_ops", "model_op_matrix", "cause_cases",
                       "explained_causes", "latencies", "missing_kernels", "blocked_cases"}
    assert {"verdicts", "model_pass_rates", "op_pass_rates", "regressions", "run_summaries"} <= tables
    assert not queries & tables
    # the regressions view, every run, page by page
    assert [(r["run_id"], r["case_name"]) for r in served.json("/casedb/regressions.json?_shape=array")] == [
        (2, "a_silu")]


def test_pass_rate_by_model(served):
    common = {"run_id": 2, "device": "cpu", "backend": "inductor", "errors": 0, "xfailed": 0, "skipped": 0,
              "ref_errors": 0, "enabled_cases_pct": None, "enabled_ops_pct": None, "enabled_aten_ops_pct": None,
              "coverage_id": None}  # (casedb coverage never ran: tests/device/test_coverage_stored.py)
    assert canned(served, "pass_rate_by_model") == [
        {**common, "model": "model_a", "pass_rate": 75.0, "executed": 4, "passed": 3, "failed": 1, "xpassed": 1,
         "ops": 4, "ops_passing": 3, "ops_pass_rate": 75.0, "signatures": 4},
        {**common, "model": "model_b", "pass_rate": 100.0, "executed": 2, "passed": 2, "failed": 0, "xpassed": 0,
         "ops": 2, "ops_passing": 2, "ops_pass_rate": 100.0, "signatures": 2},
    ]
    assert [(r["run_id"], r["model"], r["pass_rate"]) for r in canned(served, "pass_rate_by_model", run=1)] == [
        (1, "model_a", 50.0), (1, "model_b", 100.0)]


def test_blocking_ops_and_model_op_matrix(served):
    # run 2 (the latest): a_silu fails, so silu blocks model_a, and alone
    assert canned(served, "blocking_ops") == [{
        "run_id": 2, "device": "cpu", "backend": "inductor", "op": "torch.nn.functional.silu", "models_blocked": 1,
        "models": 1, "unblocks": 1, "failing": 1, "occurrences": 1, "blocked_models": "model_a (1/1)"}]
    # run 1: a_mul failed and a_softmax xfailed (a known failure still blocks): neither alone
    assert [(r["op"], r["models_blocked"], r["unblocks"]) for r in canned(served, "blocking_ops", run=1)] == [
        ("torch.mul", 1, 0), ("torch.nn.functional.softmax", 1, 0)]
    assert canned(served, "model_op_matrix", run=1) == [
        {"op": "torch.mul", "model": "model_a", "failing": 1, "occurrences": 1, "cell": "1/1", "blocked": 1},
        {"op": "torch.nn.functional.softmax", "model": "model_a", "failing": 1, "occurrences": 1, "cell": "1/1",
         "blocked": 1}]


def test_slowest_cases(served):
    rows = canned(served, "slowest_cases")
    assert len(rows) == 5
    assert rows[:2] == [
        {"run_id": 2, "op": "torch.mul", "inputs": "bf16[1, 11, 2880], bf16[1, 11, 2880]", "dtype": "bfloat16",
         "models": "model_a", "outcome": "passed", "t_ref": 0.003, "t_compile": 1.5, "t_exec": 0.1,
         "t_total": pytest.approx(1.603), "signature": signature(served.db_path, "model_a", "a_mul")},
        {"run_id": 2, "op": "torch.nn.functional.silu", "inputs": "bf16[1, 11, 5760]", "dtype": "bfloat16",
         "models": "model_a", "outcome": "failed", "t_ref": 0.002, "t_compile": 0.7, "t_exec": 0.008,
         "t_total": pytest.approx(0.71), "signature": signature(served.db_path, "model_a", "a_silu")},
    ]
    # the case both models share names both
    assert "model_a, model_b" in [r["models"] for r in rows]


def test_cases_of_one_model_by_op(served):
    db = served.db_path
    # model names match as everywhere in casedb: case-insensitive, - and _ alike
    rows = canned(served, "model_cases_by_op", model="Model-A", op="")
    assert [(r["op"], r["case_name"], r["latest_outcome"]) for r in rows] == [
        ("torch.add", "a_add", "passed"), ("torch.mul", "a_mul", "passed"),
        ("torch.nn.functional.silu", "a_silu", "failed"), ("torch.nn.functional.softmax", "a_softmax", "xpassed")]
    assert canned(served, "model_cases_by_op", model="model_b", op="torch.rsqrt") == [
        {"op": "torch.rsqrt", "case_name": "b_rsqrt", "inputs": "bf16[1, 11, 1]", "dtype": "bfloat16", "calls": 1,
         "rtol": None, "atol": None, "latest_outcome": "passed", "description": None,  # its own: none
         "signature": signature(db, "model_b", "b_rsqrt")}]


def test_failure_links_to_its_repro_command(served):
    jid = judgement_id(served.db_path, 2, "model_a", "a_silu")
    status, html = served.get("/casedb/latest_failures")
    assert status == 200
    command = repro_command(served.db_path, "model_a", "a_silu")
    assert (f'<a href="/casedb/repro?judgement={jid}" title="the error this command reproduces">'
            f"<code>{command}</code></a>") in html
    sig = signature(served.db_path, "model_a", "a_silu")
    assert {r["field"]: r["value"] for r in canned(served, "repro", judgement=jid)} == {
        "command": command, "case": "model_a::a_silu", "inputs": "bf16[1, 11, 5760] (bfloat16)",
        "run": "run 2 on cpu/inductor", "outcome": "failed", "reason": "failed at 0.5",
        "cause": "torch.nn.functional.silu: failed", "error": "AssertionError: max abs error 0.5 exceeds tolerance",
        "tolerance": "rtol 0.01, atol 0.01", "max error": "abs 0.5, rel 1.0"}
    assert {r["field"]: r["link"] for r in canned(served, "repro", judgement=jid) if r["link"]}["case"] == (
        '{"path":"cases/' + sig + '"}')


def test_tensor_specs_render_readably(served):
    status, html = served.get("/casedb/cases?op=torch.nn.functional.silu")
    assert status == 200
    # the spec shown as dtype[shape]; the raw JSON kept in the title
    assert ('<span class="casedb-inputs" title="[{&#34;tensor&#34;:{&#34;dtype&#34;:&#34;bfloat16&#34;,'
            '&#34;init&#34;:&#34;randn&#34;,&#34;shape&#34;:[1,11,5760]}}]">bf16[1, 11, 5760]</span>') in html


def test_writes_are_refused(served):
    before = hashlib.sha256(served.db_path.read_bytes()).hexdigest()
    for path in ("/casedb/models", "/casedb/latest_failures", "/casedb/models/-/insert"):
        status, body = served.get(path, method="POST", data=b'{"row": {"name": "x"}}')
        assert (status, body) == (405, "casedb serve is read-only: browse and query (GET), nothing is written "
                                        "to the database\n")
    status, body = served.get("/casedb.json?" + urllib.parse.urlencode(
        {"sql": "INSERT INTO models (name, key) VALUES ('x', 'x')"}))
    assert status == 400 and "Statement must be a SELECT" in body
    assert [(d["name"], d["is_mutable"]) for d in served.json("/-/databases.json")] == [("casedb", False)]
    assert hashlib.sha256(served.db_path.read_bytes()).hexdigest() == before
    assert served.json("/casedb/models.json?_shape=array&_col=name") == [{"name": "model_a"}, {"name": "model_b"}]


def test_facets(served):
    data = served.json("/casedb/verdicts.json?_size=0")  # the facets from the shipped metadata
    facets = data["facet_results"]
    assert sorted(facets) == ["backend", "device", "dtype", "model", "op", "outcome"]
    assert [(f["value"], f["count"]) for f in facets["outcome"]["results"]] == [
        ("passed", 8), ("failed", 2), ("xfailed", 1), ("xpassed", 1)]
    assert [(f["value"], f["count"]) for f in facets["model"]["results"]] == [("model_a", 8), ("model_b", 4)]
    # a facet value selected filters the rows and the other facets
    data = served.json("/casedb/verdicts.json?outcome=failed&_facet=op&_shape=objects")
    assert sorted((r["run_id"], r["case_name"]) for r in data["rows"]) == [(1, "a_mul"), (2, "a_silu")]
    assert [(f["value"], f["count"]) for f in data["facet_results"]["op"]["results"]] == [
        ("torch.mul", 1), ("torch.nn.functional.silu", 1)]
    cases = served.json("/casedb/cases.json?_size=0")["facet_results"]
    assert [(f["value"], f["count"]) for f in cases["op"]["results"]] == [
        ("torch.add", 1), ("torch.mul", 1), ("torch.nn.functional.silu", 1), ("torch.nn.functional.softmax", 1),
        ("torch.rsqrt", 1)]


def test_full_text_search_and_sort_order(served):
    rows = served.json("/casedb/model_cases.json?_search=decoder&_shape=array")
    assert [(r["model"], r["name"]) for r in rows] == [("model_b", "b_residual")]
    runs = served.json("/casedb/runs.json?_shape=array")
    assert [r["id"] for r in runs] == [2, 1]  # newest first


def test_chart_queries_answer(served):
    """The dashboard's SQL, as the chart JavaScript fetches it (the browser test draws it)."""
    status, html = served.get("/-/dashboards/casedb")
    assert status == 200
    assert 'id="chart-pass-rate-over-runs"' in html and 'id="chart-failures-by-op"' in html
    charts = yaml.safe_load(open(runs_data.Path(__file__).parents[2] / "casedb" / "read" / "datasette_metadata.yaml"))[
        "plugins"]["datasette-dashboards"]["casedb"]["charts"]

    def chart(name, **params):
        sql = charts[name]["query"]
        # datasette-dashboards keeps a [[ ... ]] block when its parameter is given, else drops it
        sql = re.sub(r"\[\[(.*?)\]\]", lambda m: m.group(1) if any(f":{p}" in m.group(1) for p in params) else "", sql)
        qs = urllib.parse.urlencode({"sql": sql, **params, "_shape": "array"})
        return served.json(f"/casedb.json?{qs}")

    assert [(r["run_id"], r["model"], r["pass_rate"]) for r in chart("pass-rate-over-runs")] == [
        (2, "model_a", 75.0), (2, "model_b", 100.0), (1, "model_a", 50.0), (1, "model_b", 100.0)]
    assert [(r["run_id"], r["pass_rate"]) for r in chart("pass-rate-over-runs", model="model_a")] == [
        (2, 75.0), (1, 50.0)]
    assert chart("failures-by-op") == [{"op": "torch.nn.functional.silu", "failed": 1, "errors": 0, "failures": 1}]


def test_pass_rate_chart_has_a_series_per_target_and_leaves_mutant_runs_out(tmp_path):
    db = tmp_path / "targets.db"
    cli = runs_data.make_cli(db)
    runs_data.import_manifests(cli, tmp_path)
    runs_data.record_run(db, runs_data.RUN1, backend="inductor")
    runs_data.record_run(db, runs_data.RUN2, backend="eager")
    mutant = runs_data.record_run(db, runs_data.RUN1, backend="casedb_mutant_zeros")
    assert cli("runs", "label", mutant, "mutant:zeros").exit_code == 0
    charts = yaml.safe_load(open(runs_data.Path(__file__).parents[2] / "casedb" / "read" / "datasette_metadata.yaml"))[
        "plugins"]["datasette-dashboards"]["casedb"]
    sql = re.sub(r"\[\[.*?\]\]", "", charts["charts"]["pass-rate-over-runs"]["query"])
    with runs_data.Server(db, tmp_path / "serve.log") as server:
        rows = server.json("/casedb.json?" + urllib.parse.urlencode({"sql": sql, "_shape": "array"}))
        status, html = server.get("/-/dashboards/casedb")
    assert [(r["run_id"], r["model"], r["target"]) for r in rows] == [
        (2, "model_a", "cpu/eager · all models"), (2, "model_b", "cpu/eager · all models"),
        (1, "model_a", "cpu/inductor · all models"), (1, "model_b", "cpu/inductor · all models")]
    assert charts["charts"]["pass-rate-over-runs"]["display"]["encoding"]["strokeDash"]["field"] == "target"
    assert '<option value="eager" >eager</option>' in html and '<option value="inductor" >inductor</option>' in html


def test_serve_an_empty_db(tmp_path):
    db = tmp_path / "empty.db"
    runs_data.import_manifests(runs_data.make_cli(db), tmp_path)
    with runs_data.Server(db, tmp_path / "serve.log") as server:
        assert canned(server, "latest_failures") == []
        assert canned(server, "pass_rate_by_model") == []
        assert len(canned(server, "model_cases_by_op", model="model_a", op="")) == 4
        log = (tmp_path / "serve.log").read_text()
        assert f"serving {db.resolve()} read-only at http://127.0.0.1:{server.port}/casedb" in log


def test_serve_refuses_a_db_being_written(tmp_path):
    """Served immutable, a file a run is still writing would be read half-written: say so instead."""
    from casedb.errors import CasedbError
    from casedb.read.serve import prepare

    db = tmp_path / "busy.db"
    runs_data.import_manifests(runs_data.make_cli(db), tmp_path)
    writer = sqlite3.connect(db)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO runs (started_at, status) VALUES ('2025-01-01', 'running')")
    try:
        with pytest.raises(CasedbError, match=re.escape("busy.db is being written (a run in progress?); serve it")):
            prepare(db)
        result = runs_data.make_cli(db)("serve", "--port", runs_data.free_port())
        assert result.exit_code == 2
        assert "is being written (a run in progress?)" in result.output
    finally:
        writer.rollback()
        writer.close()
    assert prepare(db) == db.resolve()
