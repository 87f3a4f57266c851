"""Sizes that fit their input (issue 27): a split / view / reshape whose sizes the model computes
as integer tensors (Mistral3's patch merger) is recorded with the values the scan saw; a call
whose recorded sizes cannot fit is not recorded (a skipped record, a warning), and `casedb check`
lists such a case in any DB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from casedb.cases import size_rules, valid_inputs
from casedb.scan import scanner as scan
from casedb.scan.recording import Recorder, encode_call
from tests.scan.test_scan import DATA, T, reference_error, write_recipe

SIZES = [{"shape": [], "dtype": "int64", "init": "data", "data": [v]} for v in (6, 4, 2, 3, 1)]


def _merge_patches():
    """Mistral3's patch merger on two images of 2x3 and 1x4 patches: the features are meta, the
    image sizes real CPU tensors, and their products split the features per image."""
    features = torch.empty(10, 4, dtype=torch.bfloat16, device="meta")
    grids = torch.tensor([[2, 3], [1, 4]])
    tokens = [h * w for h, w in grids]
    for image, (h, w) in zip(features.split(tokens), grids):
        image.view(h, w, 4)


def _recorded(fn) -> Recorder:
    rec = Recorder("torch", model="fake")
    with rec.modes():
        rec.recording = True
        fn()
    return rec


def test_computed_sizes_are_recorded_with_the_values_the_scan_saw():
    rec = _recorded(_merge_patches)
    cases = [r["case"] for r in rec.records() if r["type"] == "case" and r["case"]["op"] in ("torch.Tensor.split",
                                                                                           "torch.Tensor.view")]
    assert [(c["op"], c["inputs"], c["attrs"]) for c in cases] == [
        ("torch.Tensor.split", [T([10, 4]), {"tensor_list": SIZES[:2]}], {"dim": 0}),
        ("torch.Tensor.view", [T([6, 4]), {"tensor": SIZES[2]}, {"tensor": SIZES[3]}, {"value": 4}], {}),
        ("torch.Tensor.view", [T([4, 4]), {"tensor": SIZES[4]}, {"tensor": SIZES[1]}, {"value": 4}], {}),
    ]
    assert [reference_error(c) for c in cases] == [None, None, None]
    assert [r for r in rec.records() if r["type"] == "skipped"] == []


@pytest.mark.parametrize("args,reason", [
    # sizes the scan holds no values of (meta tensors): random at replay
    ((torch.empty(6, 4, device="meta"), torch.empty((), dtype=torch.int64, device="meta"),
      torch.empty((), dtype=torch.int64, device="meta"), 4),
     "inputs[1], inputs[2] of torch.Tensor.view are sizes with random values, which cannot fit inputs[0] [6, 4]: "
     "give the model's values (init: data)"),
    # literal sizes of a shrunk input
    ((torch.empty(5, 4, device="meta"), 3, 2, 4),
     "the torch.Tensor.view sizes [3, 2, 4] cannot hold the 20 elements of inputs[0] [5, 4]"),
])
def test_a_call_whose_sizes_cannot_fit_is_dropped_with_a_warning(args, reason):
    rec = Recorder("torch", model="fake")
    rec.recording = True
    out = torch.empty(2, 3, 4, device="meta")
    reason = f"sizes that cannot fit the recorded input: {reason}"
    with pytest.warns(UserWarning, match=r"test_scan_sizes.py:\d+: torch.Tensor.view not recorded: sizes that"):
        for _ in range(2):  # one warning, one record counting both calls
            rec.add("torch.Tensor.view", args, out, encode_call("torch.Tensor.view", args, {}))
    [record] = rec.records()
    assert record.pop("where").startswith("tests/scan/test_scan_sizes.py:")
    assert record == {"type": "skipped", "op": "torch.Tensor.view", "reason": reason, "count": 2}


def test_tiny_mistral3_scan_records_its_image_grid_sizes(tmp_path):
    recipe = write_recipe(tmp_path, "tiny-mistral3", "tiny-mistral3.json", "Mistral3ForConditionalGeneration",
                          batch=2, text_len=5, image_size=[16, 24])
    result = scan.scan(recipe)
    merger = [r["case"] for r in result.cases if r["where"].startswith("transformers/models/mistral3/")
              and r["case"]["op"] in ("torch.Tensor.split", "torch.Tensor.view")]
    # 16x24 pixels / patch 4 = 4x6 = 24 patches per image, two images
    assert [c["inputs"][:3] for c in merger if c["op"] == "torch.Tensor.split"] == [
        [T([48, 32]), {"tensor_list": [{"shape": [], "dtype": "int64", "init": "data", "data": [24]}] * 2}]]
    assert [c["inputs"] for c in merger if c["op"] == "torch.Tensor.view"][0] == [
        T([24, 32]), {"tensor": {"shape": [], "dtype": "int64", "init": "data", "data": [4]}},
        {"tensor": {"shape": [], "dtype": "int64", "init": "data", "data": [6]}}, {"value": 32}]
    assert [reference_error(c) for c in merger] == [None] * len(merger)
    assert not [r for r in result.records if r["type"] == "skipped" and r["reason"].startswith("sizes")]


def _case(op, *inputs, **attrs):
    return {"op": op, "inputs": list(inputs), "attrs": attrs}


X = T([6, 4])


@pytest.mark.parametrize("case", [
    _case("torch.Tensor.view", X, {"value": [2, -1]}),
    _case("torch.Tensor.view", X, {"value": "torch.float16"}),                   # view(dtype): no sizes
    _case("torch.Tensor.reshape", X, shape={"value": [3, 8]}),
    _case("torch.reshape", X, {"value": [-1]}),
    _case("torch.ops.aten.view.default", X, {"value": [24]}),
    _case("torch.Tensor.split", X, {"value": 4}),                                # chunks of 4: 4 + 2
    _case("torch.split", X, {"value": [1, 3]}, {"value": 1}),
    _case("torch.ops.aten.split_with_sizes.default", X, {"value": [2, 4]}),
    _case("torch.Tensor.split", X, {"tensor_list": [SIZES[3], SIZES[3]]}, dim=0),
    _case("torch.Tensor.view", X, T([], "int64", init="randint", init_args={"low": 3, "high": 4}), {"value": 8}),
    _case("torch.Tensor.view", X, T([], "int64", init="data", blob="ab12"), {"value": 8}),  # values not here
])
def test_sizes_that_fit_are_no_problem(case):
    assert valid_inputs.wants_values(case["op"])  # the rule covers the op
    assert size_rules.misfits(case) == []
    assert valid_inputs.problems(case) == []


@pytest.mark.parametrize("case,problem", [
    (_case("torch.Tensor.view", X, {"value": [5, -1]}), "the torch.Tensor.view sizes [5, -1] cannot hold the 24 "
                                                        "elements of inputs[0] [6, 4]"),
    (_case("torch.Tensor.view", X, {"value": [-1, -1]}), "the torch.Tensor.view sizes [-1, -1] cannot hold the 24 "
                                                         "elements of inputs[0] [6, 4]"),
    (_case("torch.reshape", X, {"value": [0, -1]}), "the torch.reshape sizes [0, -1] cannot hold the 24 elements "
                                                    "of inputs[0] [6, 4]"),
    (_case("torch.Tensor.split", X, {"value": 0}), "torch.Tensor.split into chunks of 0: a chunk size must be positive"),
    (_case("torch.split", X, {"value": [3, 4]}, {"value": 1}), "the split sizes [3, 4] of torch.split sum to 7, "
                                                               "not to dim 1 (size 4) of inputs[0] [6, 4]"),
    (_case("torch.ops.aten.split_with_sizes.default", X, {"value": [6, 1]}),
     "the split sizes [6, 1] of torch.ops.aten.split_with_sizes.default sum to 7, not to dim 0 (size 6) of "
     "inputs[0] [6, 4]"),
    (_case("torch.Tensor.split", X, {"tensor_list": [SIZES[0], T([], "int64")["tensor"]]}, dim=0),
     "inputs[1][1] of torch.Tensor.split is a size with random values, which cannot fit inputs[0] [6, 4]: "
     "give the model's values (init: data)"),
])
def test_sizes_that_cannot_fit_are_a_problem(case, problem):
    assert size_rules.misfits(case) == [problem]
    assert valid_inputs.problems(case) == [problem]
    assert any(reference_error(case, seed) for seed in range(5))  # the reference raises on it


MISFIT = DATA / "misfit-sizes.yaml"
CHECKED = {
    "split_random": (6, "inputs[1][0], inputs[1][1] of torch.Tensor.split are sizes with random values, which cannot "
                        "fit inputs[0] [24, 32]: give the model's values (init: data)"),
    "view_random": (12, "inputs[1], inputs[2] of torch.Tensor.view are sizes with random values, which cannot fit "
                        "inputs[0] [24, 32]: give the model's values (init: data)"),
    "split_literal": (19, "the split sizes [3, 4] of torch.split sum to 7, not to dim 0 (size 10) of inputs[0] [10, 4]"),
}


@pytest.mark.slow
def test_check_lists_cases_whose_sizes_cannot_fit(cli, db_path):
    report = cli.json("import", MISFIT)
    assert report["files"][0]["warnings"] == [
        {"where": f"{MISFIT}:{line}", "case": name, "problem": problem} for name, (line, problem) in CHECKED.items()]
    result = cli("check", "--json")
    assert result.exit_code == 1
    found = json.loads(result.stdout)
    assert [(r["case"], r["source"], r["problems"]) for r in found] == [
        (name, f"{MISFIT}:{line}", [problem]) for name, (line, problem) in CHECKED.items()]
    # the fixed calls are valid and pass the CPU eager reference
    run = cli("run", "--device", "cpu", "--backend", "eager", "-m", "")
    outcomes = {r["name"]: r["outcome"] for r in _judged(db_path)}
    assert outcomes == {"split_fixed": "passed", "view_fixed": "passed", "split_random": "ref_error",
                        "view_random": "ref_error", "split_literal": "ref_error"}, run.output


def _judged(db_path: Path) -> list[dict]:
    from tests.helpers import rows

    return rows(db_path, "SELECT mc.name, j.outcome FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id")
