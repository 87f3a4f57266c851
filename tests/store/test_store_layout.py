"""The store's one definition of an occurrence (the ``occurrences`` view), the seeding of a new
default DB by the front ends, and migration m111's own frozen tolerances."""

from __future__ import annotations

import json

from casedb.ingest.save import import_paths
from casedb.run.plan import build_plan
from casedb.store.database import Store
from tests.helpers import rows

MANIFEST = """\
model: tiny
default: {dtype: float32}
cases:
  - name: own_marks
    op: torch.add
    inputs: [{tensor: {shape: [2, 3, 4, 5]}}, {value: 2}]
    marks: [slow, constant, afirst]
  - name: derived_only
    op: torch.mul
    inputs: [{tensor: {shape: [3]}}, {tensor: {shape: [3]}}]
  - name: retired_later
    op: torch.sub
    inputs: [{tensor: {shape: [3]}}, {tensor: {shape: [3]}}]
"""


def _store(tmp_path) -> Store:
    manifest = tmp_path / "tiny.yaml"
    manifest.write_text(MANIFEST)
    store = Store(tmp_path / "c.db")
    import_paths(store, [manifest])
    return store


def test_the_occurrences_view_joins_cases_with_the_union_of_their_marks(tmp_path):
    store = _store(tmp_path)
    got = rows(store.path, "SELECT name, op, marks, own_marks, retired_at FROM occurrences ORDER BY position")
    # own marks [slow, constant, afirst] with the derived [constant, fp32operation, largedimtensor,
    # paddedtensor]: one sorted array, "constant" once
    assert [(r["name"], r["op"], json.loads(r["marks"]), r["retired_at"]) for r in got] == [
        ("own_marks", "torch.add",
         ["afirst", "constant", "fp32operation", "largedimtensor", "paddedtensor", "slow"], None),
        ("derived_only", "torch.mul", ["fp32operation", "paddedtensor"], None),
        ("retired_later", "torch.sub", ["fp32operation", "paddedtensor"], None),
    ]
    # the store's listings and the run plan read their marks from it
    assert [o["marks"] for o in store.occurrences(markexpr="")] == [json.loads(r["marks"]) for r in got]
    assert [it.marks for it in build_plan(store)] == [json.loads(r["marks"]) for r in got]
    assert store.mark_names() == {"afirst", "constant", "fp32operation", "largedimtensor", "paddedtensor", "slow",
                                  "model_tiny"}


def test_retired_occurrences_stay_in_the_view_and_out_of_listings_and_plans(tmp_path):
    store = _store(tmp_path)
    keep = tmp_path / "keep" / "tiny.yaml"
    keep.parent.mkdir()
    keep.write_text(MANIFEST.split("  - name: retired_later")[0])
    store.db.execute("INSERT INTO runs (status) VALUES ('finished')")  # none running: retiring deletes unjudged
    with store.db.atomic():
        judged = store.db.execute("SELECT id FROM model_cases WHERE name = 'retired_later'").fetchone()[0]
        store.db.execute("INSERT INTO judgements (run_id, model_case_id, signature, outcome) "
                         "SELECT max(id), ?, (SELECT signature FROM model_cases WHERE id = ?), 'passed' FROM runs",
                         [judged, judged])
    import_paths(store, [keep], replace=True)
    view = rows(store.path, "SELECT name, retired_at IS NOT NULL AS retired FROM occurrences ORDER BY position")
    assert [(r["name"], r["retired"]) for r in view] == [("own_marks", 0), ("derived_only", 0), ("retired_later", 1)]
    assert [o["name"] for o in store.occurrences(markexpr="")] == ["own_marks", "derived_only"]
    assert [it.occurrences[0].name for it in build_plan(store)] == ["own_marks", "derived_only"]
    assert [o["name"] for o in store.find("retired_later")] == ["retired_later"]  # found when nothing current is


def test_a_new_default_db_is_seeded_by_the_front_end_not_the_store(tmp_path, monkeypatch):
    from casedb.ingest.seed import open_seeded
    from casedb.store.database import DEFAULT_DB, open_store

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CASEDB_DB", raising=False)
    with open_store() as store:  # the store opens (and creates) the default DB, and imports nothing
        assert store.path == DEFAULT_DB and store.stats()["models"] == 0
    DEFAULT_DB.unlink()
    with open_seeded() as store:  # a front end fills a new one from the shipped manifests
        assert store.stats()["models"] > 0
        models = store.stats()["models"]
    with open_seeded() as store:  # ... once
        assert store.stats()["models"] == models
    other = tmp_path / "other.db"
    with open_seeded(other) as store:  # a DB the user names starts empty
        assert store.stats()["models"] == 0


def test_m111_keeps_the_dtype_tolerances_it_was_written_with(tmp_path, monkeypatch):
    """The migration's table is its own: a change to today's policy does not change what it
    strips from an old database."""
    import sqlite_utils

    from casedb.judge import numerics
    from casedb.store.migrations import migrations

    monkeypatch.setitem(numerics.DTYPE_DEFAULTS, "bfloat16", (0.5, 0.5))  # today's policy, changed
    db = sqlite_utils.Database(tmp_path / "old.db")
    names = [m.name for m in migrations._migrations]
    for m in migrations._migrations[:names.index("m111_own_tolerances")]:
        m.fn(db)
    db["models"].insert({"name": "m", "key": "m", "defaults": json.dumps({"dtype": "bfloat16"})})
    db["cases"].insert({"signature": "s", "op": "torch.add", "inputs": "[]", "attrs": "{}", "marks": "[]"})
    for name, rtol in (("stored_default", 1.6e-2), ("own", 0.5)):
        db["model_cases"].insert({"model": "m", "signature": "s", "name": name, "rtol": rtol, "atol": 1e-5})
    migrations._migrations[names.index("m111_own_tolerances")].fn(db)
    got = [(r["name"], r["rtol"], r["atol"]) for r in db.query("SELECT name, rtol, atol FROM model_cases ORDER BY id")]
    assert got == [("stored_default", None, None), ("own", 0.5, None)]
