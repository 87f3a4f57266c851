"""`casedb explain` on faulty backends of our own (tests/data/explain/faulty.py), each wrong under
one condition only, over a few dozen add, mul and matmul cases (tests/data/explain/cases.yaml):
it names the right condition, confirmed by variants run on the same backend, with thresholds found
by bisection; the smallest failing case is stored, fails the same way when run, and its repro
reproduces it; on a correct backend there is nothing to explain."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import rows

DATA = Path(__file__).parent.parent / "data" / "explain"
FAULTY = DATA / "faulty.py"
RUN = ("run", "--model", "explain-demo", "--device", "cpu", "-j", "0", "--no-progress", "--no-shipped-triage")


def red_run(cli, backend: str) -> None:
    assert cli("import", DATA / "cases.yaml").exit_code == 0
    res = cli(*RUN, "--backend", backend, "--import", FAULTY)
    assert res.exit_code in (0, 1), res.stdout


def explained(cli, *extra) -> dict:
    out = cli.json("explain", "-j", "0", "--import", FAULTY, "--no-progress", *extra)
    assert set(out) >= {"run_id", "causes", "variants_run", "seconds"}
    for c in out["causes"]:
        assert set(c) >= {"cause", "ops", "cases", "condition", "confirmed", "layer", "variants_run", "minimal"}
        assert c["variants_run"] <= 64
    return out


def main_cause(out: dict) -> dict:
    """The cause covering every failing case: the only one, or "(all failing cases)"."""
    assert out["causes"], "nothing explained"
    return out["causes"][-1]


@pytest.mark.slow
@pytest.mark.parametrize("backend,feature,check", [
    ("explain_dtype", "dtype", lambda c: c["dtype"] == "bfloat16"),
    ("explain_layout", "layout", lambda c: "non-contiguous" in c["text"]),
    ("explain_broadcast", "broadcast", lambda c: "broadcast" in c["text"]),
    ("explain_lastdim", "divisibility", lambda c: (c["dim"], c["multiple_of"]) == ("last", 16)),
])
def test_a_size_independent_bug_is_named_confirmed_and_shrunk(cli, db_path, tmp_path, backend, feature, check):
    red_run(cli, backend)
    out = explained(cli)
    cause = main_cause(out)
    cond = cause["condition"]
    assert cond["feature"] == feature and check(cond), cond
    assert cause["confirmed"] and "; confirmed:" in cond["text"], cond["text"]
    assert cond["passing"] == 0 and cond["failing"] == cause["cases"]
    assert cause["layer"] == "codegen"  # eager and aot_eager pass: the backend's own code is wrong
    if cause["cause"] == "(all failing cases)":
        cause = out["causes"][0]
    small = cause["minimal"]
    assert small and small["elements"] * 8 <= small["parent_elements"], small
    # stored as a derived case with its lineage, and it fails the same way when run
    lineage = rows(db_path, "SELECT * FROM derived_cases WHERE signature = ?", [small["signature"]])
    assert lineage and lineage[0]["parent_signature"] == small["parent"]
    rerun = cli.json("run", "--model", "derived", "--device", "cpu", "-j", "0", "--no-progress",
                     "--no-shipped-triage", "--backend", backend, "--import", FAULTY)
    assert rerun["failed"] >= 1
    # the repro reproduces it: the script fails with the backend's wrong result
    words = small["repro"].split()
    assert words[:3] == ["casedb", "repro", small["signature"][:12]] and "--backend" in words
    script = tmp_path / "repro.py"
    script.write_text(cli(*words[1:]).stdout)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "AssertionError" in done.stderr, done.stdout + done.stderr


@pytest.mark.slow
def test_a_reduced_length_threshold_is_bisected(cli):
    red_run(cli, "explain_k")
    cause = main_cause(explained(cli))
    cond = cause["condition"]
    assert (cond["feature"], cond["dim"]) == ("dim_size", "K"), cond
    # the bug starts at K = 1025; bisection pins it within the next power of two (here: exactly)
    assert 1025 <= cond["threshold"] <= 2048 and cause["confirmed"], cond
    assert "fails for K >= 1025, passes at K = 1024" in cond["text"], cond["text"]
    assert cause["growth"] and "K =" in cause["growth"]


@pytest.mark.slow
def test_an_element_count_threshold_is_bisected(cli):
    red_run(cli, "explain_numel")
    cause = main_cause(explained(cli))
    cond = cause["condition"]
    assert cond["feature"] == "numel" and cause["confirmed"], cond
    assert 4097 <= cond["threshold"] <= 8192, cond


@pytest.mark.slow
def test_a_correct_backend_has_nothing_to_explain(cli, db_path):
    red_run(cli, "eager")
    out = explained(cli)
    assert out["causes"] == [] and out["variants_run"] == 0
    res = cli("explain", "--no-progress")
    assert "nothing to explain" in res.stdout
    assert rows(db_path, "SELECT count(*) AS n FROM explanations")[0]["n"] == 1  # explained: nothing found
