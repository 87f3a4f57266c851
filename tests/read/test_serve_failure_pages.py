"""Issue 46, item 4: Datasette's failure pages lead somewhere (the real server on a loopback port).

From a failure a user reaches, in clicks, the case (its inputs), its run, its reason, its repro
command and the other cases of its cause; failures_by_cause shows the run and its example leads
to the case; the repro page is a field a row; the dashboard's axes tick whole numbers and show
expected failures apart from unexpected ones; the Model filter lists the models.
"""

from __future__ import annotations

import html as html_mod
import re
import urllib.parse

import pytest
import yaml

from tests import runs_data
from tests.read.test_serve import canned, judgement_id, repro_command, signature

SILU_CAUSE = "failed"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failure_pages")
    db = tmp / "cases.db"
    runs_data.two_runs(runs_data.make_cli(db), tmp, db)
    with runs_data.Server(db, tmp / "serve.log") as server:
        yield server


def links(page: str) -> set[str]:
    return {html_mod.unescape(h) for h in re.findall(r'<a href="([^"]+)"', page)}


def follow(served, href: str) -> str:
    status, page = served.get(href)
    assert status == 200, (href, page[:500])
    return page


def test_failures_by_cause_shows_the_run_and_leads_to_the_case_and_its_other_cases(served):
    sig = signature(served.db_path, "model_a", "a_silu")
    assert canned(served, "failures_by_cause") == [{
        "run_id": 2, "op": "torch.nn.functional.silu", "cause": SILU_CAUSE, "cases": 1, "example_signature": sig}]
    page = follow(served, "/casedb/failures_by_cause")
    to_cause = "/casedb/cause_cases?" + urllib.parse.urlencode(
        {"run": 2, "op": "torch.nn.functional.silu", "cause": SILU_CAUSE})
    assert {"/casedb/runs/2", f"/casedb/cases/{sig}", to_cause} <= links(page)
    # the case page shows its inputs; the cause's page every case of it, with reason and repro
    assert "bf16[1, 11, 5760]" in follow(served, f"/casedb/cases/{sig}")
    cases = served.json(to_cause.replace("cause_cases?", "cause_cases.json?") + "&_shape=array")
    assert [(c["model"], c["case_name"], c["reason"], c["repro"]) for c in cases] == [
        ("model_a", "a_silu", "failed at 0.5", repro_command(served.db_path, "model_a", "a_silu"))]
    assert f"/casedb/repro?judgement={cases[0]['judgement_id']}" in links(follow(served, to_cause))


def test_latest_failures_have_stage_reason_and_cause_and_lead_to_case_run_cause_and_repro(served):
    sig = signature(served.db_path, "model_a", "a_silu")
    jid = judgement_id(served.db_path, 2, "model_a", "a_silu")
    (row,) = canned(served, "latest_failures")
    assert (row["stage"], row["reason"], row["cause"], row["signature"]) == (None, "failed at 0.5", SILU_CAUSE, sig)
    got = links(follow(served, "/casedb/latest_failures"))
    assert {"/casedb/runs/2", f"/casedb/cases/{sig}", f"/casedb/repro?judgement={jid}",
            "/casedb/cause_cases?run=2&op=torch.nn.functional.silu&cause=failed"} <= got


def test_a_failure_page_is_a_field_a_row_and_leads_to_case_run_and_cause(served):
    jid = judgement_id(served.db_path, 2, "model_a", "a_silu")
    sig = signature(served.db_path, "model_a", "a_silu")
    fields = [r["field"] for r in canned(served, "repro", judgement=jid)]
    assert fields[:7] == ["command", "case", "inputs", "run", "outcome", "reason", "cause"]
    page = follow(served, f"/casedb/repro?judgement={jid}")
    assert f"<code>{repro_command(served.db_path, 'model_a', 'a_silu')}</code>" in page
    got = links(page)
    assert {f"/casedb/cases/{sig}", "/casedb/runs/2",
            "/casedb/cause_cases?run=2&op=torch.nn.functional.silu&cause=failed"} <= got
    assert "inductor" in follow(served, "/casedb/runs/2")


def test_a_link_is_built_from_checked_parts_only(served):
    """A `link` cell holds JSON a query wrote; anything else than a row page or a known query is no link."""
    sql = ("select '{\"path\": \"../../-/etc\"}' as link union all select '{\"query\": \"evil\", \"run\": 1}' "
           "union all select '{\"path\": \"runs/7\"}'")
    page = follow(served, "/casedb?" + urllib.parse.urlencode({"sql": sql}))
    made = {h for h in links(page) if "sql=" not in h}  # (Datasette's own links carry the query)
    assert "/casedb/runs/7" in made
    assert not any("etc" in h or "evil" in h for h in made)


def dashboard_charts() -> dict:
    meta = yaml.safe_load(open(runs_data.Path(__file__).parents[2] / "casedb" / "read" / "datasette_metadata.yaml"))
    return meta["plugins"]["datasette-dashboards"]["casedb"]


def chart_rows(served, name: str, **params) -> list[dict]:
    sql = dashboard_charts()["charts"][name]["query"]
    sql = re.sub(r"\[\[(.*?)\]\]", lambda m: m.group(1) if any(f":{p}" in m.group(1) for p in params) else "", sql)
    return served.json("/casedb.json?" + urllib.parse.urlencode({"sql": sql, **params, "_shape": "array"}))


def test_dashboard_shows_expected_failures_apart_and_ticks_whole_numbers(served):
    rows = chart_rows(served, "outcomes-over-runs")
    got = {(r["run_id"], r["kind"]): r["occurrences"] for r in rows}
    # run 1: a_softmax xfailed (expected), a_mul failed; run 2: a_softmax xpassed, a_silu failed
    assert got == {(2, "passed"): 4, (2, "expected failure"): 0, (2, "unexpected pass"): 1,
                   (2, "unexpected failure"): 1, (1, "passed"): 4, (1, "expected failure"): 1,
                   (1, "unexpected pass"): 0, (1, "unexpected failure"): 1}
    charts = dashboard_charts()["charts"]
    for name, axis in (("outcomes-over-runs", "y"), ("failures-by-op", "x")):
        ticks = charts[name]["display"]["encoding"][axis]["axis"]
        assert ticks["format"] == "d" and f"domain('{axis}')" in ticks["tickCount"]["expr"]
    status, page = served.get("/-/dashboards/casedb")
    assert status == 200 and 'id="chart-outcomes-over-runs"' in page
    model_filter = page[page.index('<select id="model"'):]
    assert re.findall(r'<option value="([^"]+)"', model_filter[:model_filter.index("</select>")]) == [
        "model_a", "model_b"]
