"""The bring-up loop's smaller items (issue 28, part 2): run and report count alike, one
spelling of "not a mutant run", run --label, the plugin's note on the default mark filter,
show by a short prefix, an xfail reason said once, --version as a flag, failure rows with the
output dtype and pattern, import and report output a pipe can read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import importers.yaml_manifest  # noqa: F401 (as in test_plugin: imported before any pytester session)

pytest_plugins = ("pytester",)

ROOT = Path(__file__).parents[2]
DATA = Path(__file__).parents[1] / "data"

CASES = """\
model: items
cases:
  - name: add_ok
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64], dtype: fp32}
      - tensor: {shape: [4, 64], dtype: fp32}
  - name: add_xpass
    op: torch.add
    expects_error: {type: RuntimeError}
    inputs:
      - tensor: {shape: [3, 64], dtype: fp32}
      - tensor: {shape: [3, 64], dtype: fp32}
  - name: widen
    op: torch.Tensor.float
    inputs:
      - tensor: {shape: [8, 64], dtype: bf16}
"""


@pytest.fixture
def project(tmp_path, monkeypatch, cli):
    """A working directory with the test backends and the cases imported."""
    shutil.copy(DATA / "repro" / "ulp_backend.py", tmp_path / "ulp_backend.py")
    (tmp_path / "items.yaml").write_text(CASES)
    monkeypatch.chdir(tmp_path)
    assert cli("import", "items.yaml").exit_code == 0
    return tmp_path


def run(cli, *args):
    return cli("run", "--import", "ulp_backend", "--device", "cpu", "-j", "0", "--no-progress", *args)


def test_run_and_report_count_alike(cli, project):
    done = run(cli, "--backend", "eager", "-k", "add", "--json")
    summary = json.loads(done.stdout)
    totals = cli.json("report")["totals"]
    keys = ("executed", "passed", "failed", "errors", "crashed", "timeouts", "xfailed", "xpassed", "ref_errors",
            "not_exercised", "skipped")
    assert {k: summary[k] for k in keys} == {k: totals[k] for k in keys}
    assert (totals["passed"], totals["xpassed"], totals["pass_rate"]) == (1, 1, 100.0)
    # the text says it with the same names
    line = next(ln for ln in cli("report", "--run", summary["run_id"]).stdout.splitlines() if ln.startswith("Totals"))
    assert "executed 2 · passed 1 · failed 0" in line and "xpassed 1" in line


def test_not_a_mutant_run_is_spelled_once():
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "casedb").rglob("*") if p.suffix in (".py", ".yaml")
             and re.search(r"NOT GLOB '?mutant|GLOB 'mutant", p.read_text())]
    assert found == []  # casedb.store.run_scope.NOT_MUTANT_RUN builds it from MUTANT_LABEL


def test_run_label_is_stored_like_runs_label(cli, project):
    bad = run(cli, "--backend", "eager", "-k", "add_ok", "--label", " ")
    assert bad.exit_code == 2 and "a run label is 1 to 200 printable characters" in bad.output
    assert cli.json("runs") == []  # refused before any run
    assert run(cli, "--backend", "eager", "-k", "add_ok", "--label", "nightly").exit_code == 0
    assert [(r["run_id"], r["label"]) for r in cli.json("runs", "--label", "nightly")] == [(1, "nightly")]


@pytest.mark.slow
def test_plugin_says_how_many_cases_the_default_mark_filter_removed(pytester, cli, db_path, monkeypatch):
    pytester.makefile(".yaml", big=(
        "model: big\ndefault: {dtype: fp16}\ncases:\n  - name: big4d\n    op: torch.relu\n    inputs:\n"
        "      - tensor: {shape: [1, 2, 4, 64]}\n  - name: small\n    op: torch.relu\n    inputs:\n"
        "      - tensor: {shape: [4, 64]}\n"))
    assert cli("import", pytester.path / "big.yaml").exit_code == 0
    monkeypatch.setenv("CASEDB_DB", str(db_path))
    monkeypatch.delenv("TEST_COMPILE_BACKEND", raising=False)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb="from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    res = pytester.runpytest("--model", "big", "--device", "cpu", "--compile-backend", "eager")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["casedb: 1 cases deselected by the RFC default -m 'not largedimtensor*'; "
                              "pass -m '' to include them"])
    res = pytester.runpytest("--model", "big", "-m", "", "--device", "cpu", "--compile-backend", "eager")
    res.assert_outcomes(passed=2)
    assert "deselected by the RFC default" not in res.stdout.str()


def test_show_takes_a_four_character_prefix_and_refuses_an_ambiguous_name(cli, project):
    sig = cli.json("cases", "-k", "add_ok")[0]["signature"]
    shown = cli("show", sig[:4], "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["signature"] == sig
    (project / "other.yaml").write_text("model: other\ncases:\n  - name: add_ok\n    op: torch.mul\n    inputs:\n"
                                        "      - tensor: {shape: [4, 64]}\n      - tensor: {shape: [4, 64]}\n")
    assert cli("import", "other.yaml").exit_code == 0
    res = cli("show", "add_ok")
    assert res.exit_code == 2 and "'add_ok' names 2 different cases; give one of: items::add_ok" in res.output


def test_an_xfail_reason_is_said_once(cli, project, db_path):
    from tests.helpers import rows

    assert run(cli, "--backend", "casedb_zeros", "-k", "add_ok").exit_code == 1
    assert cli("triage", "update", "--from-run", 1).exit_code == 0  # the entry's reason: the failure's
    assert run(cli, "--backend", "casedb_zeros", "-k", "add_ok").exit_code == 0
    [j] = rows(db_path, "SELECT outcome, reason FROM judgements WHERE run_id = 2")
    assert j["outcome"] == "xfailed"
    assert j["reason"].count("elements") == 1, j["reason"]


def test_version_is_a_flag_in_help(cli):
    [line] = [ln for ln in cli("--help").stdout.splitlines() if "--version" in ln]
    assert "<bool>" not in line and "Show the version." in line


def test_a_failure_row_shows_the_output_dtype_and_an_all_zero_pattern(cli, project):
    assert run(cli, "--backend", "casedb_zeros", "-k", "widen").exit_code == 1
    [failure] = cli.json("report")["failures"]
    assert (failure["case_name"], failure["dtype"], failure["pattern"]) == ("widen", "float32", "all zeros")
    text = cli("report").stdout.splitlines()  # CliRunner's stdout is not a terminal: plain rows
    [row] = [ln for ln in text if ln.startswith("items::widen\t")]
    cells = row.split("\t")
    assert cells[3] == "float32" and cells[6].endswith("(all zeros)") and cells[7].startswith("casedb repro ")


def test_import_prints_one_plain_row_per_file_in_a_pipe(cli, tmp_path):
    (tmp_path / "a_rather_long_manifest_name_that_a_table_would_wrap.yaml").write_text(CASES)
    out = cli("import", tmp_path / "a_rather_long_manifest_name_that_a_table_would_wrap.yaml").stdout.splitlines()
    assert out[0].split("\t") == ["file", "format", "model", "records", "new cases", "duplicates", "skipped"]
    assert out[1].split("\t")[1:] == ["yaml", "items", "3", "3", "0", "0"]
    assert out[1].endswith(f"a_rather_long_manifest_name_that_a_table_would_wrap.yaml\tyaml\titems\t3\t3\t0\t0")
