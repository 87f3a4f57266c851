"""One column list for results (issue 42, item 2): casedb.store.result_columns says each column of
`results` and where a run takes it from; the store's insert and the executed payload derive their
keys from it, so a column added there reaches both, and one taken from the verdict must be a
Verdict field."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from casedb.judge.verdict import Verdict, judge
from casedb.run import target
from casedb.run.execute import run_case
from casedb.store import result_columns
from tests.helpers import rows

ADD = {"signature": "cd" * 32, "op": "torch.add", "dtype": "float32", "seed": 0, "attrs": {},
       "inputs": [{"tensor": {"shape": [4, 8], "dtype": "float32", "init": "randn"}}] * 2}


def test_every_column_from_the_verdict_is_a_verdict_field():
    fields = {f.name for f in dataclasses.fields(Verdict)}
    missing = [c for c in result_columns.FROM_VERDICT if c not in fields]
    assert not missing, f"columns said to come from the Verdict that it does not have: {missing}"
    assert result_columns.RESULT_COLUMNS == result_columns.RESULT_COLUMNS


def test_an_executed_payload_fills_every_column(tmp_path):
    ex = run_case(ADD, high_precision=True)
    payload = target._executed_payload(ex, [(SimpleNamespace(model="m", name="n"), judge(ex))], [])
    payload["result"]["input_values"] = "random"  # (execute_item's)
    assert set(payload["result"]) - {"metrics"} == set(result_columns.RESULT_COLUMNS)
    assert not set(payload["result"]["metrics"]) & set(result_columns.FROM_VERDICT)  # (not stored twice)


def test_the_results_table_has_every_column(tmp_path):
    from casedb.store.database import Store

    with Store(tmp_path / "c.db"):
        pass
    table = {r["name"] for r in rows(tmp_path / "c.db", "PRAGMA table_info(results)")}
    assert set(result_columns.RESULT_COLUMNS) <= table
