"""The bring-up loop of issue 28, as a user goes through it with real torch and real files: a
faulty backend module (softmax 0.5 % off, zeros for outputs whose last dim is 10, no lowering for
rsqrt) is run; `triage update --group` writes one entry per cause; the rerun exits 0; an eager
run with the file present reads nothing of that backend's entries; the fixed module shows the
removals, and the file's diff is the removed entries and nothing else of what was there."""

import difflib
import json
import sys
from pathlib import Path

import pytest
import yaml

from casedb import triage

DATA = Path(__file__).parents[1] / "data"
BACKEND = "casedb_test_bringup"
MODULE = """\
import sys

import torch

BROKEN = {broken}


def _compile(gm, example_inputs):
    targets = {{str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}}
    if BROKEN and any("rsqrt" in t for t in targets):
        raise NotImplementedError("bring-up: no lowering for aten.rsqrt")
    soft = any("softmax" in t for t in targets)

    def bend(y):
        if not BROKEN or not isinstance(y, torch.Tensor) or not y.is_floating_point():
            return y
        if y.dim() and y.shape[-1] == 10:
            return torch.zeros_like(y)
        return y * 1.005 if soft else y

    def run(*args):
        out = gm(*args)
        return type(out)(bend(y) for y in out) if isinstance(out, (tuple, list)) else bend(out)

    return run


def _dispatch(gm, example_inputs):  # the module as imported last: the edited file, once fixed
    return sys.modules[__name__]._compile(gm, example_inputs)


try:
    torch._dynamo.register_backend(_dispatch, name="{name}")
except Exception:  # registered by an earlier import of this file
    pass
"""
RUN = ("run", "--model", "bringup-loop", "--device", "cpu", "-j", "0", "--no-progress")


def flat(text: str) -> str:
    return " ".join(text.split())  # (a note wraps at the console's width off a terminal)


def chunks(old: list[str], new: list[str]) -> tuple[list, list]:
    """(deleted runs of lines, inserted runs with where they go in ``old``) of the diff old -> new."""
    deleted, inserted = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            deleted.append(old[i1:i2])
        if tag in ("insert", "replace"):
            inserted.append((i1, new[j1:j2]))
    return deleted, inserted


@pytest.mark.slow
def test_the_bring_up_loop(cli, db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # triage/*.yaml of the working directory: loaded without --triage
    module = tmp_path / "bringup_backend.py"
    module.write_text(MODULE.format(broken=True, name=BACKEND))
    faulty = (*RUN, "--backend", BACKEND, "--import", module)
    monkeypatch.delitem(sys.modules, "casedb_import_bringup_backend", raising=False)
    assert cli("import", DATA / "bringup_loop.yaml").exit_code == 0

    # 1. the faulty backend: six failures of three causes
    first = cli(*faulty, "--json")
    assert first.exit_code == 1, first.output
    s1 = json.loads(first.stdout)
    causes = {(g["op"], g["count"]) for g in s1["failures"]}
    assert causes == {("torch.rsqrt", 3), ("torch.nn.functional.softmax", 2), ("torch.add", 1)}

    # 2. triage update --group: one known_failure entry per cause, op-wide where the run shows it holds
    upd = cli("triage", "update", "--group", "--with-passing", "--from-run", s1["run_id"])
    assert upd.exit_code == 0, upd.output
    path = tmp_path / "triage" / "triage.yaml"
    t = triage.load([path])
    target = {"device": "cpu", "backend": BACKEND}
    assert [(e.selectors, e.stage) for e in t.entries if e.status == "known_failure"] == [
        ({"model": "bringup-loop", "name": "add_ten", **target}, "incorrect result"),  # add_eight passes: not the op
        ({"op": "torch.nn.functional.softmax", **target}, "incorrect result"),
        ({"op": "torch.rsqrt", **target}, "compile: backend compiler")]
    assert t.entries[2].reason == "NotImplementedError: bring-up: no lowering for aten.rsqrt"
    assert [(e.selectors, e.status) for e in t.entries if e.status != "known_failure"] == [
        ({"op": "torch.add", **target}, "expected_pass"), ({"op": "torch.mul", **target}, "expected_pass")]

    # 3. the rerun with the file (found in ./triage, and said so): every failure known, exit 0
    again = cli(*faulty)
    assert again.exit_code == 0, again.output
    assert "triage/triage.yaml (loaded implicitly from ./triage" in flat(again.stderr)
    assert "6 known" in flat(again.stderr) and "0 new failures" in flat(again.stderr)

    # 4. eager on the same device, the file present: nothing about the faulty backend's entries
    eager = cli(*RUN, "--backend", "eager", "--json")
    assert eager.exit_code == 0, eager.output
    s4 = json.loads(eager.stdout)
    assert (s4["passed"], s4["xpassed"], s4["xfailed"], s4["unexpected"]) == (8, 0, 0, 0)
    assert s4["triage"] == {"remove": 0, "unspecified": 8}
    assert s4["triage_implicit"] == [str(path.resolve())]
    assert "pass now" not in flat(cli(*RUN, "--backend", "eager").stderr)

    # 5. the module fixed: its known failures pass; the update removes exactly their entries
    module.write_text(MODULE.format(broken=False, name=BACKEND))
    monkeypatch.delitem(sys.modules, "casedb_import_bringup_backend")
    fixed = cli(*faulty, "--json")
    s5 = json.loads(fixed.stdout)
    assert (s5["xpassed"], s5["triage"]["remove"]) == (6, 6)
    before = path.read_text()
    upd = cli("triage", "update", "--group", "--with-passing", "--from-run", s5["run_id"])
    assert upd.exit_code == 0, upd.output
    assert flat(upd.stderr).count("removed (passes now)") == 3
    deleted, inserted = chunks(before.splitlines(), path.read_text().splitlines())
    gone = [m for run in deleted for m in yaml.safe_load("\n".join(["cases:", *run]))["cases"]]
    assert gone == [e.written for e in t.entries if e.status == "known_failure"]
    # what was there and stays is byte for byte as it was: the only lines added are one block
    # appended after them (the fixed ops, unspecified now and passing, promoted)
    (at, block), = inserted
    assert at == len(before.splitlines())
    assert block[0].startswith(f"  # casedb triage update --from-run {s5['run_id']} (cpu/{BACKEND})")
    assert [m["status"] for m in yaml.safe_load("\n".join(["cases:", *block]))["cases"]] == ["expected_pass"] * 2
