"""Failures grouped by cause: op × stage × normalized first error line, or a wrong result's pattern."""

from __future__ import annotations

from pathlib import Path

import pytest

from casedb import causes

DATA = Path(__file__).parents[1] / "data" / "causes"
ZEROS = ("--backend", "casedb_mutant_zeros", "--import", "casedb.mutation.mutants", "--no-shipped-triage")


def test_what_varies_from_case_to_case_reads_alike():
    a = "LoweringException: no lowering for aten.rsqrt at 0x7f3a10 in /usr/lib/x/y.py, shape [1, 11, 2880]\nmore"
    b = "LoweringException: no lowering for aten.rsqrt at 0x55aa00 in /opt/venv/z.py, shape [4, 64]"
    assert causes.normalize(a) == causes.normalize(b) == (
        "LoweringException: no lowering for aten.rsqrt in <path>, shape [N, …]")
    # dynamo's "backend='inductor' raised:" says nothing: the line after it is the cause
    wrapped = "backend='inductor' raised:\n" + a
    assert causes.cause("error", "compile: lowering", "BackendCompilerFailed", wrapped) == (
        "compile: lowering: " + causes.normalize(a))
    # a wrong result's figures differ from case to case: its cause is its pattern
    assert causes.cause("failed", "incorrect result", None, None, "12 of 32 elements exceed", "all zeros") == (
        "incorrect result: all zeros")


@pytest.fixture
def zeros_run(cli):
    assert cli("import", DATA / "small.yaml").exit_code == 0
    result = cli("run", *ZEROS, "--json")
    assert result.exit_code == 1
    return result


@pytest.mark.slow
def test_run_json_and_report_list_failures_by_cause(cli, zeros_run):
    import json

    failures = json.loads(zeros_run.stdout)["failures"]
    assert [(g["op"], g["cause"], g["count"], g["outcome"]) for g in failures] == [
        ("torch.add", "incorrect result: all zeros", 3, "failed"),
        ("torch.mul", "incorrect result: all zeros", 1, "failed")]
    assert failures[0]["examples"] == ["small::add_a", "small::add_b", "small::add_c"]
    report = cli.json("report")
    assert [(g["op"], g["cause"], g["count"]) for g in report["causes"]] == [
        (g["op"], g["cause"], g["count"]) for g in failures]


@pytest.mark.slow
def test_run_summary_names_the_causes_and_points_at_the_report(cli):
    assert cli("import", DATA / "small.yaml").exit_code == 0
    result = cli("run", *ZEROS)
    assert result.exit_code == 1
    assert "4 failing case(s), 2 cause(s):" in result.stderr
    assert "3 × torch.add: incorrect result: all zeros (e.g. small::add_a: fp32[4, 8], fp32[4, 8])" in result.stderr
    assert "details: casedb report --run 1" in result.stderr


def test_datasette_groups_by_the_same_cause(cli, zeros_run, db_path, tmp_path):
    from tests import runs_data
    from tests.read.test_serve import canned

    with runs_data.Server(db_path, tmp_path / "serve.log") as server:
        rows = canned(server, "failures_by_cause")
    assert [(r["op"], r["cause"], r["cases"]) for r in rows] == [
        ("torch.add", "incorrect result: all zeros", 3), ("torch.mul", "incorrect result: all zeros", 1)]
