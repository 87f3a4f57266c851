"""The extension points are registries (issue 42, item 4): an import format is one module and one
row of importers.REGISTRY (detection asks every row's sniff, --format's help lists every row, an
option no row takes is refused); a judge is one row of casedb.judge.judges.JUDGES (the verdict,
the run and the repro script read the row); every judge module says whether a repro script
carries it, and the script carries exactly those. Every command and every format is documented."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import typer

import importers
from casedb.errors import InputError
from casedb.judge import judges

ROOT = Path(__file__).resolve().parents[1]

TOY_FORMAT = '''
def sniff(path, head):
    return path.suffix == ".toy"


def parse(path, *, max_bytes=None, shout=False):
    yield {"type": "model", "name": "toy_model"}
    for n, line in enumerate(path.read_text().split(), 1):
        yield {"type": "case", "model": "toy_model", "where": f"{path}:{n}",
               "case": {"name": line, "op": "torch.neg", "inputs": [{"tensor": {"shape": [n]}}]}}
'''

ONE_CASE = """\
model: reg_model
cases:
  - name: reg_add
    op: torch.add
    inputs:
      - tensor: {shape: [4, 8], dtype: float32}
      - tensor: {shape: [4, 8], dtype: float32}
"""


@pytest.fixture
def toy_format(tmp_path, monkeypatch):
    """A format that is only a module on the path and a row of the registry."""
    (tmp_path / "toy_format_mod.py").write_text(TOY_FORMAT)
    monkeypatch.syspath_prepend(str(tmp_path))
    row = importers.Format("toy", "toy_format_mod", "a toy", (".toy",), ("shout",))
    monkeypatch.setattr(importers, "REGISTRY", importers.REGISTRY + (row,))
    monkeypatch.setattr(importers, "FORMATS", {**importers.FORMATS, "toy": row})
    monkeypatch.setattr(importers, "OPTIONS", importers.OPTIONS + ("shout",))
    return row


def test_a_format_in_the_registry_is_detected_and_imported(toy_format, tmp_path):
    from casedb.ingest.save import import_paths
    from casedb.store.database import Store

    path = tmp_path / "cases.toy"
    path.write_text("first second\n")
    assert importers.detect(path) == "toy"
    with Store(tmp_path / "toy.db") as store:
        report = import_paths(store, [path], options={"shout": True})
        assert [f.format for f in report.files] == ["toy"]
        assert sorted(o["name"] for o in store.occurrences(["toy_model"])) == ["first", "second"]


def test_detection_asks_every_format(tmp_path, monkeypatch):
    asked = []
    for fmt in importers.REGISTRY:
        mod = importers.module(fmt.name)
        monkeypatch.setattr(mod, "sniff", lambda path, head, name=fmt.name: asked.append(name) and False)
    path = tmp_path / "notes.txt"
    path.write_text("nothing casedb reads\n")
    with pytest.raises(importers.UnknownFormat, match="cannot tell its format"):
        importers.detect(path)
    assert asked == [f.name for f in importers.REGISTRY]


def test_format_help_names_every_format():
    from casedb.cli import app

    command = typer.main.get_command(app).commands["import"]
    help_text = next(p.help for p in command.params if p.name == "format")
    missing = [name for name in importers.FORMATS if name not in help_text]
    assert not missing, f"casedb import --format's help leaves out {missing}"


def test_an_unknown_import_option_is_refused_and_the_db_is_unchanged(tmp_path):
    from casedb.ingest.save import import_paths
    from casedb.store.database import Store

    (tmp_path / "m.yaml").write_text(ONE_CASE)
    db = tmp_path / "reg.db"
    with Store(db):
        pass
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with Store(db) as store, pytest.raises(InputError, match=r"unknown import option\(s\) 'levle'") as e:
        import_paths(store, [tmp_path / "m.yaml"], options={"levle": "leaf"})
    assert "level" in str(e.value)  # what the formats do take
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_judge_is_one_row(monkeypatch):
    """A judge added as a row alone decides the verdict (no branch on judge names to change)."""
    from casedb.judge.compare import Comparison
    from casedb.judge.verdict import judge
    from casedb.run.execute import run_case

    def never(values, ulp):
        return Comparison(passed=False, reason="the never judge passes nothing", comparable=values.comparable)

    monkeypatch.setitem(judges.JUDGES, "never", judges.Judge("never", "fails everything", False, never))
    case = {"signature": "ab" * 32, "op": "torch.add", "dtype": "float32", "seed": 0, "attrs": {},
            "inputs": [{"tensor": {"shape": [4, 8], "dtype": "float32", "init": "randn"}}] * 2}
    ex = run_case(case, high_precision=False)
    v = judge(ex, judge="never")
    assert (v.outcome, v.reason, v.judge) == ("failed", "the never judge passes nothing", "never")
    assert judge(ex, judge="tolerance").outcome == "passed"


def _judge_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "casedb" / "judge").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", _judge_modules())
def test_every_judge_module_says_whether_repro_carries_it(name):
    import importlib

    module = importlib.import_module(f"casedb.judge.{name}")
    assert isinstance(getattr(module, "IN_REPRO", None), bool), (
        f"casedb/judge/{name}.py: set IN_REPRO = True (repro scripts copy it whole) or False (docs/extending.md)")


def test_the_repro_script_carries_exactly_the_declared_judge_modules(cli, db_path, tmp_path):
    import importlib

    from casedb.read import repro
    from casedb.store.database import Store

    (tmp_path / "m.yaml").write_text(ONE_CASE)
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    with Store(db_path) as store:
        script = repro.script(store, "reg_add")
    copied = re.findall(r"^# ---- (casedb\.judge\.\w+)$", script, re.M)
    declared = [f"casedb.judge.{n}" for n in _judge_modules() if importlib.import_module(f"casedb.judge.{n}").IN_REPRO]
    assert sorted(copied) == declared and len(copied) == len(set(copied))
    compile(script, "repro.py", "exec")


def _docs() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                                                              ROOT / "importers" / "README.md"])


def _commands(command, prefix=()) -> list[str]:
    if hasattr(command, "commands"):
        return [c for name, sub in command.commands.items() for c in _commands(sub, prefix + (name,))]
    return [" ".join(prefix)]


def test_every_command_is_documented():
    from casedb.cli import app

    docs = _docs()
    commands = _commands(typer.main.get_command(app))
    assert "import" in commands and "triage update" in commands
    # `casedb cache info|clear` names both
    missing = [c for c in commands if not re.search(
        r"casedb " + r" ".join(re.escape(w) for w in c.split()[:-1]) + (" " if " " in c else "")
        + r"([\w-]+\|)*" + re.escape(c.split()[-1]) + r"\b", docs)]
    assert not missing, f"commands README.md and docs/ never name (as `casedb COMMAND`): {missing}"


def test_every_format_is_documented():
    table = (ROOT / "importers" / "README.md").read_text(encoding="utf-8")
    missing = [f.name for f in importers.REGISTRY
               if not re.search(rf"^\| `{re.escape(f.name)}` \| `{re.escape(f.module.split('.')[-1])}\.py` \|", table, re.M)]
    assert not missing, f"formats importers/README.md's table has no row for: {missing}"
