"""`casedb report` and the metric views it reads (two recorded runs, see tests/runs_data.py)."""

import sqlite3

import pytest
import sqlite_utils

from tests import runs_data
from tests.helpers import rows

def repro(db_path, name: str, run_id: int = 2) -> str:
    """The repro command a report shows: the case by signature prefix (a name can hold anything),
    as run ``run_id`` (the second of two_runs) judged it."""
    sig = rows(db_path, "SELECT signature FROM model_cases WHERE name = ?", [name])[0]["signature"]
    model = rows(db_path, "SELECT model FROM model_cases WHERE name = ?", [name])[0]["model"]
    return f"casedb repro {sig[:16]} --model {model} --device cpu --backend inductor --run {run_id}"


def a_silu_regression(db_path) -> dict:
    return {
        "model": "model_a", "case_name": "a_silu", "op": "torch.nn.functional.silu", "inputs": "bf16[1, 11, 5760]",
        "dtype": "bfloat16", "base_outcome": "passed", "outcome": "failed", "base_max_abs_err": 2.0e-3,
        "max_abs_err": 0.5, "err_growth": pytest.approx(250.0), "error_type": "AssertionError",
        "error_message": "max abs error 0.5 exceeds tolerance", "rtol": 0.01, "atol": 0.01,
        "repro": repro(db_path, "a_silu"),
    }


@pytest.fixture
def two_runs(cli, tmp_path, db_path):
    return runs_data.two_runs(cli, tmp_path, db_path)




def test_compare_names_exactly_the_case_that_flipped_to_fail(cli, two_runs, db_path):
    first, second = two_runs
    report = cli.json("report", "--compare", first)
    assert report["run"]["run_id"] == second
    assert report["baseline"] == {"run_id": first, "started_at": "2025-01-01T00:00:00+00:00", "status": "finished",
                                  "device": "cpu", "backend": "inductor", "source": "--compare"}
    assert report["regressions"] == [a_silu_regression(db_path)]
    # the other changes between the runs are not regressions
    assert [(r["model"], r["case_name"], r["base_outcome"], r["outcome"]) for r in report["fixes"]] == [
        ("model_a", "a_mul", "failed", "passed"), ("model_a", "a_softmax", "xfailed", "xpassed")]
    assert [(r["case_name"], r["err_growth"]) for r in report["error_growth"]] == [
        ("a_silu", pytest.approx(250.0)), ("b_rsqrt", pytest.approx(100.0))]


def test_default_baseline_is_the_previous_run_on_the_same_target(cli, two_runs, db_path):
    first, second = two_runs
    report = cli.json("report")
    assert report["baseline"]["run_id"] == first
    assert report["baseline"]["source"] == "previous run on the same device and backend"
    assert report["regressions"] == [a_silu_regression(db_path)]
    # the first run has nothing before it
    report = cli.json("report", "--run", first)
    assert (report["baseline"], report["regressions"], report["fixes"]) == (None, [], [])
    assert "no baseline: this is the first run" in cli("report", "--run", first).stdout


def test_pass_rates_per_model_and_op_use_each_occurrences_verdict(cli, two_runs):
    report = cli.json("report")
    # totals count cases as `casedb run` does (the shared add once; passed without xpassed)
    assert report["totals"] == {"executed": 5, "passed": 3, "failed": 1, "errors": 0, "crashed": 0, "timeouts": 0,
                                "xfailed": 0, "xpassed": 1, "ref_errors": 0, "not_exercised": 0, "skipped": 0,
                                "occurrences": 6, "pass_rate": 80.0}
    assert report["models"] == [
        {"model": "model_a", "occurrences": 4, "executed": 4, "passed": 3, "failed": 1, "errors": 0, "xfailed": 0,
         "xpassed": 1, "skipped": 0, "ref_errors": 0, "not_exercised": 0, "pass_rate": 75.0, "ops": 4, "ops_passing": 3,
         "ops_pass_rate": 75.0, "signatures": 4},
        {"model": "model_b", "occurrences": 2, "executed": 2, "passed": 2, "failed": 0, "errors": 0, "xfailed": 0,
         "xpassed": 0, "skipped": 0, "ref_errors": 0, "not_exercised": 0, "pass_rate": 100.0, "ops": 2, "ops_passing": 2,
         "ops_pass_rate": 100.0, "signatures": 2},
    ]
    assert report["ops"][0] == {"op": "torch.nn.functional.silu", "occurrences": 1, "executed": 1, "passed": 0,
                                "failed": 1, "errors": 0, "xfailed": 0, "xpassed": 0, "skipped": 0, "ref_errors": 0,
                                "pass_rate": 0.0, "models": 1}
    # torch.add is one case shared by both models: two occurrences, executed once
    add = next(o for o in report["ops"] if o["op"] == "torch.add")
    assert (add["occurrences"], add["passed"], add["models"]) == (2, 2, 2)


def test_first_run_counts_xfail_as_executed_not_passed(cli, two_runs):
    first, _ = two_runs
    report = cli.json("report", "--run", first)
    a = report["models"][0]
    assert (a["model"], a["passed"], a["failed"], a["xfailed"], a["executed"], a["pass_rate"],
            a["ops_passing"]) == ("model_a", 2, 1, 1, 4, 50.0, 2)


def test_remove_xfail_lists_the_marked_case_that_passes(cli, two_runs):
    report = cli.json("report")
    assert [(r["model"], r["case_name"], r["outcome"]) for r in report["remove_xfail"]] == [
        ("model_a", "a_softmax", "xpassed")]
    text = cli("report").stdout
    assert "Remove xfail (marked xfail, now passing)" in text
    assert "model_a::a_softmax" in text  # the case column does not wrap


def test_failures_dedupe_runtime_and_trend(cli, two_runs, db_path):
    first, second = two_runs
    report = cli.json("report", "--top", 2)
    assert [(f["model"], f["case_name"], f["outcome"], f["repro"]) for f in report["failures"]] == [
        ("model_a", "a_silu", "failed", repro(db_path, "a_silu"))]
    # 6 occurrences judged, 5 cases executed: model_b's residual add is model_a's a_add
    assert report["dedupe"] == {"occurrences": 6, "executions": 5, "saved": 1, "ratio": 1.2}
    rt = report["runtime"]
    assert (rt["t_ref"], rt["t_compile"], rt["t_exec"]) == pytest.approx((0.008, 2.23, 0.114))
    assert rt["total"] == pytest.approx(2.352)
    assert rt["mean_per_case"] == pytest.approx(2.352 / 5)
    assert [(s["op"], s["models"], s["t_total"]) for s in rt["slowest"]] == [
        ("torch.mul", "model_a", pytest.approx(1.603)), ("torch.nn.functional.silu", "model_a", pytest.approx(0.71))]
    assert [(t["run_id"], t["pass_rate"], t["new_regressions"]) for t in report["trend"]] == [
        (second, 83.33, 1), (first, 66.67, 0)]


def test_compare_across_backends_and_errors(cli, two_runs, db_path):
    first, second = two_runs
    third = runs_data.record_run(db_path, runs_data.RUN1, backend="eager", started_at="2025-01-03T00:00:00+00:00")
    report = cli.json("report")
    assert report["run"]["run_id"] == third and report["baseline"] is None
    report = cli.json("report", "--compare", second)
    # run 2 -> run 3: a_silu failed -> passed, a_mul passed -> failed; a_softmax xpassed -> xfailed
    # is neither (its failure is known: it is marked xfail)
    assert [r["case_name"] for r in report["fixes"]] == ["a_silu"]
    assert [r["case_name"] for r in report["regressions"]] == ["a_mul"]
    for args, message in ((("--run", 99), "no run 99 (--run); recent runs: 3, 2, 1"),
                          (("--compare", 42), "no run 42 (--compare)"),
                          (("--compare", third), "is the run being reported"),
                          (("--error-factor", 1), "--error-factor must be greater than 1")):
        result = cli("report", *args)
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_no_runs_says_how_to_record_one(cli, tmp_path):
    runs_data.import_manifests(cli, tmp_path)
    result = cli("report")
    assert result.exit_code == 2
    assert "no runs recorded in this database yet" in result.output
    assert "casedb run --model" in result.output


def test_markdown_summary_for_a_ci_page(cli, two_runs, db_path):
    md = cli("report", "--markdown").stdout
    assert md.startswith("## casedb run 2: cpu/inductor, finished")
    assert "### Regressions vs run 1" in md
    assert ("| model_a::a_silu | torch.nn.functional.silu | bf16[1, 11, 5760] | passed | failed | 0.002 | 0.5 "
            "| max abs error 0.5 exceeds tolerance |") in md
    assert "| model_a::a_softmax | torch.nn.functional.softmax | bf16[1, 64, 11, 11] " \
           f"| `{repro(db_path, 'a_softmax')}` |" in md
    assert "| model_a | 75.0% | 3/4 | 1 | 0 | 0 | 0 | 3/4 (75.0%) | 4 |" in md


def test_tables_show_the_line_that_says_what_failed_and_json_all_of_it(cli, two_runs, db_path):
    """A compile error's 60-line message would make each table row a page: the one line that says
    what went wrong (not dynamo's "backend=... raised:")."""
    first, second = two_runs
    message = "backend='inductor' raised:\nGuardOnDataDependentSymNode: Could not extract specialized integer " \
              "from u0\n\n" + "\n".join(f"  File line {i}" for i in range(60))
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE results SET error_message = ? WHERE run_id = ? AND model_case_id ="
                     " (SELECT id FROM model_cases WHERE name = 'a_silu')", [message, second])
    conn.close()
    md = cli("report", "--markdown").stdout
    assert "| GuardOnDataDependentSymNode: Could not extract specialized integer from u0 |" in md
    assert "File line" not in md and "File line" not in cli("report").stdout
    assert cli.json("report")["regressions"][0]["error_message"] == message


def test_limit_truncates_lists_but_not_json(cli, two_runs):
    md = cli("report", "--markdown", "--limit", 1).stdout
    assert "... and 4 more (see --json)" in md  # 5 ops, one shown
    assert len(cli.json("report", "--limit", 1)["ops"]) == 5


def test_judgement_counts_follow_inserts_updates_and_deletes(cli, two_runs, db_path):
    def counted():
        return rows(db_path, "SELECT run_id, model, op, outcome, n FROM judgement_counts ORDER BY 1, 2, 3, 4")

    def recounted():
        return rows(db_path, "SELECT j.run_id, j.model, c.op, j.outcome, count(*) AS n FROM judgements j"
                             " JOIN cases c USING (signature) GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4")

    assert counted() == recounted() and len(counted()) == 12
    con = sqlite3.connect(db_path)
    with con:
        con.execute("UPDATE judgements SET outcome = 'error' WHERE model = 'model_b' AND run_id = 2")
        con.execute("DELETE FROM judgements WHERE model = 'model_a' AND run_id = 1 AND outcome = 'passed'")
    con.close()
    assert counted() == recounted()
    report = cli.json("report")
    assert [(m["model"], m["errors"], m["pass_rate"]) for m in report["models"]] == [
        ("model_b", 2, 0.0), ("model_a", 0, 75.0)]


def test_view_migration_is_idempotent(cli, two_runs, db_path):
    from casedb.store.migrations import m100_views

    before = rows(db_path, "SELECT * FROM model_pass_rates ORDER BY run_id, model")
    db = sqlite_utils.Database(db_path)
    m100_views(db)
    m100_views(db)
    db.close()
    assert rows(db_path, "SELECT * FROM model_pass_rates ORDER BY run_id, model") == before
    from casedb.outcomes import OUTCOMES

    assert rows(db_path, "SELECT count(*) AS n FROM outcome_classes") == [{"n": len(OUTCOMES)}]


def test_case_names_and_descriptions_are_searchable(cli, two_runs, db_path, tmp_path):
    def search(q):
        return [r["name"] for r in rows(db_path, "SELECT mc.name FROM model_cases_fts f JOIN model_cases mc"
                                                 " ON mc.id = f.rowid WHERE model_cases_fts MATCH ? ORDER BY mc.name",
                                        [q])]

    assert search("residual") == ["a_add", "b_residual"]
    # re-importing a changed description updates the index (the triggers, not serve, keep it)
    text = runs_data.MANIFEST_B.replace("residual add in the decoder block", "skip connection of the decoder")
    (tmp_path / "model_b.yaml").write_text(text, encoding="utf-8")
    assert cli("import", tmp_path / "model_b.yaml").exit_code == 0
    assert search("residual") == ["a_add", "b_residual"]  # b_residual's name still matches
    assert search("skip") == ["b_residual"]
    assert search("decoder") == ["b_residual"]
