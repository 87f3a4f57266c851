"""Hostile names and big files against triage (issue 24, items 7 and 8).

What `triage update` writes from a DB selects exactly the case it names and passes casedb's own
check, whatever the names hold; marker expressions are bounded; a triage file of thousands of
entries is checked, and read on every run, in bounded time and memory.
"""

from __future__ import annotations

import random
import sqlite3

import pytest
import yaml

from casedb import marks, triage
from casedb.errors import InputError
from tests import runs_data
from tests.conftest import rows

pytestmark = pytest.mark.timeout(300)

# Names that are syntax somewhere: wildcards, sets, regex tells, the literal prefix, spaces the
# check refuses at either end, YAML indicators, controls YAML refuses, line breaks of every kind.
NAMED = ["*", "?", "[abc]", "[", "]", "a]", "x[0]|{a}", "(?i)x", "^a$", "a\\b", "=eq", "==", "", " ", " lead",
         "trail ", "\ttab", "bell\x07", "nul\x00", "esc\x1b[2J", "nl\nname", "cr\rname", "nel\x85x", "ls\u2028x",
         "#c", "- d", "k: v", "'q", '"q', "&a", "!t", "%", "yes", "null", "~", "Foo", "foo", "mul_1", "é\u202eRTL"]
ALPHABET = "*?[]!|{}^$\\()=-_ .:#'\"\n\r\t\x00\x07\x1b\x7f\x85\u2028\u202eaAb0"


def hostile_names(n: int = 120, seed: int = 24) -> list[str]:
    """NAMED, then ``n`` random strings of ALPHABET (seeded: a failure reproduces), no repeats."""
    rng = random.Random(seed)
    out = list(NAMED)
    while len(out) < len(NAMED) + n:
        name = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8)))
        if name not in out:
            out.append(name)
    return out


def import_model(cli, tmp_path, model: str, names: list[str]) -> None:
    cases = [{"name": n, "op": "torch.neg", "inputs": [{"tensor": {"shape": [i + 1]}}]} for i, n in enumerate(names)]
    path = tmp_path / f"m{len(model)}.yaml"
    path.write_text(yaml.safe_dump({"model": model, "cases": cases}, allow_unicode=False), encoding="utf-8")
    result = cli("import", path)
    assert result.exit_code == 0, result.output


STAGES = [None, "runtime", "weird stage", "compile: lowering\n# x: y", "crash"]


def test_update_writes_literal_selectors_that_check_clean_and_select_exactly_their_case(cli, db_path, tmp_path):
    """Property-style: every hostile name a run fails on becomes an entry that casedb's check
    accepts, that a run can load, and that selects that case and no other (a case named `*`
    is not every case); the cases that pass are promoted without selecting a failing one."""
    names = hostile_names()
    import_model(cli, tmp_path, "hm", names)
    import_model(cli, tmp_path, "h*", names[:20])  # a model name that is a wildcard of the other
    occ = triage.occurrences(db_path)
    fails = {(o["model"], o["name"]) for i, o in enumerate(occ) if i % 3 != 2}
    run = runs_data.record_run(db_path, {(o["model"], o["name"]): ("failed" if (o["model"], o["name"]) in fails
                                                                  else "passed", 0.5) for o in occ},
                               device="cp*u|{x}\n#", backend="in?ductor")
    con = sqlite3.connect(db_path)
    with con:  # what a DB from elsewhere may hold: stages casedb does not know, errors that are YAML
        for i, (mcid,) in enumerate(con.execute("SELECT model_case_id FROM judgements WHERE run_id = ?", [run])):
            con.execute("UPDATE judgements SET stage = ? WHERE run_id = ? AND model_case_id = ?",
                        [STAGES[i % len(STAGES)], run, mcid])
        con.execute("UPDATE results SET error_message = ? WHERE error_message IS NOT NULL",
                    ["boom\x07\n#: {a: b}\u2028cases: []"])
        # a promoted op from elsewhere, named like a pattern
        con.execute("UPDATE cases SET op = 'torch.ne*g|x' WHERE signature IN (SELECT signature FROM model_cases"
                    " WHERE model = 'h*')")
    con.close()
    occ = triage.occurrences(db_path)
    path = tmp_path / "triage" / "t.yaml"
    result = cli("triage", "update", "--from-run", run, path, "--scope", "device,backend")
    assert result.exit_code == 0, result.output
    assert triage.check([path], db_path) == []
    assert cli("triage", "check", path).exit_code == 0
    triage.require_clean([path], db_path)  # what every run does first
    t = triage.load([path])
    target = {"device": "cp*u|{x}\n#", "backend": "in?ductor", "arch": None}
    for o in occ:
        e = t.entry_for(o, target)
        assert e is not None, o
        if (o["model"], o["name"]) in fails:
            assert e.status == "known_failure"
            assert [x for x in occ if e.matches_case(x)] == [o], (o, e.selectors)
        else:
            assert e.status == "expected_pass", (o, e.selectors)
    # only that target: the device and backend are literals too
    assert t.entry_for(occ[0], {"device": "cpu", "backend": "inductor", "arch": None}) is None
    # the same run again changes nothing
    assert not triage.propose(db_path, run, path, scope=("device", "backend")).changed


def test_the_literal_form_and_the_bracket_escapes(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text('cases:\n'
                    '  - {name: "=*", status: known_failure}\n'
                    '  - {name: "[[]x[]]", status: exclude}\n'
                    '  - {name: "=x[0]|{a}", status: not_supported}\n'
                    '  - {name: "= lead", status: expected_pass}\n'
                    '  - {name: "=", status: known_failure, reason: the case with no name}\n', encoding="utf-8")
    assert triage.check([path]) == []
    t = triage.load([path])

    def status(name):
        e = t.entry_for({"model": "m", "name": name, "op": "torch.neg", "signature": "ab" * 32}, {})
        return e.status if e else None

    assert [status(n) for n in ("*", "mul_1", "[x]", "x", "x[0]|{a}", " lead", "lead", "")] == [
        "known_failure", None, "exclude", None, "not_supported", "expected_pass", None, "known_failure"]
    assert [triage.literal(v) for v in ("mul_1", "*", "a]", " x", "=", "", "a|b", "torch.add")] == [
        "mul_1", "=*", "=a]", "= x", "==", "=", "=a|b", "torch.add"]


# ----------------------------------------------------------------------- marker expressions (8)


@pytest.mark.parametrize("expr", ["not " * 100_000 + "x", "not " * 1000 + "x", "(" * 150 + "not " * 70 + "x" + ")" * 150,
                                  "a or " * 2000 + "a"])
def test_deep_or_long_marker_expressions_are_refused_in_bounded_time_and_memory(expr):
    """(Before: RecursionError or MemoryError from Python's parser, which killed workers.)"""
    import time
    import tracemalloc

    tracemalloc.start()
    t = time.perf_counter()
    try:
        with pytest.raises(ValueError, match="marker expression .* (characters long; at most 4096|nests more than 64)"):
            marks.MarkExpression(expr)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t < 5 and peak < 1 << 30


def test_a_deep_marker_expression_is_a_clear_error_everywhere(cli, db_path, tmp_path):
    runs_data.import_manifests(cli, tmp_path)
    deep = "not " * 1000 + "constant"
    path = tmp_path / "t.yaml"
    path.write_text(f'cases:\n  - {{marks: "{deep}", status: exclude}}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"t.yaml:2: marks: marker expression .* nests more than 64"):
        triage.load([path])
    for args in (("cases", "-m", deep), ("run", "--model", "model_a", "-j", "0", "-m", deep),
                 ("run", "--model", "model_a", "-j", "0", "--triage", path)):
        result = cli(*args)
        assert result.exit_code == 2, result.output
        assert "nests more than 64 levels" in result.stderr and "Traceback" not in result.output
    assert rows(db_path, "SELECT count(*) AS n FROM runs") == [{"n": 0}]
