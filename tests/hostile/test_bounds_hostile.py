"""Small input, large cost; odd run options (issue 24, items 8 and 9).

A `tensor_list` of 10⁶ entries took 17 s / 1.4 GB to import; a shape of 10⁶ dimensions made
`casedb cases` take 52 s; `torch.full([20000, 20000])` passed `--max-numel` (its inputs hold no
tensor) and allocated 2.3 GB; `--max-numel -5` ran nothing with exit 0, `--timeout nan` had no
limit, `--jobs 100000` hung. Costs are measured in a child process (``os.wait4``: wall time and
peak RSS) next to a baseline measured in the same test: a refused input costs at most 5 s more
and 1 GB in all, and changes nothing in the DB.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest

from bench.bench_hostile import measure_apart
from casedb.cases import materialize
from casedb.cases.ops import op_info
from tests.helpers import DATA, rows, sha256_of
from tests.hostile.test_run_hostile import CPU_EAGER, add_case, manifest

pytestmark = pytest.mark.timeout(600)
MIB = 1024


def casedb(db, *args) -> list[str]:
    return [sys.executable, "-m", "casedb", "--db", str(db), *map(str, args)]


def flow_list(items: str, n: int) -> str:
    return "[" + ", ".join([items] * n) + "]"


@pytest.mark.slow
@pytest.mark.parametrize("name, body, said", [
    ("tensor_list", "      - tensor_list: " + flow_list("{shape: [1]}", 10 ** 6),
     "m.yaml:6: tensor_list holds more than 10,000 items; a case takes at most 10,000 tensors in one list"),
    ("shape", "      - tensor: {shape: " + flow_list("1", 10 ** 6) + "}",
     "m.yaml:6: shape holds more than 64 items; a case takes at most 64 dimensions"),
])
def test_a_million_entries_are_refused_at_import_within_bounds(cli, db_path, tmp_path, name, body, said):
    base = measure_apart(casedb(db_path, "import", DATA / "template.yaml"), timeout=300, cwd=tmp_path)
    assert base["rc"] == 0, base
    before = sha256_of(db_path)
    path = tmp_path / "m.yaml"
    path.write_text(f"model: h\ncases:\n  - name: big\n    op: torch.cat\n    inputs:\n{body}\n")
    r = measure_apart(casedb(db_path, "import", path), timeout=300, cwd=tmp_path, said_chars=1000)
    assert r["rc"] == 2 and said in r["said"], r
    assert r["s"] - base["s"] <= 5 and r["rss_mib"] <= MIB, (base, r)
    assert sha256_of(db_path) == before


def test_every_importer_bounds_lists_and_ranks(cli, db_path, tmp_path):
    """The bound is casedb.cases.input_specs': a scan JSONL (any importer) meets it too."""
    path = tmp_path / "s.jsonl"
    lines = [{"casedb_scan": 1, "model": "h", "level": "torch", "phase": "prefill"},
             {"type": "case", "count": 1, "where": "m.py:1",
              "case": {"name": "cat", "op": "torch.cat", "inputs": [{"tensor_list": [{"shape": [1]}] * 10_001}]}},
             {"type": "case", "count": 1, "where": "m.py:2",
              "case": {"name": "neg", "op": "torch.neg", "inputs": [{"tensor": {"shape": [1] * 65}}]}}]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    res = cli("import", path)
    assert res.exit_code == 2
    assert "case 'cat': inputs[0]: tensor_list holds 10,001 tensors; a case takes at most 10,000 in one list" in \
        " ".join(res.output.split())
    del lines[1]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    res = cli("import", path)
    assert res.exit_code == 2
    assert "case 'neg': inputs[0]: shape has 65 dimensions; a tensor has at most 64" in " ".join(res.output.split())
    assert not db_path.exists() or rows(db_path, "SELECT count(*) AS n FROM cases") == [{"n": 0}]


FULL = {"name": "full", "op": "torch.full", "inputs": [{"value": [20000, 20000]}, {"value": 1.0}]}


@pytest.mark.parametrize("op, inputs, numel", [
    ("torch.full", FULL["inputs"], 4 * 10 ** 8),
    ("torch.ops.aten.full.default", FULL["inputs"], 4 * 10 ** 8),
    ("torch.zeros", [{"value": 20000}, {"value": 20000}], 4 * 10 ** 8),
    ("torch.arange", [{"value": 0}, {"value": 10 ** 9}], 10 ** 9),
    ("torch.Tensor.expand", [{"tensor": {"shape": [1], "dtype": "float32", "init": "randn"}},
                             {"value": [10 ** 5, 10 ** 5]}], 10 ** 10),
    ("torch.add", [{"tensor": {"shape": [4, 64], "dtype": "float32", "init": "randn"}}] * 2, 256),
    ("torch.nonzero", [{"tensor": {"shape": [4, 64], "dtype": "float32", "init": "randn"}}], None),  # values decide
])
def test_output_size_is_found_on_fake_tensors(op, inputs, numel):
    case = {"op": op, "inputs": inputs, "attrs": {}, "dtype": "float32", "signature": "0" * 64}
    assert materialize.output_numel(case, op_info(op).fn) == numel
    assert materialize.output_numel({**case, "attrs": {"device": "cpu"}}, op_info("torch.full").fn) in (None, numel)


def test_sizing_an_op_fake_tensors_refuse_logs_nothing():
    # torch logs a traceback at ERROR level when a meta kernel refuses (histc over int32):
    # sizing for --max-numel expects that and must not print it on every run
    x = {"tensor": {"shape": [64], "dtype": "int32", "init": "randint", "low": 0, "high": 9}}
    case = {"op": "torch.histc", "inputs": [x], "attrs": {}, "dtype": "int32", "signature": "0" * 64}
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addHandler(handler)
    try:
        assert materialize.output_numel(case, op_info("torch.histc").fn) is None
    finally:
        logger.removeHandler(handler)
    assert seen == []
    assert not logger.disabled  # given back as it was


@pytest.mark.slow
def test_max_numel_counts_what_a_factory_op_makes(cli, db_path, tmp_path):
    small = tmp_path / "small.db"
    for db, cases in ((small, [add_case("ok")]), (db_path, [add_case("ok"), FULL])):
        assert cli("import", manifest(tmp_path / "m.yaml", "m", cases), db=db).exit_code == 0
    run = ("run", *CPU_EAGER, "--max-numel", 10 ** 6)
    base = measure_apart(casedb(small, *run), timeout=600, cwd=tmp_path)
    r = measure_apart(casedb(db_path, *run), timeout=600, cwd=tmp_path)
    assert (base["rc"], r["rc"]) == (0, 0), (base, r)
    assert r["s"] - base["s"] <= 5 and r["rss_mib"] <= MIB, (base, r)
    ran = rows(db_path, "SELECT mc.name FROM judgements j JOIN model_cases mc ON mc.id = j.model_case_id")
    assert ran == [{"name": "ok"}]


@pytest.mark.parametrize("option, value, said", [
    ("--max-numel", "-5", "--max-numel must be at least 1, not -5"),
    ("--max-numel", "0", "--max-numel must be at least 1, not 0"),
    ("--timeout", "nan", "--timeout takes seconds from 0 (none) to 604800, not nan"),
    ("--timeout", "inf", "--timeout takes seconds from 0 (none) to 604800, not inf"),
    ("--timeout", "1e30", "--timeout takes seconds from 0 (none) to 604800, not 1e+30"),
    ("--jobs", "100000", "--jobs 100000 is more than"),
])
def test_odd_run_options_are_refused(cli, db_path, tmp_path, option, value, said):
    assert cli("import", manifest(tmp_path / "m.yaml", "m", [add_case("ok")])).exit_code == 0
    before = sha256_of(db_path)
    res = cli("run", "--device", "cpu", "--backend", "eager", "--no-progress", option, value)
    assert res.exit_code == 2 and said in " ".join(res.output.split()), res.output
    assert sha256_of(db_path) == before
