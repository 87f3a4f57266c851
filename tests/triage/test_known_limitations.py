"""A known limitation of a backend is said once, by op and input kind, and holds for any model:
the shipped triage's dynamo entry (a 0-d integer index tensor) covers a MoE model casedb does not ship."""

from __future__ import annotations

import pytest

MOE = """
model: mixtral-like
default: {dtype: bf16}
cases:
  - name: expert_weight
    op: torch.getitem
    inputs:
      - tensor: {shape: [8, 64, 32]}
      - tensor: {shape: [], dtype: int64, init: randint, init_args: {low: 0, high: 8}}
  - name: row
    op: torch.getitem
    inputs:
      - tensor: {shape: [8, 64, 32]}
      - value: 3
"""


def test_the_0d_index_mark(cli, tmp_path):
    (tmp_path / "moe.yaml").write_text(MOE)
    cli("import", tmp_path / "moe.yaml")
    marks = {c["name"]: c["marks"] for c in cli.json("cases", "--model", "mixtral-like", "-m", "")}
    assert "int0d" in marks["expert_weight"] and "int0d" not in marks["row"]
    assert [c["name"] for c in cli.json("cases", "-m", "int0d")] == ["expert_weight"]


@pytest.mark.slow
def test_the_shipped_dynamo_limitation_applies_to_a_model_casedb_does_not_ship(cli, tmp_path):
    (tmp_path / "moe.yaml").write_text(MOE)
    cli("import", tmp_path / "moe.yaml")
    run = cli.json("run", "--model", "mixtral-like", "--device", "cpu", "--backend", "inductor", "-m", "")
    assert (run["xfailed"], run["passed"], run["unexpected"]) == (1, 1, 0)
    assert run["triage"].get("known") == 1
