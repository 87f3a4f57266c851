"""Triage in a run, as a user goes through it: a backend under bring-up fails; `triage update`
records what fails; the rerun with that file exits 0 with every failure known; the correct
backend then shows them passing with the hint to remove their entries. The pytest front end
reads the same files."""

import json
from pathlib import Path

import pytest

from tests.helpers import rows, sha256_of

pytest_plugins = ("pytester",)

TRIAGE = Path(__file__).parents[1] / "data" / "triage"
TINY = """\
model: tiny
default: {dtype: fp32}
cases:
  - name: add_1
    op: torch.add
    inputs: [{tensor: {shape: [4, 8]}}, {tensor: {shape: [4, 8]}}]
  - name: rsqrt_1
    op: torch.rsqrt
    inputs: [{tensor: {shape: [4, 8], init: uniform, init_args: {low: 0.1, high: 2.0}}}]
  - name: mul_1
    op: torch.mul
    inputs: [{tensor: {shape: [4, 8]}}, {tensor: {shape: [4, 8]}}]
  - name: neg_1
    op: torch.neg
    inputs: [{tensor: {shape: [4, 8]}}]
"""
FAULTY = ("--backend", "casedb_test_faulty", "--import", str(TRIAGE / "faulty_backend.py"))
RUN = ("run", "--model", "tiny", "--device", "cpu", "-j", "0", "--no-progress", "--json")




def judged(db, run_id):
    return {r["name"]: r for r in rows(db, """SELECT mc.name, j.outcome, j.reason, j.triage, j.triage_where, j.stage
                                             FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id
                                             WHERE j.run_id = ?""", [run_id])}


@pytest.fixture
def tiny(imported_db):
    return imported_db({"tiny.yaml": TINY})


def test_bring_up_known_failures_then_the_fix(cli, tiny, tmp_path):
    first = cli(*RUN, *FAULTY)
    assert first.exit_code == 1
    s = json.loads(first.stdout)
    assert (s["failed"], s["errors"], s["triage"]) == (1, 1, {"new": 2, "unspecified": 2, "remove": 0})
    path = tmp_path / "triage" / "bringup.yaml"
    # scoped to the device only (the default names the backend too), so that other backends' runs read it
    assert cli("triage", "update", "--with-passing", "--from-run", s["run_id"], "-o", path, "--scope", "device").exit_code == 0
    # the rerun with the file: every failure is known, nothing unexpected
    again = cli(*RUN, *FAULTY, "--triage", path)
    assert again.exit_code == 0, again.output
    s2 = json.loads(again.stdout)
    assert (s2["xfailed"], s2["failed"], s2["errors"], s2["unexpected"]) == (2, 0, 0, 0)
    assert s2["triage"] == {"known": 2, "expected": 2, "remove": 0}
    got = judged(tiny, s2["run_id"])
    assert (got["mul_1"]["outcome"], got["mul_1"]["triage"], got["mul_1"]["stage"]) == (
        "xfailed", "known", "compile: backend compiler")
    assert got["mul_1"]["reason"].startswith("RuntimeError: faulty backend: cannot lower mul")
    where, line = got["mul_1"]["triage_where"].rsplit(":", 1)
    assert where == str(path) and "name: mul_1" in "".join(path.read_text().splitlines(True)[int(line) - 1:int(line) + 2])
    # the correct backend: the known failures pass, each with the hint to remove its entry
    control = cli(*RUN, "--backend", "eager", "--triage", path)
    assert control.exit_code == 1  # xpassed: the file is out of date
    s3 = json.loads(control.stdout)
    assert (s3["xpassed"], s3["triage"]["remove"]) == (2, 2)
    got = judged(tiny, s3["run_id"])
    assert got["rsqrt_1"]["outcome"] == "xpassed"
    assert "passes now on cpu/eager: remove the known_failure entry at" in got["rsqrt_1"]["reason"]
    assert "it names no backend" in got["rsqrt_1"]["reason"]
    # and an expected pass (the update promoted torch.add on the cpu) that fails is a regression
    regressed = cli(*RUN, "--backend", "casedb_test_broken_add", "--import", str(TRIAGE / "broken_add.py"),
                    "--triage", path)
    assert regressed.exit_code == 1
    s4 = json.loads(regressed.stdout)
    assert (s4["triage"]["regression"], s4["triage"].get("new", 0)) == (1, 0)
    assert "expected to pass (the entry at" in judged(tiny, s4["run_id"])["add_1"]["reason"]


def test_a_run_with_a_bad_triage_file_exits_2_and_changes_nothing(cli, tiny, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ncases:\n  - {model: tiny, name: add_1, staus: known_failure}\n"
                   "  - {model: nosuch, status: known_failure}\n")
    before = sha256_of(tiny)
    res = cli(*RUN, "--backend", "eager", "--triage", bad)
    assert res.exit_code == 2
    assert f"{bad}:3" in res.output and "did you mean 'status'" in res.output
    assert sha256_of(tiny) == before


def test_triage_statuses_select_skip_and_time_cases(cli, tiny, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("""\
version: 1
cases:
  - {model: tiny, name: neg_1, status: exclude, reason: not ours}
  - {op: torch.rsqrt, device: cpu, status: not_supported, reason: no rsqrt on this target}
""")
    s = json.loads(cli(*RUN, "--backend", "eager", "--triage", path).stdout)
    assert (s["executed"], s["skipped"], s["occurrences"]) == (2, 1, 3)  # neg_1 not selected
    got = judged(tiny, s["run_id"])
    assert set(got) == {"add_1", "mul_1", "rsqrt_1"}
    assert (got["rsqrt_1"]["outcome"], got["rsqrt_1"]["reason"], got["rsqrt_1"]["triage"]) == (
        "skipped", "no rsqrt on this target", "not_supported")


@pytest.mark.slow
def test_the_pytest_front_end_applies_the_same_statuses(pytester, tiny, tmp_path, monkeypatch):
    (pytester.path / "triage").mkdir()
    (pytester.path / "triage" / "t.yaml").write_text("""\
version: 1
cases:
  - {model: tiny, name: mul_1, status: known_failure, reason: "mul is not lowered yet (issue 12)"}
  - {model: tiny, name: rsqrt_1, status: not_supported, reason: no rsqrt here}
  - {model: tiny, name: neg_1, status: exclude}
""")
    monkeypatch.setenv("CASEDB_DB", str(tiny))
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb="from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    res = pytester.runpytest_subprocess("--casedb-model", "tiny", "--casedb-device", "cpu", "--compile-backend", "casedb_test_faulty",
                             "--casedb-import", str(TRIAGE / "faulty_backend.py"), "-m", "", "-rsx")
    res.assert_outcomes(passed=1, xfailed=1, skipped=1, deselected=1)
    res.stdout.fnmatch_lines(["*SKIPPED*no rsqrt here*", "*XFAIL*mul is not lowered yet (issue 12)*"])


@pytest.mark.slow
def test_an_unusable_target_with_triage_files_is_reported_by_the_cases(pytester, tiny, monkeypatch):
    # triage is read at collection for the target; a target that cannot be prepared must not
    # end the session with an INTERNALERROR there: the first case reports why and stops it
    (pytester.path / "t.yaml").write_text("version: 1\ncases:\n  - {op: torch.mul, status: known_failure}\n")
    monkeypatch.setenv("CASEDB_DB", str(tiny))
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb="from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    res = pytester.runpytest_subprocess("--casedb-model", "tiny", "--casedb-device", "cpu", "--casedb-triage", "t.yaml",
                                        "--casedb-import", "no_such_module_here", "-m", "")
    assert "INTERNALERROR" not in res.stdout.str() + res.stderr.str()
    res.stdout.fnmatch_lines(["*--import no_such_module_here failed: ModuleNotFoundError*"])
    assert res.ret == pytest.ExitCode.INTERRUPTED  # a fatal target stops the session


@pytest.mark.slow
def test_the_main_job_applies_the_shipped_triage_of_its_target(cli, db_path):
    """A correct backend's first run ends green: the shipped triage (a torch.compile limitation
    on four granite4h cases) is loaded by default, and the run says so."""
    root = Path(__file__).resolve().parents[2]
    assert cli("import", root / "manifests" / "granite4h.yaml").exit_code == 0
    run = ("run", "--model", "granite4h", "-k", "getitem_9ecf954a", "--device", "cpu", "--backend", "inductor",
           "-j", "0", "--no-progress")
    res = cli(*run)
    assert res.exit_code == 0, res.output
    assert "triage files loaded: manifests/triage/torch-compile-cpu.yaml" in res.output
    s = cli.json(*run)
    assert (s["xfailed"], s["errors"], s["triage"]["known"]) == (1, 0, 1)
    assert s["triage_files"] == [str(root / "manifests" / "triage" / "torch-compile-cpu.yaml")]
    # without it the same case is a new error; on the eager backend no entry applies (it passes)
    assert cli(*run, "--no-shipped-triage").exit_code == 1
    eager = cli.json(*run[:5], "--device", "cpu", "--backend", "eager", "-j", "0")
    assert (eager["passed"], eager["xpassed"], eager["triage"].get("known", 0)) == (1, 0, 0)
