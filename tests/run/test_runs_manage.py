"""`casedb runs`: list, label and delete recorded runs."""

from __future__ import annotations

import runs_data
from tests.helpers import rows, sha256_of


def test_runs_lists_newest_first_with_target_and_label(cli, tmp_path, db_path):
    first, second = runs_data.two_runs(cli, tmp_path, db_path)
    third = runs_data.record_run(db_path, runs_data.RUN1, backend="eager")
    assert cli("runs", "label", first, "nightly 1").exit_code == 0
    listed = cli.json("runs")
    assert [(r["run_id"], r["label"], r["device"], r["backend"]) for r in listed] == [
        (third, None, "cpu", "eager"), (second, None, "cpu", "inductor"), (first, "nightly 1", "cpu", "inductor")]
    assert [r["run_id"] for r in cli.json("runs", "--backend", "inductor")] == [second, first]
    assert [r["run_id"] for r in cli.json("runs", "--label", "nightly*")] == [first]
    assert [r["run_id"] for r in cli.json("runs", "--limit", "1")] == [third]


def test_piped_listing_is_one_line_per_run(cli, tmp_path, db_path):
    first, second = runs_data.two_runs(cli, tmp_path, db_path)
    cli("runs", "label", first, "a label long enough to wrap in a table column")
    out = cli("runs").stdout  # CliRunner's stdout is not a terminal
    lines = out.splitlines()
    assert lines[0].split("\t")[:5] == ["run", "label", "status", "device", "backend"]
    assert [ln.split("\t")[:2] for ln in lines[1:]] == [
        [str(second), ""], [str(first), "a label long enough to wrap in a table column"]]
    assert "┃" in cli("runs", "--format", "table").stdout


def test_label_is_cleared_and_bad_labels_are_refused(cli, tmp_path, db_path):
    first, _ = runs_data.two_runs(cli, tmp_path, db_path)
    cli("runs", "label", first, "x")
    assert cli("runs", "label", first, "--clear").exit_code == 0
    assert rows(db_path, "SELECT label FROM runs WHERE id = ?", [first]) == [{"label": None}]
    bad = cli("runs", "label", first, "two\nlines")
    assert bad.exit_code == 2 and "a run label is 1 to 200 printable characters" in bad.stderr
    missing = cli("runs", "label", 99, "x")
    assert missing.exit_code == 2 and "no run 99" in missing.stderr


def test_delete_removes_the_run_with_its_results_and_judgements_only(cli, tmp_path, db_path):
    first, second = runs_data.two_runs(cli, tmp_path, db_path)
    before = {t: rows(db_path, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in ("cases", "model_cases")}
    kept = rows(db_path, "SELECT count(*) AS n FROM judgements WHERE run_id = ?", [second])[0]["n"]
    done = cli.json("runs", "delete", first)
    assert done["runs"] == 1 and done["run_ids"] == [first] and done["results"] > 0 and done["judgements"] > 0
    assert [r["id"] for r in rows(db_path, "SELECT id FROM runs")] == [second]
    assert rows(db_path, "SELECT count(*) AS n FROM results WHERE run_id = ?", [first]) == [{"n": 0}]
    assert rows(db_path, "SELECT count(*) AS n FROM judgements WHERE run_id = ?", [second]) == [{"n": kept}]
    assert {t: rows(db_path, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in ("cases", "model_cases")} == before
    # the per-run counts the report reads are kept by triggers: none left for the deleted run
    assert rows(db_path, "SELECT count(*) AS n FROM judgement_counts WHERE run_id = ?", [first]) == [{"n": 0}]


def test_delete_of_a_missing_run_changes_nothing(cli, tmp_path, db_path):
    first, second = runs_data.two_runs(cli, tmp_path, db_path)
    digest = sha256_of(db_path)
    result = cli("runs", "delete", first, 42)
    assert result.exit_code == 2 and "no run 42" in result.stderr
    assert sha256_of(db_path) == digest


def test_report_defaults_to_the_newest_run_that_is_not_a_mutant_run(cli, tmp_path, db_path):
    first, second = runs_data.two_runs(cli, tmp_path, db_path)
    mutant = runs_data.record_run(db_path, runs_data.RUN1, backend="casedb_mutant_zeros")
    cli("runs", "label", mutant, "mutant:zeros")
    assert cli.json("report")["run"]["run_id"] == second
    assert [r["run_id"] for r in cli.json("runs", "--no-mutants")] == [second, first]
