"""The seams between casedb's parts (issue 42, item 2): typed records where data crosses from one
part to another (importer -> ingest, run -> store, store -> casedb run), the verdict decided in one
place before it is recorded, and a run spec that cannot change once built."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

import importers
from casedb import triage
from casedb.run import console
from casedb.run.decide import final_verdict, triage_target
from casedb.run.execute import run_case
from casedb.run.plan import Occurrence
from casedb.run.runspec import RunSpec
from casedb.run.target import Target, _judgement
from casedb.store import records, recorder, result_columns
from casedb.store.database import Store
from importers.record import CaseRecord, ImportRecord, ModelRecord, SkippedRecord
from tests.helpers import DATA, rows

ROOT = Path(__file__).resolve().parents[2]
ADD = {"signature": "cd" * 32, "op": "torch.add", "dtype": "float32", "seed": 0, "attrs": {},
       "inputs": [{"tensor": {"shape": [4, 8], "dtype": "float32", "init": "randn"}}] * 2}


def keys(typed_dict) -> set:
    return set(typed_dict.__required_keys__) | set(typed_dict.__optional_keys__)


# ------------------------------------------------------------------------------ typed records

def test_the_result_row_is_the_column_list_and_the_table_is_it_and_the_recorders(tmp_path):
    assert tuple(records.ResultRow.__annotations__) == (*result_columns.RESULT_COLUMNS, "metrics")
    with Store(tmp_path / "c.db"):
        pass
    table = {r["name"] for r in rows(tmp_path / "c.db", "PRAGMA table_info(results)")}
    # a column added by a migration but not to the list (or the reverse) is a row nobody fills
    assert table == {"id", *result_columns.RESULT_COLUMNS, *result_columns.RECORDER_COLUMNS}


def test_a_judgement_is_a_judgements_row():
    occ = Occurrence(model_case_id=1, model="m", name="n")
    assert set(_judgement(occ, "passed", "")) == keys(records.Judgement)
    own = {"run_id", "result_id", "signature", "created_at"}  # the recorder's; "name" is the report's
    assert keys(records.Judgement) - {"name"} == set(recorder.JUDGEMENT_COLUMNS) - own


def test_a_triage_reading_has_the_keys_of_its_type(tmp_path):
    from casedb.triage.entries import Reading

    path = tmp_path / "t.yaml"
    path.write_text("version: 1\ncases:\n  - {op: torch.add, status: known_failure}\n"
                    "  - {op: torch.mul, status: exclude}\n")
    loaded = triage.load([path])
    on = {"device": "cpu", "backend": "eager", "arch": None}
    for op, outcome in (("torch.add", "failed"), ("torch.add", "passed"), ("torch.mul", None), ("torch.sub", "failed")):
        case = {"model": "m", "name": "n", "op": op, "signature": "ab" * 32, "dtype": "float32", "marks": []}
        assert set(triage.verdict(loaded.entry_for(case, on), outcome)) == keys(Reading), op


def test_a_run_summary_has_the_keys_of_its_type(tmp_path):
    with Store(tmp_path / "c.db"):
        pass
    from casedb.store.database import open_store
    from casedb.store.run_lifecycle import finish_run, start_run

    with open_store(tmp_path / "c.db") as store:
        run_id = start_run(store.conn, selection={"options": {}}, args=[], device="cpu", backend="eager")
        summary = finish_run(store.conn, run_id, "interrupted", error="e", fatal="f", session={"cases": 0})
    assert set(summary) <= keys(records.RunSummary), set(summary) - keys(records.RunSummary)
    assert set(console.JSON_KEYS) <= keys(records.RunSummary)  # what `casedb run --json` prints


SAMPLES = {"yaml": ROOT / "manifests" / "gpt-oss.yaml", "spyre-v2": DATA / "v2" / "toy-v2.yaml",
           "kineto": DATA / "traces" / "tiny_bf16_forward.kineto.json",
           "et": DATA / "traces" / "tiny_bf16_forward.et.json", "oplog": DATA / "traces" / "handwritten_oplog.txt"}
BY_TYPE = {"model": ModelRecord, "case": CaseRecord, "skipped": SkippedRecord}


@pytest.mark.parametrize("fmt", sorted(importers.FORMATS))
def test_every_importer_yields_import_records(fmt, tmp_path):
    module = importers.module(fmt)
    assert typing.get_type_hints(module.parse)["return"] == typing.Iterator[ImportRecord]
    if fmt == "scan":
        path = tmp_path / "s.jsonl"
        path.write_text('{"casedb_scan": 1, "model": "m", "level": "top", "phase": "forward"}\n'
                        '{"type": "case", "case": {"op": "torch.relu"}, "paths": ["default"]}\n'
                        '{"type": "skipped", "op": "torch.foo", "reason": "r"}\n', encoding="utf-8")
    else:
        path = SAMPLES[fmt]
    seen = set()
    for rec in module.parse(path):
        declared = BY_TYPE[rec["type"]]
        assert set(declared.__required_keys__) <= set(rec) <= keys(declared), (fmt, rec)
        seen.add(rec["type"])
    assert "case" in seen


# ------------------------------------------------------------------------------ one verdict

def test_the_verdict_is_final_before_it_is_recorded(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("version: 1\ncases:\n  - {op: torch.add, status: known_failure, reason: tracked}\n")
    loaded = triage.load([path])
    target = Target(device="cpu", backend="eager")
    occ = Occurrence(model_case_id=None, model="m", name="add_1")
    case = {"model": "m", "name": "add_1", "op": "torch.add", "signature": ADD["signature"], "dtype": "float32",
            "marks": []}
    entry = loaded.entry_for(case, triage_target(target))
    v = final_verdict(run_case(ADD, high_precision=True), occ, {}, entry, tolerances={"float32": (1e-5, 1e-5)},
                      target=target, triage=loaded)
    # the judge passed it; the run's triage file expects it to fail: xpassed, read as known, with where
    assert (v.outcome, v.triage) == ("xpassed", "known") and v.triage_where.endswith(":3")
    assert "remove the known_failure entry" in v.reason


def _sets_an_outcome(node) -> bool:
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(el, ast.Attribute) and el.attr in ("outcome", "reason")
                   for t in targets for el in (t.elts if isinstance(t, ast.Tuple) else [t]))
    return (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "replace"
            and any(k.arg == "outcome" for k in node.keywords))


def test_only_the_judge_and_its_caller_decide_an_outcome():
    """A verdict's outcome is set by the judge (casedb.judge) and read under triage by its caller
    (casedb.run.decide), once: nothing rewrites it later."""
    found = []
    for path in sorted((ROOT / "casedb").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "judge" or rel == Path("casedb/run/decide.py"):
            continue
        found += [f"{rel}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if _sets_an_outcome(n)]
    assert found == []


# ------------------------------------------------------------------------------ the run spec

def test_a_run_spec_cannot_change_once_built():
    spec = RunSpec(models=["m"], backend="eager")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.triage = ["t.yaml"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.all_models = True
    changed = dataclasses.replace(spec, all_models=True)
    assert (spec.all_models, changed.all_models, changed.models, changed.backend) == (False, True, ["m"], "eager")
