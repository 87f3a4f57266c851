"""The pytest plugin: RFC-0186's options, markers, ids and recording, through pytester sessions."""

import json
import xml.etree.ElementTree as ET

import pytest
import torch
import torch._dynamo
from typer.testing import CliRunner

import casedb.run.execute  # noqa: F401
import casedb.run.runner  # noqa: F401
import casedb.store.database  # noqa: F401
import importers.yaml_manifest  # noqa: F401 (its PyYAML classes must not be re-imported by a pytester session)
from tests.helpers import rows

# Imported before any pytester fixture snapshots sys.modules: an in-process pytester session
# drops the modules it imported when it ends, and torch's (inductor's registries among them)
# break when imported a second time. list_backends imports every dynamo backend module.
torch._dynamo.list_backends(exclude_tags=())
pytest_plugins = ("pytester",)

ALPHA = """\
model: alpha
default: {dtype: fp16, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: add_ok
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: mul_ok
    op: torch.mul
    inputs:
      - tensor: {shape: [2, 128]}
      - tensor: {shape: [2, 128]}
  - name: mm_ok
    op: torch.ops.aten.mm.default
    inputs:
      - tensor: {shape: [8, 64]}
      - tensor: {shape: [64, 64]}
  - name: big4d
    op: torch.relu
    inputs:
      - tensor: {shape: [1, 2, 4, 64]}
  - name: fp32_op
    op: torch.neg
    dtype: fp32
    inputs:
      - tensor: {shape: [8, 64]}
  - name: skipme
    op: torch.abs
    skip_if:
      - expr: device == 'cpu'
        reason: abs is not checked on the cpu
    inputs:
      - tensor: {shape: [3, 64]}
"""

BETA = """\
model: beta
default: {dtype: fp16, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: add_shared
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64]}
      - tensor: {shape: [4, 64]}
  - name: sub_b
    op: torch.sub
    marks: [mymark]
    inputs:
      - tensor: {shape: [5, 64]}
      - tensor: {shape: [5, 64]}
  - name: ones_dev
    op: torch.ones
    attrs: {size: [2, 64], device: "cuda:0"}
  - name: view_err
    op: torch.view
    expects_error: {type: RuntimeError, match: view}
    inputs:
      - tensor: {shape: [2, 3, 8], preset: noncontig_slice, preset_args: {dim: 1, step: 2}}
      - value: [2, 24]
  - name: add_xpass
    op: torch.add
    expects_error: {type: RuntimeError}
    inputs:
      - tensor: {shape: [3, 64]}
      - tensor: {shape: [3, 64]}
"""

TEST_FILE = "from casedb.pytest_plugin import test_model_op  # noqa: F401\n"


@pytest.fixture
def db(imported_db):
    """A DB with models alpha and beta, imported with `casedb import`."""
    return imported_db({"alpha.yaml": ALPHA, "beta.yaml": BETA})


@pytest.fixture
def ptr(pytester, db, monkeypatch):
    """pytester with the one-line test file, strict markers, and the tmp DB in CASEDB_DB."""
    monkeypatch.setenv("CASEDB_DB", str(db))
    monkeypatch.delenv("TEST_COMPILE_BACKEND", raising=False)
    pytester.makeini("[pytest]\nstrict_markers = true\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_from_casedb=TEST_FILE)  # a name no repo test module has
    return pytester


CPU = ("--device", "cpu", "--compile-backend", "eager")


def collected(result) -> list[str]:
    return [line.split("[", 1)[1][:-1] for line in result.outlines if line.startswith("test_from_casedb.py::test_model_op[")]


def occurrences(db, models, markexpr=None):
    from casedb.store.database import Store

    with Store(db) as store:
        return store.occurrences(models, markexpr=markexpr)




# ------------------------------------------------------------------------------ collection

@pytest.mark.slow
def test_collect_only_is_the_models_cases_minus_the_default_excluded_marks(ptr, db):
    from casedb.cases.marks import DEFAULT_EXCLUDE

    res = ptr.runpytest("--model", "alpha", "--collect-only", "-q")
    want = {r["signature"] for r in occurrences(db, ["alpha"], markexpr=DEFAULT_EXCLUDE)}
    ids = collected(res)
    assert len(ids) == len(want) == 4
    assert {i.rsplit("-", 1)[1] for i in ids} == {s[:10] for s in want}
    res.stdout.fnmatch_lines(["4/6 tests collected (2 deselected)*"])


@pytest.mark.slow
def test_empty_markexpr_collects_every_case(ptr, db):
    res = ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-m", "")
    assert len(collected(res)) == len({r["signature"] for r in occurrences(db, ["alpha"])}) == 6


@pytest.mark.slow
def test_no_dedupe_over_two_models_collects_the_sum_of_occurrences(ptr, db):
    res = ptr.runpytest("--model", "alpha", "--model", "beta", "--no-dedupe", "--collect-only", "-q", "-m", "")
    ids = collected(res)
    assert len(ids) == len(occurrences(db, ["alpha"])) + len(occurrences(db, ["beta"])) == 11
    assert "alpha-add_ok" in ids and "beta-add_shared" in ids


@pytest.mark.slow
def test_dedupe_collects_a_shared_case_once(ptr, db):
    res = ptr.runpytest("--model", "alpha", "--model", "beta", "--collect-only", "-q", "-m", "")
    ids = collected(res)
    assert len(ids) == len({r["signature"] for r in occurrences(db, ["alpha", "beta"])}) == 10
    add = [i for i in ids if i.startswith("torch.add-4x64,4x64-fp16-")]
    assert len(add) == 1


@pytest.mark.slow
def test_ids_name_op_shapes_dtype_and_signature(ptr, db):
    sig = {r["name"]: r["signature"] for r in occurrences(db, ["alpha"])}
    res = ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-m", "")
    assert collected(res) == [
        f"torch.add-4x64,4x64-fp16-{sig['add_ok'][:10]}",
        f"torch.mul-2x128,2x128-fp16-{sig['mul_ok'][:10]}",
        f"aten.mm.default-8x64,64x64-fp16-{sig['mm_ok'][:10]}",
        f"torch.relu-1x2x4x64-fp16-{sig['big4d'][:10]}",
        f"torch.neg-8x64-fp32-{sig['fp32_op'][:10]}",
        f"torch.abs-3x64-fp16-{sig['skipme'][:10]}",
    ]


@pytest.mark.slow
def test_k_matches_op_names_and_case_names(ptr):
    by_op = collected(ptr.runpytest("--model", "alpha", "--model", "beta", "--collect-only", "-q", "-m", "", "-k", "torch.add"))
    assert [i.split("-")[0] for i in by_op] == ["torch.add", "torch.add"]
    by_aten = collected(ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-k", "aten.mm"))
    assert [i.split("-")[0] for i in by_aten] == ["aten.mm.default"]
    # dedupe ids carry no case name; -k still finds the case by it (the RFC's `-k "mul_ok"`)
    by_name = collected(ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-k", "mul_ok"))
    assert [i.split("-")[0] for i in by_name] == ["torch.mul"]


@pytest.mark.slow
def test_m_selects_by_derived_manifest_and_model_marks(ptr):
    big = collected(ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-m", "largedimtensor"))
    assert [i.split("-")[0] for i in big] == ["torch.relu"]
    mine = collected(ptr.runpytest("--model", "beta", "--collect-only", "-q", "-m", "mymark"))
    assert [i.split("-")[0] for i in mine] == ["torch.sub"]
    beta = collected(ptr.runpytest("--model", "alpha", "--model", "beta", "--collect-only", "-q", "-m", "model_beta"))
    # -m given: the default filter is off, so view_err (constant) is in too
    assert sorted(i.split("-")[0] for i in beta) == ["torch.add", "torch.add", "torch.ones", "torch.sub", "torch.view"]


@pytest.mark.slow
def test_strict_markers_reject_an_unknown_mark_but_not_casedbs(ptr):
    ptr.makepyfile(test_other="import pytest\n\n@pytest.mark.nosuchmark\ndef test_x():\n    pass\n")
    res = ptr.runpytest("--model", "beta", "--collect-only", "-q", "-m", "")
    res.stdout.fnmatch_lines(["*'nosuchmark' not found in `markers` configuration option*"])
    ok = ptr.runpytest("test_from_casedb.py", "--model", "beta", "--collect-only", "-q", "-m", "")
    assert ok.ret == 0 and len(collected(ok)) == 5


@pytest.mark.slow
def test_m_may_name_a_mark_of_a_model_not_selected(ptr):
    # mymark is beta's: registered from the DB, so strict markers take it for alpha too (none selected)
    res = ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-m", "mymark")
    assert res.ret == pytest.ExitCode.NO_TESTS_COLLECTED and collected(res) == []


@pytest.mark.slow
def test_m_naming_no_mark_is_refused_in_casedbs_words_on_any_pytest(ptr):
    res = ptr.runpytest("--model", "alpha", "--collect-only", "-q", "-m", "not mymrak")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*no case or model has the mark 'mymrak' (did you mean 'mymark'?)*"])


def test_casedb_run_refuses_an_unknown_mark_before_running(db, cli):
    res = cli("run", "--model", "alpha", "-m", "not largedimtensr", "--device", "cpu", "--backend", "eager", db=db)
    assert res.exit_code == 2
    assert "no case or model has the mark 'largedimtensr' (did you mean 'largedimtensor'?)" in res.output
    assert rows(db, "SELECT id FROM runs") == []


@pytest.mark.slow
def test_without_model_only_a_smoke_set(ptr, db):
    from casedb.cases.marks import DEFAULT_EXCLUDE
    from casedb.run.plan import SMOKE_SIZE

    ids = collected(ptr.runpytest("--collect-only", "-q"))
    kept = occurrences(db, None, markexpr=DEFAULT_EXCLUDE)
    assert len(ids) == SMOKE_SIZE < len({r["signature"] for r in kept})
    assert len({i.split("-")[0] for i in ids}) == SMOKE_SIZE  # one per op


@pytest.mark.slow
def test_usable_without_a_test_file_through_pyargs(ptr):
    res = ptr.runpytest("--pyargs", "casedb.pytest_plugin", "--model", "alpha", "--collect-only", "-q")
    ids = [line.split("test_model_op[", 1)[1][:-1] for line in res.outlines if "test_model_op[" in line]
    assert ids == collected(ptr.runpytest("--model", "alpha", "--collect-only", "-q"))
    assert len(ids) == 4


@pytest.mark.slow
def test_unknown_model_is_a_usage_error(ptr):
    res = ptr.runpytest("--model", "gamma", "--collect-only", "-q")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*no model 'gamma'*known models: alpha, beta*"])


@pytest.mark.slow
def test_model_aliases_match_dashes_underscores_and_case(ptr):
    assert len(collected(ptr.runpytest("--model", "ALPHA", "--collect-only", "-q"))) == 4


# --------------------------------------------------------------------------------- listings

@pytest.mark.slow
def test_list_models(ptr, db):
    res = ptr.runpytest("--list-models")
    assert res.ret == 0
    assert [line for line in res.outlines if line.startswith(("alpha:", "beta:"))] == [
        f"alpha: 6 cases (6 unique), 6 ops — {db.parent / 'alpha.yaml'}  [-m model_alpha]",
        f"beta: 5 cases (5 unique), 4 ops — {db.parent / 'beta.yaml'}  [-m model_beta]"]


@pytest.mark.slow
def test_list_cases_prints_model_name_op_and_manifest(ptr, db):
    res = ptr.runpytest("--list-cases", "--model", "beta")
    lines = [line for line in res.outlines if line.startswith("beta::")]
    manifest = str(db.parent / "beta.yaml")
    assert lines == [f"beta::add_shared::torch.add ({manifest})", f"beta::sub_b::torch.sub ({manifest})",
                     f"beta::ones_dev::torch.ones ({manifest})", f"beta::view_err::torch.view ({manifest})",
                     f"beta::add_xpass::torch.add ({manifest})"]
    every = ptr.runpytest("--list-cases")
    assert len([line for line in every.outlines if "::" in line and line.endswith(".yaml)")]) == 11


@pytest.mark.slow
def test_list_cases_by_mark_default_filter_and_excluded(ptr):
    sel = ptr.runpytest("--list-cases-by-mark", "--model", "alpha")
    assert [line for line in sel.outlines if line.startswith("alpha::")] == [
        "alpha::add_ok::torch.add []", "alpha::mul_ok::torch.mul []", "alpha::mm_ok::torch.ops.aten.mm.default []",
        "alpha::skipme::torch.abs []"]
    sel.stdout.fnmatch_lines(["4 of 6 cases selected by -m 'not largedimtensor and not fp32operation*"])
    exc = ptr.runpytest("--list-cases-by-mark", "--show-excluded", "--model", "alpha")
    assert [line for line in exc.outlines if line.startswith("alpha::")] == [
        "alpha::big4d::torch.relu [largedimtensor]", "alpha::fp32_op::torch.neg [fp32operation]"]
    expr = ptr.runpytest("--list-cases-by-mark", "model_beta and constant")
    assert [line for line in expr.outlines if "::" in line] == [
        "beta::view_err::torch.view [constant, noncontiguous, paddedtensor]"]
    given_m = ptr.runpytest("--list-cases-by-mark", "-m", "mymark")
    assert [line for line in given_m.outlines if "::" in line] == ["beta::sub_b::torch.sub [mymark]"]


# ----------------------------------------------------------------------------------- running

@pytest.mark.slow
def test_session_outcomes_and_its_recorded_run(ptr, db):
    res = ptr.runpytest("--model", "alpha", "--model", "beta", "-m", "", *CPU, "--show-skipped")
    res.assert_outcomes(passed=7, skipped=1, xfailed=1, failed=1)
    res.stdout.fnmatch_lines(["*casedb: skipped cases*", "SKIPPED torch.abs-3x64-fp16-*: abs is not checked on the cpu",
                              "casedb: run 1 recorded in *: 9 executed, 1 duplicates skipped; 7 passed, 1 xfailed, "
                              "1 xpassed, 1 skipped"])
    run = rows(db, "SELECT * FROM runs")
    assert len(run) == 1
    r = run[0]
    assert (r["status"], r["device"], r["backend"], r["casedb_version"]) == ("finished", "cpu", "eager", "0.1.0")
    assert r["torch_version"].startswith("2.") and r["host"] and r["uid"]
    sel = json.loads(r["selection"])
    assert sel["options"]["models"] == ["alpha", "beta"] and sel["options"]["markexpr"] == ""
    assert sel["planned"] == {"cases": 10, "occurrences": 11, "duplicates_skipped": 1, "available": 10}
    judged = {(j["model"], j["outcome"]) for j in rows(
        db, "SELECT j.model, mc.name, j.outcome FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id")}
    got = {(j["model"], j["name"], j["outcome"]) for j in rows(
        db, "SELECT j.model, mc.name, j.outcome FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id")}
    assert got == {("alpha", "add_ok", "passed"), ("alpha", "mul_ok", "passed"), ("alpha", "mm_ok", "passed"),
                   ("alpha", "big4d", "passed"), ("alpha", "fp32_op", "passed"), ("alpha", "skipme", "skipped"),
                   ("beta", "add_shared", "passed"), ("beta", "sub_b", "passed"), ("beta", "ones_dev", "passed"),
                   ("beta", "view_err", "xfailed"), ("beta", "add_xpass", "xpassed")}
    assert judged
    summary = json.loads(r["summary"])
    assert {k: summary[k] for k in ("executed", "passed", "failed", "errors", "xfailed", "xpassed", "skipped",
                                    "occurrences", "duplicates_skipped")} == {
        "executed": 9, "passed": 7, "failed": 0, "errors": 0, "xfailed": 1, "xpassed": 1, "skipped": 1,
        "occurrences": 11, "duplicates_skipped": 1}
    # one execution of the shared add, judged for both models
    add = rows(db, "SELECT r.id, r.outcome, r.model_case_id FROM results r JOIN cases c ON c.signature = r.signature "
                   "WHERE c.op = 'torch.add' AND c.shapes LIKE 'fp16[4, 64]%'")
    assert [(a["outcome"], a["model_case_id"]) for a in add] == [("passed", None)]
    assert len(rows(db, "SELECT * FROM judgements WHERE result_id = ?", [add[0]["id"]])) == 2


def _comparable(db, run_id):
    keys = ("signature", "model_case_id", "outcome", "reason", "compare_mode", "max_abs_err", "mismatch_count",
            "error_type", "test_id")
    res = sorted(tuple(r[k] for k in keys) for r in rows(db, "SELECT * FROM results WHERE run_id = ?", [run_id]))
    jud = sorted((j["model_case_id"], j["model"], j["signature"], j["outcome"], j["reason"], j["rtol"], j["atol"])
                 for j in rows(db, "SELECT * FROM judgements WHERE run_id = ?", [run_id]))
    return res, jud


def test_xdist_and_junitxml_record_the_same_run_as_casedb_run(ptr, db):
    from casedb.cli import app

    res = ptr.runpytest_subprocess("--model", "alpha", "--model", "beta", "-m", "", *CPU, "-n", "2",
                                   "--junitxml", "junit.xml")
    res.assert_outcomes(passed=7, skipped=1, xfailed=1, failed=1)
    cases = ET.parse(ptr.path / "junit.xml").getroot().iter("testcase")
    assert len(list(cases)) == 10
    cli = CliRunner().invoke(app, ["--db", str(db), "run", "--model", "alpha", "--model", "beta", "-m", "",
                                   "--backend", "eager", "--device", "cpu", "-j", "0", "--json"])
    assert cli.exit_code == 1, cli.output  # the strict xpass is unexpected
    assert json.loads(cli.stdout)["run_id"] == 2
    first, second = _comparable(db, 1), _comparable(db, 2)
    assert first == second
    assert len(first[0]) == 9 and len(first[1]) == 11
    workers = {r["worker"] for r in rows(db, "SELECT worker FROM results WHERE run_id = 1")}
    assert workers <= {"gw0", "gw1"} and workers


@pytest.mark.slow
def test_collect_only_records_no_run(ptr, db):
    ptr.runpytest("--model", "alpha", "--collect-only", "-q")
    assert rows(db, "SELECT * FROM runs") == []


@pytest.mark.slow
def test_sessions_without_model_tests_touch_no_database(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("CASEDB_DB", raising=False)
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    assert not (pytester.path / "data").exists()


@pytest.mark.slow
def test_device_strings_are_replaced_unless_no_device_replace(ptr, db):
    ok = ptr.runpytest("--model", "beta", *CPU, "-k", "ones_dev")
    ok.assert_outcomes(passed=1)
    if torch.cuda.is_available():
        pytest.skip("cuda:0 exists here, so keeping it would not fail")
    kept = ptr.runpytest("--model", "beta", *CPU, "-k", "ones_dev", "--no-device-replace")
    kept.assert_outcomes(errors=1)  # casedb records an error: pytest counts it as one too (issue 46)
    err = rows(db, "SELECT outcome, error_type, error_message FROM results WHERE run_id = 2")
    assert len(err) == 1 and err[0]["outcome"] == "error"
    assert "cuda" in err[0]["error_message"].lower() or "cuda" in err[0]["error_type"].lower()


@pytest.mark.slow
def test_compile_backend_option_env_and_device_are_recorded(ptr, db, monkeypatch):
    monkeypatch.setenv("TEST_COMPILE_BACKEND", "aot_eager")
    res = ptr.runpytest_subprocess("--model", "alpha", "--device", "cpu", "-k", "mul_ok")
    res.assert_outcomes(passed=1)
    res2 = ptr.runpytest("--model", "alpha", "--device", "cpu", "--compile-backend", "eager", "-k", "mul_ok")
    res2.assert_outcomes(passed=1)
    got = [(r["device"], r["backend"]) for r in rows(db, "SELECT device, backend FROM runs ORDER BY id")]
    assert got == [("cpu", "aot_eager"), ("cpu", "eager")]
    compiled = rows(db, "SELECT t_compile, t_exec FROM results WHERE run_id = 1")[0]
    assert compiled["t_compile"] > 0 and compiled["t_exec"] > 0
    assert rows(db, "SELECT t_compile FROM results WHERE run_id = 2")[0]["t_compile"] is None


@pytest.mark.slow
def test_an_unusable_backend_stops_the_session_and_says_why(ptr, db):
    res = ptr.runpytest("--model", "alpha", "--device", "cpu", "--compile-backend", "nosuch_backend")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*unknown compile backend 'nosuch_backend'*"])
    run = rows(db, "SELECT status, summary FROM runs")[0]
    assert run["status"] == "interrupted"
    assert "nosuch_backend" in json.loads(run["summary"])["error"]
    assert rows(db, "SELECT * FROM results") == []


@pytest.mark.slow
def test_custom_backend_from_an_imported_module_fails_with_metrics(ptr, db, data_dir):
    res = ptr.runpytest_subprocess("--model", "alpha", "--model", "beta", "--device", "cpu", "--compile-backend", "casedb_test_perturb",
                        "--casedb-import", str(data_dir / "custom_ops.py"), "-k", "add_ok")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*failed: alpha::add_ok (rtol=0.001, atol=0.001): *elements*exceed*",
                              "*failed: beta::add_shared (rtol=0.001, atol=0.001)*"])
    r = rows(db, "SELECT outcome, max_abs_err, mismatch_count, metrics FROM results")[0]
    assert r["outcome"] == "failed" and r["max_abs_err"] > 0.01 and r["mismatch_count"] == 256
    assert json.loads(r["metrics"])["numel"] == 256


@pytest.mark.slow
def test_shard_limit_and_op_options_select(ptr):
    base = ("--model", "alpha", "--model", "beta", "--collect-only", "-q", "-m", "")
    all_ids = collected(ptr.runpytest(*base))
    parts = [collected(ptr.runpytest(*base, "--casedb-shard", f"{i}/3")) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(all_ids) and all(parts)
    assert collected(ptr.runpytest(*base, "--casedb-limit", "3")) == all_ids[:3]
    assert [i.split("-")[0] for i in collected(ptr.runpytest(*base, "--casedb-op", "torch.add"))] == ["torch.add"] * 2


# ------------------------------------------------------------------ a project that owns the names

PROJECT_CONFTEST = '''
def pytest_addoption(parser):
    # the RFC implementation's own conftest: it owns --model and --device
    parser.addoption("--model", action="append", default=[], help="the project's model option")
    parser.addoption("--device", default="project-device", help="the project's device option")


def pytest_report_header(config):
    return f"project sees model={config.getoption('--model')} device={config.getoption('--device')}"
'''


@pytest.mark.slow
def test_a_conftest_that_defines_model_and_device_keeps_them(ptr, db):
    ptr.makeconftest(PROJECT_CONFTEST)
    ptr.makepyfile(test_project="def test_project_own(request):\n"
                                "    assert request.config.getoption('--model') == ['theirs']\n")
    # the project's own run: no argparse conflict, its options are its own
    own = ptr.runpytest("--model", "theirs", "--device", "dev7", "test_project.py")
    own.assert_outcomes(passed=1)
    own.stdout.fnmatch_lines(["project sees model=['theirs'] device=dev7"])
    # casedb's spellings select casedb's cases in the same session; the free RFC ones still work
    res = ptr.runpytest("--model", "theirs", "--casedb-model", "alpha", "--casedb-device", "cpu",
                        "--compile-backend", "eager", "-m", "", "-q")
    res.assert_outcomes(passed=6, skipped=1)  # alpha's 5 + 1 skip_if, and the project's own test
    res.stdout.fnmatch_lines(["casedb: run 1 recorded in *: 5 executed, 0 duplicates skipped; 5 passed, 1 skipped"])
    assert rows(db, "SELECT device, backend FROM runs") == [{"device": "cpu", "backend": "eager"}]
    help_text = ptr.runpytest("--help").stdout.str()
    assert "--casedb-model" in help_text and "--compile-backend" in help_text


@pytest.mark.slow
def test_rfc_spellings_are_registered_when_free(ptr):
    res = ptr.runpytest("--help")
    for flag in ("--model", "--device", "--compile-backend", "--no-dedupe", "--list-cases", "--casedb-model",
                 "--casedb-backend", "--casedb-no-dedupe", "--casedb-list-cases"):
        assert flag in res.stdout.str(), flag


def test_casedb_run_resumes_a_run_the_pytest_front_end_recorded(ptr, db, data_dir, cli):
    wrong = ("--casedb-import", str(data_dir / "custom_ops.py"), "--compile-backend", "casedb_test_perturb",
             "--device", "cpu")
    first = ptr.runpytest("--model", "alpha", "--model", "beta", *wrong, "-x", "-m", "not largedimtensor")
    first.assert_outcomes(failed=1)
    run = rows(db, "SELECT id, status, selection FROM runs")
    assert [(r["id"], r["status"]) for r in run] == [(1, "interrupted")]
    assert json.loads(run[0]["selection"])["options"]["all_models"] is False
    assert cli("run", "--resume", "1", db=db).exit_code == 2  # its --import is asked for again
    res = cli("run", "--resume", "1", "--import", data_dir / "custom_ops.py", "--json", db=db)
    assert res.exit_code == 1, res.output  # the perturbing backend fails the rest too
    summary = json.loads(res.stdout)
    assert (summary["run_id"], summary["status"]) == (1, "finished")
    per_case = rows(db, "SELECT signature, count(*) AS n FROM results WHERE run_id = 1 GROUP BY signature")
    assert {r["n"] for r in per_case} == {1}
    assert summary["executed"] + summary["skipped"] == summary["planned"]["cases"] == len(per_case) + summary["skipped"]


def test_resuming_a_smoke_run_keeps_its_smoke_set(ptr, db, data_dir, cli):
    wrong = ("--casedb-import", str(data_dir / "custom_ops.py"), "--compile-backend", "casedb_test_perturb",
             "--device", "cpu")
    first = ptr.runpytest(*wrong, "-x")  # no --model: the smoke set
    assert first.parseoutcomes()["failed"] == 1
    planned = json.loads(rows(db, "SELECT selection FROM runs")[0]["selection"])["planned"]["cases"]
    assert planned <= 3
    res = cli("run", "--resume", "1", "--import", data_dir / "custom_ops.py", "--json", db=db)
    summary = json.loads(res.stdout)
    assert summary["status"] == "finished" and summary["executed"] + summary["skipped"] == planned
