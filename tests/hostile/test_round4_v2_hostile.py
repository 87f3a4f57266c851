"""Hostile v2 model-ops configs (issue 41, the v2 parts of items 5, 7, 11 and 12).

5: text in a description never becomes a case's name or marks through an export and re-import;
7: a non-finite ``precision`` is refused; 11: ``model__`` tags x items is bounded (a 77 KB file
made 90,000 occurrences); 12: bad ``randint`` bounds are exit 2 with a message, not a traceback.
Each refusal is exit 2 naming the file and line, with the DB byte-identical.
"""

from __future__ import annotations

import json
import resource
import time

import pytest
import yaml

from tests.conftest import rows, sha256_of

pytestmark = pytest.mark.timeout(300)

ITEM = """\
                - name: torch.neg
                  sample_inputs_func:
                    args:
                      - tensor: {{shape: [2, 3], dtype: torch.float32{init}}}
                  tags: [{tags}]
"""


def config(items: str, *, model_tags: str = "model__evil", precision: str = "") -> str:
    return f"""\
test_suite_config:
  global:
    supported_dtypes:
      - name: float32{precision}
  files:
    - path: ${{TORCH_DEVICE_ROOT}}/tests/models/test_model_ops_v2.py
      tests:
        - names: [TestSpyreModelOps::test_model_ops_db]
          tags: [{model_tags}]
          edits:
            ops:
              include:
{items}"""


def item(tags: str = "torch.neg.1", init: str = "") -> str:
    return ITEM.format(tags=tags, init=init)


@pytest.fixture
def refused(cli, db_path, tmp_path):
    """`casedb import FILE` of a v2 text: exit 2, no traceback, the DB byte-identical; the message."""
    good = tmp_path / "good.yaml"
    good.write_text(config(item()).replace("model__evil", "model__good"))
    assert cli("import", good).exit_code == 0
    before = sha256_of(db_path)

    def run(text: str) -> str:
        path = tmp_path / "evil.yaml"
        path.write_text(text)
        r = cli("import", path)
        assert r.exit_code == 2, r.output
        assert "Traceback" not in r.output
        assert sha256_of(db_path) == before
        return " ".join(r.stderr.split())

    return run


# ------------------------------------------------------------------------------- item 5

V1_WITH_TAG_TEXT = """\
model: victim
cases:
  - name: neg_a
    op: torch.neg
    inputs:
      - tensor: {shape: [2, 3], dtype: float32}
    description: "ordinary text\\nv2 tags: skip model__other torch.neg.7"
"""


def test_description_text_never_becomes_name_or_marks_after_v2_export(cli, db_path, tmp_path):
    (tmp_path / "v.yaml").write_text(V1_WITH_TAG_TEXT)
    assert cli("import", tmp_path / "v.yaml").exit_code == 0
    out = tmp_path / "victim-v2.yaml"
    assert cli("export", "--model", "victim", "--format", "spyre-v2", "-o", out).exit_code == 0
    item_out = yaml.safe_load(out.read_text())["test_suite_config"]["files"][0]["tests"][0]["edits"]["ops"]["include"][0]
    assert "skip" not in item_out["tags"] and "model__other" not in item_out["tags"]
    assert "v2 tags: skip model__other torch.neg.7" in item_out["description"]
    fresh = tmp_path / "fresh.db"
    assert cli("import", out, db=fresh).exit_code == 0
    (row,) = rows(fresh, "SELECT name, marks, description FROM model_cases")
    assert "skip" not in json.loads(row["marks"] or "[]")
    assert row["name"] != "torch.neg.7"
    assert "v2 tags: skip model__other" in row["description"]


def test_a_v2_tag_that_is_no_mark_name_is_listed_never_written_into_the_description(cli, db_path, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(config(item(tags="torch.neg.1, odd-tag")))
    r = cli.json("import", path)
    (f,) = r["files"]
    assert any("odd-tag" in s["reason"] for s in f["skipped_reasons"])
    (row,) = rows(db_path, "SELECT description FROM model_cases")
    assert "odd-tag" not in (row["description"] or "")


# ------------------------------------------------------------------------------- item 7

@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_non_finite_precision_is_refused(refused, value):
    err = refused(config(item(), precision=f"\n        precision: {{atol: 0.01, rtol: {value}}}"))
    assert "evil.yaml:5" in err and "precision.rtol" in err and "finite" in err


# ------------------------------------------------------------------------------- item 11

def test_model_tags_times_items_is_bounded(refused, cli, db_path, tmp_path):
    tags = ", ".join(f"model__m{i}" for i in range(300))
    items = "".join(item(tags=f"torch.neg.{i}") for i in range(1, 301))
    text = config(items, model_tags=tags)
    assert len(text) < 100_000
    start, rss = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    err = refused(text)
    assert time.perf_counter() - start < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB: no 90,000 cases built
    assert "evil.yaml:8" in err and "300 model__<name> tags" in err
    few = tmp_path / "few.yaml"
    few.write_text(config(item(), model_tags="model__a, model__b"))  # a test shared by two models
    assert cli("import", few).exit_code == 0
    assert {"a", "b"} <= {r["model"] for r in rows(db_path, "SELECT model FROM model_cases")}


# ------------------------------------------------------------------------------- item 12

@pytest.mark.parametrize("dtype", ["torch.int64", "torch.float32"])
@pytest.mark.parametrize("bounds", ["{low: [1, 2], high: 5}", "{high: [5]}", "{high: .inf}", "{low: -.inf, high: 4}",
                                    "{high: abc}"])
def test_randint_bounds_that_are_no_integers_are_exit_2(refused, dtype, bounds):
    text = config(item(init=f", init: randint, init_args: {bounds}")).replace("torch.float32", dtype)
    err = refused(text)
    assert "evil.yaml:" in err and "randint" in err and "integer" in err
