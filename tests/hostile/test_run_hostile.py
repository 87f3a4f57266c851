"""Hostile names and hostile databases against run, resume, repro and the terminal: nothing
they hold is ever run, no occurrence is lost, and a case's own exceptions are its outcome."""

import json
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.helpers import rows

INJECT = '"""\nimport pathlib; pathlib.Path({marker!r}).touch()\n"""'
CPU_EAGER = ("--device", "cpu", "--backend", "eager", "-j", "0", "--no-progress")


def manifest(path: Path, model: str, cases: list[dict], **default) -> Path:
    path.write_text(yaml.safe_dump({"model": model, "default": {"dtype": "fp16", **default}, "cases": cases},
                                   allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def add_case(name: str, rows: int = 4) -> dict:
    return {"name": name, "op": "torch.add", "inputs": [{"tensor": {"shape": [rows, 64]}},
                                                         {"tensor": {"shape": [rows, 64]}}]}




def run_plain_python(path: Path, *args):
    # casedb made unimportable: the script must need torch only
    code = ("import runpy, sys; sys.modules['casedb'] = None; "
            f"sys.argv = [{str(path)!r}, *{list(args)!r}]; runpy.run_path({str(path)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


# --------------------------------------------------------------------------------- 1: repro

@pytest.mark.slow
def test_repro_of_cases_with_hostile_names_runs_nothing_and_still_reproduces(cli, tmp_path):
    marker = tmp_path / "pwned"
    name = INJECT.format(marker=str(marker))
    other = "x'''\nimport os; os.system('touch " + str(marker) + "')  # {0} \\ \x7f"
    manifest(tmp_path / "a.yaml", "m1" + INJECT.format(marker=str(marker)), [add_case(name)])
    manifest(tmp_path / "b.yaml", "m2", [add_case(other)], rtol=0.5, atol=0.5)
    assert cli("import", tmp_path / "a.yaml", tmp_path / "b.yaml").exit_code == 0
    out = tmp_path / "repro.py"
    res = cli("repro", name, "--device", "cpu", "--backend", "eager", "-o", out)
    assert res.exit_code == 0, res.output
    compile(out.read_text(), str(out), "exec")  # valid Python whatever the names hold
    done = run_plain_python(out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("OK: torch.add on cpu (eager) matches the CPU reference")
    shown = run_plain_python(out, "--show")
    assert shown.returncode == 0, shown.stderr
    used_by = json.loads(shown.stdout)["used_by"]
    assert {u["name"] for u in used_by} == {name, other}  # the names are data, kept exactly
    assert not marker.exists()


@pytest.mark.slow
def test_repro_still_reproduces_a_failure_for_a_hostile_name(cli, tmp_path, data_dir):
    marker = tmp_path / "pwned"
    name = INJECT.format(marker=str(marker))
    manifest(tmp_path / "a.yaml", "m", [add_case(name)], rtol=1.0e-3, atol=1.0e-3)
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    out = tmp_path / "repro.py"
    assert cli("repro", name, "--device", "cpu", "--backend", "casedb_test_perturb",
               "--import", data_dir / "custom_ops.py", "-o", out).exit_code == 0
    done = run_plain_python(out)
    assert done.returncode == 1 and "exceed atol=0.001 + rtol=0.001*|ref|" in done.stderr
    assert not marker.exists()


# ------------------------------------------------------------------------ 2: shell quoting

@pytest.mark.slow
def test_displayed_repro_commands_are_one_shell_word_each(cli, db_path, tmp_path, data_dir):
    marker = tmp_path / "pwned"
    model = f"x;touch {marker};#"
    name = f"$(touch {marker})`touch {marker}`"
    manifest(tmp_path / "a.yaml", model, [add_case(name)], rtol=1.0e-3, atol=1.0e-3)
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    res = cli("run", "--device", "cpu", "--backend", "casedb_test_perturb", "--import", data_dir / "custom_ops.py",
              "-j", "0", "--no-progress")
    assert res.exit_code == 1, res.output
    sig = rows(db_path, "SELECT signature FROM cases")[0]["signature"]
    want = ["casedb", "repro", sig[:16], "--model", model, "--device", "cpu", "--backend", "casedb_test_perturb",
            "--run", "1"]
    from_view = rows(db_path, "SELECT repro FROM verdicts")[0]["repro"]
    md = cli("report", "--markdown").stdout
    from_md = [c for c in md.split("`") if c.startswith("casedb repro ")]
    assert from_md and all(shlex.split(c) == want for c in [from_view, *from_md])
    # pasted into a shell, the command is casedb repro and nothing else
    command = from_view.replace("casedb", f"{shlex.quote(sys.executable)} -m casedb", 1)
    done = subprocess.run(["sh", "-c", command + " > /dev/null"], cwd=tmp_path, capture_output=True, text=True,
                          env={"CASEDB_DB": str(db_path), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


# ----------------------------------------------------------------- 3: a database from elsewhere

PLANTED = "import pathlib\npathlib.Path({marker!r}).touch()\n"


def test_resume_never_imports_a_module_the_database_names(cli, db_path, tmp_path):
    marker = tmp_path / "pwned"
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED.format(marker=str(marker)))
    manifest(tmp_path / "a.yaml", "m", [add_case("one"), add_case("two", 8)])
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    assert cli("run", *CPU_EAGER, "--limit", "1").exit_code == 0
    # the file arrives from elsewhere with an --import planted in its stored selection
    conn = sqlite3.connect(db_path)
    sel = json.loads(conn.execute("SELECT selection FROM runs").fetchone()[0])
    sel["options"].update(imports=[str(planted)], limit=None)
    conn.execute("UPDATE runs SET selection = ?, status = 'interrupted'", [json.dumps(sel)])
    conn.commit()
    conn.close()
    merged = tmp_path / "merged.db"
    assert cli("merge", db_path, "--into", merged).exit_code == 0
    for db in (db_path, merged):
        res = cli("run", "--resume", "1", "-j", "0", db=db)
        assert res.exit_code == 2
        assert f"recorded with --import {planted}" in res.output and "give it again to resume" in res.output
        assert not marker.exists()
    # given on the command line, by the user, it is imported
    assert cli("run", "--resume", "1", "-j", "0", "--import", planted, "--no-progress").exit_code == 0
    assert marker.exists()
    assert rows(db_path, "SELECT count(*) AS n FROM results")[0]["n"] == 2


def test_option_values_never_reach_pytests_plugin_scan(cli, db_path, tmp_path, monkeypatch):
    # pytest imports NAME for any argv element "-pNAME" before it parses options: a value given as
    # an element of its own (an --op, a -k or -m, a stored selection of a DB from elsewhere) must not be one
    marker = tmp_path / "pwned"
    (tmp_path / "plantedplug.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    manifest(tmp_path / "a.yaml", "m", [add_case("one"), add_case("two", 8)])
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    res = cli("run", *CPU_EAGER, "--op=-pplantedplug")
    assert not marker.exists()
    assert res.exit_code == 0, res.output
    assert cli("run", *CPU_EAGER, "--limit", "1").exit_code == 0
    conn = sqlite3.connect(db_path)
    sel = json.loads(conn.execute("SELECT selection FROM runs WHERE id = 2").fetchone()[0])
    sel["options"].update(op="-pplantedplug", limit=None)
    conn.execute("UPDATE runs SET selection = ?, status = 'interrupted' WHERE id = 2", [json.dumps(sel)])
    conn.commit()
    conn.close()
    cli("run", "--resume", "2", "-j", "0", "--no-progress")
    assert not marker.exists()


# ------------------------------------------------------------- 6: identity never from display text

@pytest.mark.parametrize("jobs", ["0", "1"])
def test_no_dedupe_records_every_occurrence_whatever_its_name(cli, db_path, tmp_path, jobs):
    names = ["a::b", "c::d::e", "test_model_op[x]", "plain"]
    manifest(tmp_path / "a.yaml", "m::n", [add_case(n, i + 1) for i, n in enumerate(names)])
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    res = cli("run", "--device", "cpu", "--backend", "eager", "-j", jobs, "--no-dedupe", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["status"], s["executed"], s["passed"], s["occurrences"]) == ("finished", 4, 4, 4)
    judged = rows(db_path, "SELECT mc.name FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id")
    assert sorted(r["name"] for r in judged) == sorted(names)


def test_a_run_that_lost_a_result_does_not_report_success(cli, db_path, tmp_path, monkeypatch):
    from casedb.store import recorder

    manifest(tmp_path / "a.yaml", "m", [add_case("one"), add_case("two", 8), add_case("three", 2)])
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    real = recorder.Recorder.record

    def lose_the_second(self, item, payload, **kw):
        if item.occurrences[0].name == "two":
            return False  # the write did not happen
        return real(self, item, payload, **kw)

    monkeypatch.setattr(recorder.Recorder, "record", lose_the_second)
    res = cli("run", *CPU_EAGER[:-1], "--json")
    assert res.exit_code == 1
    s = json.loads(res.stdout)
    assert (s["status"], s["executed"]) == ("interrupted", 2)
    assert "1 of 3 selected cases have no recorded result" in s["error"]


# -------------------------------------------------------------------------- 7: Rich markup

def test_markup_in_names_prints_as_written(cli, db_path, tmp_path):
    model, name = "[/m]", "[red]x[/red] :smile: [link=file:///etc/passwd]y[/link]"
    manifest(tmp_path / "a.yaml", model, [add_case(name)])
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    for args in (("models",), ("cases",), ("show", name), ("run", *CPU_EAGER), ("report",)):
        res = cli(*args)
        assert res.exit_code == 0, (args, res.output)
        flat = " ".join(res.output.split())
        assert model in flat, args
    assert name in " ".join(cli("show", name).output.split())
    missing = cli("cases", "--model", "[/nope]")
    assert missing.exit_code == 2 and "no model '[/nope]'" in missing.output


# --------------------------------------------------------- 8: a case's exceptions are its outcome

@pytest.mark.parametrize("jobs", ["0", "1"])
def test_an_op_raising_keyboardinterrupt_or_systemexit_is_that_cases_outcome(cli, db_path, tmp_path, data_dir, jobs):
    interrupt = [{"name": f"raises{kind}", "op": "torch.ops.casedb_test.interrupt",
                  "inputs": [{"tensor": {"shape": [2, 64]}}, {"value": kind}]} for kind in (0, 1)]
    cases = [add_case("ok1"), interrupt[0], add_case("ok2", 8), interrupt[1], add_case("ok3", 2)]
    manifest(tmp_path / "a.yaml", "m", cases)
    assert cli("import", tmp_path / "a.yaml").exit_code == 0
    res = cli("run", "--device", "cpu", "--backend", "eager", "-j", jobs, "--import", data_dir / "custom_ops.py",
              "--json")
    assert res.exit_code == 0, res.output  # the CPU reference raised: bad cases, counted apart
    s = json.loads(res.stdout)
    assert (s["status"], s["executed"], s["passed"], s["ref_errors"]) == ("finished", 5, 3, 2)
    got = {r["name"]: r for r in rows(db_path, """SELECT mc.name, j.outcome, j.reason FROM judgements j
                                                  JOIN model_cases mc ON mc.id = j.model_case_id""")}
    assert got["raises0"]["outcome"] == "ref_error" and "KeyboardInterrupt: raised by the op" in got["raises0"]["reason"]
    assert got["raises1"]["outcome"] == "ref_error" and "SystemExit: 3" in got["raises1"]["reason"]
    assert "PlanItem" not in got["raises1"]["reason"]
