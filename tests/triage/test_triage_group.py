"""`triage update --group` (issue 28): one known_failure entry per failure cause, as wide as the run
shows it holds, in a stable order; a removal leaves every other line of the file as it was."""

import difflib

import pytest

from casedb import triage
from tests import runs_data

CPU = {"device": "cpu", "backend": "inductor", "arch": None}
SCOPE = {"device": "cpu", "backend": "inductor"}


@pytest.fixture
def runs_db(cli, tmp_path, db_path):
    runs_data.import_manifests(cli, tmp_path)
    return db_path


def test_one_entry_per_cause_op_wide_where_every_case_of_the_op_fails_so(cli, runs_db, tmp_path):
    # a_add and b_residual (one case, two models) fail alike: one op-level entry; a_mul too
    run = runs_data.record_run(runs_db, {("model_a", "a_add"): ("failed", 0.2), ("model_b", "b_residual"): ("failed", 0.2),
                                         ("model_a", "a_mul"): ("failed", 0.3), ("model_b", "b_rsqrt"): ("passed", 1e-5)})
    path = tmp_path / "t.yaml"
    res = cli("triage", "update", "--with-passing", "--group", "--from-run", run, path)
    assert res.exit_code == 0, res.output
    t = triage.load([path])
    assert [(e.selectors, e.status, e.stage) for e in t.entries] == [
        ({"op": "torch.add", **SCOPE}, "known_failure", "incorrect result"),
        ({"op": "torch.mul", **SCOPE}, "known_failure", "incorrect result"),
        ({"op": "torch.rsqrt", **SCOPE}, "expected_pass", None)]
    assert f"2 cases failed so in run {run} (model_a::a_add, model_b::b_residual)" in " ".join(path.read_text().split())
    # without --group: one entry per case
    per_case = triage.propose(runs_db, run, tmp_path / "p.yaml", with_passing=True)
    assert [(a.get("model"), a.get("name")) for a in per_case.added] == [
        ("model_a", "a_add"), ("model_a", "a_mul"), ("model_b", "b_residual")]


def test_a_group_narrows_to_what_the_run_shows(runs_db, tmp_path):
    # b_residual passes: an op-level (or op and dtype) entry would hold it too; the model's op does not
    run = runs_data.record_run(runs_db, {("model_a", "a_add"): ("failed", 0.2), ("model_b", "b_residual"): ("passed", 0.0)})
    prop = triage.propose(runs_db, run, tmp_path / "t.yaml", group=True, with_passing=True)
    assert [{k: v for k, v in a.items() if k != "reason"} for a in prop.added] == [
        {"model": "model_a", "op": "torch.add", **SCOPE, "status": "known_failure", "stage": "incorrect result"}]
    # a case of the op that did not run: the op is not shown to fail, the model's op is
    run = runs_data.record_run(runs_db, {("model_a", "a_mul"): ("failed", 0.2)})
    prop = triage.propose(runs_db, run, tmp_path / "t.yaml", group=True, with_passing=True)
    assert [(a.get("model"), a["op"]) for a in prop.added] == [(None, "torch.mul")]  # the only mul case: it ran


def test_a_removal_leaves_every_other_line_byte_for_byte(cli, runs_db, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("# reviewed in git\nversion: 1\ncases:\n"
                    "  - {op: torch.nn.functional.silu, status: expected_pass}   # hand-written\n")
    run = runs_data.record_run(runs_db, {("model_a", "a_add"): ("failed", 0.2), ("model_b", "b_residual"): ("failed", 0.2),
                                         ("model_a", "a_mul"): ("failed", 0.3), ("model_b", "b_rsqrt"): ("failed", 0.5)})
    assert cli("triage", "update", "--with-passing", "--group", "--from-run", run, path).exit_code == 0
    before = path.read_text().splitlines(keepends=True)
    # the mul is fixed: its entry goes; the update's head stays with the entries still under it
    fixed = runs_data.record_run(runs_db, {("model_a", "a_mul"): ("passed", 0.0)})
    prop = triage.propose(runs_db, fixed, path, group=True, with_passing=True)
    assert len(prop.removed) == 1 and not prop.added
    after = prop.text.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes() if op[0] != "equal"]
    assert [op[0] for op in ops] == ["delete", "insert"]  # nothing changed, nothing moved
    (_, i1, i2, _, _), (_, at, _, j1, _) = ops
    assert "".join(before[i1:i2]) == (
        "  # incorrect result: max abs err 0.3 (rtol 0.01, atol 0.01). casedb does not loosen tolerances by\n"
        "  # itself: if this error is acceptable, set rtol/atol on this entry after review\n"
        "  - op: torch.mul\n    device: cpu\n    backend: inductor\n    status: known_failure\n"
        "    stage: incorrect result\n    reason: 'AssertionError: max abs error 0.3 exceeds tolerance'\n")
    assert any(ln.startswith(f"  # casedb triage update --from-run {run} ") for ln in after[:i1])
    # what is new comes after it all: the fixed op promoted, under the head of its own update
    assert at == len(before) and after[j1].startswith(f"  # casedb triage update --from-run {fixed} ")
    assert prop.promoted == [{"op": "torch.mul", **SCOPE, "status": "expected_pass"}]
    # every entry under the head gone: the head goes with them
    fixed = runs_data.record_run(runs_db, {(m, n): ("passed", 0.0) for m, n in
                                           (("model_a", "a_add"), ("model_b", "b_residual"), ("model_b", "b_rsqrt"))})
    path.write_text(prop.text)
    text = triage.propose(runs_db, fixed, path, group=True, with_passing=True).text
    assert text.startswith("# reviewed in git\nversion: 1\ncases:\n  - {op: torch.nn.functional.silu, status: "
                           "expected_pass}   # hand-written\n")
    assert f"--from-run {run} " not in text
