"""The ``expert_ranks`` recipe axis: one rank of an expert-parallel deployment, scanned on the
meta device (its sentinel masking recorded, the model left as built, bad values refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from casedb.cases import spec as casespec
from casedb.run.execute import run_case
from casedb.scan import scanner as scan
from casedb.scan.expert_parallel import one_rank

DATA = Path(__file__).parents[1] / "data" / "scan"
SENTINEL_OPS = {"torch.Tensor.ge", "torch.Tensor.clamp_", "torch.Tensor.masked_fill_"}


def recipe(tmp_path: Path, config: str = "tiny-gpt-oss.json", arch: str = "GptOssForCausalLM", **axes) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"model": "r", "config": str(DATA / config), "arch": arch,
                                    "defaults": {"dtype": "bf16", "seed": 0},
                                    "inputs": {"batch": 1, "seq_len": 12}, **axes}))
    return path


@pytest.fixture(scope="module")
def ep_scan(tmp_path_factory):
    return scan.scan(recipe(tmp_path_factory.mktemp("ep"), alone={"expert_ranks": [1, 2]}))


def test_rank_path_records_the_sentinel_masking(ep_scan):
    names = [p["name"] for p in ep_scan.header["paths"]]
    assert names == ["default", "ep2"]  # one rank of one: the path as it was without the axis

    def ops(path):
        return {r["case"]["op"] for r in ep_scan.cases if path in r["paths"]}

    assert SENTINEL_OPS <= ops("ep2") - ops("default")
    # rank 0 of 2 holds 2 of the 4 experts: the grouped matmul sees half the expert weights
    grouped = {tuple(r["case"]["inputs"][1]["tensor"]["shape"]) for r in ep_scan.cases
               if r["case"]["op"] == "torch._grouped_mm" and "ep2" in r["paths"]}
    assert grouped and all(shape[0] == 2 for shape in grouped)
    ge = next(r for r in ep_scan.cases if r["case"]["op"] == "torch.Tensor.ge" and "ep2" in r["paths"])
    assert ge["case"]["inputs"][1] == {"value": 2}  # ids >= the local expert count are other ranks'


def test_rank_path_cases_pass_the_reference(ep_scan):
    failures = []
    for rec in ep_scan.cases:
        if "ep2" not in rec["paths"]:
            continue
        norm = casespec.normalize_case(rec["case"], {"dtype": "bf16"})
        ex = run_case({"op": norm.op, "inputs": norm.inputs, "attrs": norm.attrs, "seed": norm.seed,
                       "signature": norm.signature}, device="cpu", load_blob=norm.blobs.get)
        declared = (rec["case"].get("expects_error") or {}).get("ref")
        if (ex.ref_error is None) != (declared is None):
            failures.append(f"{rec['where']} {rec['case']['op']}: declared {declared}, got {ex.ref_error}")
    assert failures == []


def test_the_model_is_left_as_built(tmp_path):
    model = scan._build(scan.load_recipe(recipe(tmp_path)))
    experts = [m for m in model.modules() if hasattr(m, "_is_expert_parallel")]
    before = [(m.num_experts, m._is_expert_parallel, {n: tuple(p.shape) for n, p in m.named_parameters()})
              for m in experts]
    with one_rank(model, 2):
        assert {m.num_experts for m in experts} == {2} and all(m._is_expert_parallel for m in experts)
    after = [(m.num_experts, m._is_expert_parallel, {n: tuple(p.shape) for n, p in m.named_parameters()})
             for m in experts]
    assert after == before and before[0][0] == 4


def test_bad_ranks_are_refused(tmp_path):
    with pytest.raises(scan.ScanError, match="cannot shard 4 experts evenly over 3 expert-parallel ranks"):
        scan.scan(recipe(tmp_path, alone={"expert_ranks": [1, 3]}))
    with pytest.raises(scan.ScanError, match="expert_ranks: 0 is not a valid value"):
        scan.load_recipe(recipe(tmp_path, alone={"expert_ranks": [1, 0]}))
    with pytest.raises(scan.ScanError, match="BertModel has no expert-parallel experts modules"):
        scan.scan(recipe(tmp_path, "tiny-bert.json", "BertModel", alone={"expert_ranks": [1, 2]}))
