"""`casedb merge` of databases from elsewhere (issue 24, items 2 and 6).

A source is verified whole before anything is written: every case's signature is computed again
from its stored content, every blob's sha256 from its bytes, its schema is casedb's, its rows
refer to rows, its JSON and timestamps are what casedb writes. A refused source exits 2 within
5 s and 1 GB, and the target stays byte-identical. A forged ``merged_from`` or run uid cannot make
a later real shard be skipped, and a malformed one cannot make later merges fail.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests import runs_data
from tests.helpers import rows, write_sql
from tests.hostile.bounded import REFUSED_RSS_MIB, refused_within_bounds, run_casedb, snapshot

pytestmark = pytest.mark.timeout(600)

TOY = """\
model: toy
default: {dtype: fp32}
cases:
  - name: add_a
    op: torch.add
    inputs:
      - tensor: {shape: [4]}
      - tensor: {shape: [4]}
  - name: mul_b
    op: torch.mul
    inputs:
      - tensor: {shape: [4, 8]}
      - tensor: {shape: [4, 8]}
  - name: relu_c
    op: torch.relu
    inputs:
      - tensor: {shape: [3], init: data, data: [1.0, -2.0, 3.0]}
  - name: neg_d
    op: torch.neg
    inputs:
      - tensor: {shape: [2, 64]}
"""
OUTCOMES = {("toy", "add_a"): ("passed", 1e-6), ("toy", "mul_b"): ("failed", 0.5),
            ("toy", "relu_c"): ("passed", 0.0), ("toy", "neg_d"): ("passed", 0.0)}
SHARD_UID = "0123456789abcdef0123456789abcdef"


def sig_of(db: Path, name: str) -> str:
    return rows(db, "SELECT signature FROM model_cases WHERE name = ?", [name])[0]["signature"]


@pytest.fixture
def manifest(tmp_path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(TOY, encoding="utf-8")
    return path


@pytest.fixture
def shard(cli, tmp_path, manifest) -> Path:
    """A real shard: the toy model's cases and one recorded run with a uid."""
    db = tmp_path / "shard.db"
    assert cli("import", manifest, db=db).exit_code == 0
    run_id = runs_data.record_run(db, OUTCOMES)
    write_sql(db, f"UPDATE runs SET uid = '{SHARD_UID}' WHERE id = {run_id}")
    return db


@pytest.fixture
def target(cli, tmp_path) -> Path:
    """A target with cases of its own, alone in its folder (so every file beside it is compared)."""
    folder = tmp_path / "target"
    folder.mkdir()
    db = folder / "target.db"
    runs_data.import_manifests(lambda *a: cli(*a, db=db), tmp_path)
    return db


def forged(shard: Path, tmp_path: Path, *statements: str, name: str = "forged.db") -> Path:
    path = tmp_path / name
    shutil.copy(shard, path)
    write_sql(path, *statements)
    return path


# ---------------------------------------------------------------------------------- item 2

def test_a_case_with_other_content_under_a_real_signature_is_refused(cli, shard, target, tmp_path, manifest):
    add = sig_of(shard, "add_a")
    genuine = rows(shard, "SELECT op, inputs, attrs FROM cases WHERE signature = ?", [add])[0]
    zeros = json.dumps([{"tensor": {"dtype": "float32", "init": "zeros", "shape": [4]}}] * 2)
    src = forged(shard, tmp_path, f"UPDATE cases SET op = 'torch.sub', inputs = '{zeros}' WHERE signature = '{add}'")
    before = snapshot(target.parent)
    res = cli("merge", src, "--into", target)
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert f"case '{add}': its signature is not the sha256 of its op, inputs, attrs and seed" in said
    assert "Nothing was merged" in said
    assert snapshot(target.parent) == before
    # the genuine manifest stores the genuine case
    report = cli.json("import", manifest, db=target)
    assert (report["files"][0]["new_cases"], report["files"][0]["duplicates"]) == (4, 0)
    assert rows(target, "SELECT op, inputs, attrs FROM cases WHERE signature = ?", [add]) == [genuine]


def test_a_blob_whose_bytes_are_not_its_key_is_refused(cli, shard, target, tmp_path):
    src = forged(shard, tmp_path, "UPDATE blobs SET data = zeroblob(12)")
    key = rows(shard, "SELECT sha256 FROM blobs")[0]["sha256"]
    before = snapshot(target.parent)
    res = cli("merge", src, "--into", target)
    assert res.exit_code == 2, res.output
    assert f"blob '{key}': the sha256 of its bytes is another" in " ".join(res.stderr.split())
    assert snapshot(target.parent) == before


def test_what_a_case_row_derives_is_derived_again_not_copied(cli, shard, tmp_path):
    add = sig_of(shard, "add_a")
    cols = "signature, op, inputs, attrs, dtype, seed, marks, shapes"
    genuine = rows(shard, f"SELECT {cols} FROM cases ORDER BY signature")
    src = forged(shard, tmp_path, "UPDATE cases SET marks = '[\"largedimtensor\"]', shapes = 'i8[1]', dtype = 'int8'"
                                  f" WHERE signature = '{add}'")
    into = tmp_path / "fresh.db"
    res = cli("merge", src, "--into", into)
    assert res.exit_code == 0, res.output
    assert rows(into, f"SELECT {cols} FROM cases ORDER BY signature") == genuine


def test_a_genuine_shard_with_a_data_blob_merges_whole(cli, shard, tmp_path):
    into = tmp_path / "fresh.db"
    report = cli.json("merge", shard, "--into", into)
    assert (report["runs"], report["results"], report["judgements"]) == (1, 4, 4)
    assert rows(into, "SELECT sha256, data, size FROM blobs") == rows(shard, "SELECT sha256, data, size FROM blobs")
    again = cli.json("merge", shard, "--into", into)
    assert (again["runs"], again["sources"][0]["runs_already_merged"]) == (0, 1)


# ---------------------------------------------------------------------------------- item 6

def _recursive_view(table: str, cols: str, first: str) -> list[str]:
    # each row a fresh megabyte: reading it never ends
    return [f"DROP TABLE {table}",
            f"CREATE VIEW {table} AS WITH RECURSIVE r({cols}) AS (SELECT {first} UNION ALL SELECT {first} FROM r)"
            " SELECT * FROM r"]


HOSTILE_SOURCES = {
    # name: (statements on a copy of the shard, or a builder; what the refusal says)
    "blobs a recursive view": (_recursive_view("blobs", "sha256, data, size", "hex(randomblob(32)), zeroblob(1000000), 1"),
                               "'blobs' is a view on 'blobs', casedb's is a table"),
    "runs a recursive view": (_recursive_view("runs", "id, uid, started_at",
                                              "1, hex(randomblob(16)), '2025-01-01T00:00:00+00:00'"),
                              "'runs' is a view on 'runs', casedb's is a table"),
    "a trigger of its own": (["CREATE TRIGGER t AFTER INSERT ON results BEGIN DELETE FROM results; END"],
                             "trigger 't' on 'results' is not casedb's"),
    # (the occurrences view reads cases.inputs: SQLite drops the column only without it)
    "a reduced schema (cases without inputs)": (["DROP VIEW occurrences", "ALTER TABLE cases DROP COLUMN inputs"],
                                                "table 'cases' is not defined as casedb defines it"),
    "bad JSON in a selection": (["UPDATE runs SET selection = '{\"options\": '"],
                                "rows that are not what casedb writes (its selection as a JSON object"),
    "a merged_from that is no list of runs": (["UPDATE runs SET selection = '{\"merged_from\": [\"x\", 1]}'"],
                                              "merged_from is not a list of runs"),
    "a bad timestamp": (["UPDATE runs SET started_at = 'yesterday'"],
                        "started_at 'yesterday' is not an ISO 8601 time with a zone"),
    "a timestamp without a zone": (["UPDATE runs SET finished_at = '2025-01-01T00:00:00'"],
                                   "finished_at '2025-01-01T00:00:00' is not an ISO 8601 time with a zone"),
    "orphan rows": (["INSERT INTO judgements (run_id, model, signature, outcome) VALUES (7, 'nobody', 'x', 'passed')"],
                    "rows that refer to nothing: judgements row"),
    "a case stored with NULL inputs": (["UPDATE cases SET inputs = NULL"],
                                       "cases whose stored content is not what their signature says"),
    "not a database": (lambda path: path.write_bytes(os.urandom(180_000)), "is not an SQLite database casedb can read"),
    "a text file": (lambda path: path.write_text("model: toy\ncases: []\n" * 1000), "is not an SQLite database"),
    "an empty file": (lambda path: path.write_bytes(b""), "is empty: not a casedb database"),
    "a foreign SQLite file": (lambda path: write_sql(path, "CREATE TABLE notes (x)", "INSERT INTO notes VALUES (1)"),
                              "is an SQLite database but not casedb's (it has notes"),
}


@pytest.mark.parametrize("name", list(HOSTILE_SOURCES))
def test_a_hostile_source_is_refused_quickly_and_leaves_the_target_as_it_was(name, shard, target, tmp_path):
    change, said = HOSTILE_SOURCES[name]
    if callable(change):
        src = tmp_path / "hostile.db"
        change(src)
    else:
        src = forged(shard, tmp_path, *change, name="hostile.db")
    before = snapshot(target.parent)
    cost = run_casedb(target, "merge", src, timeout=60)
    refused_within_bounds(cost, said)
    assert snapshot(target.parent) == before


def test_a_hard_link_of_the_target_is_refused(target, tmp_path):
    link = tmp_path / "link.db"
    os.link(target, link)
    before = snapshot(target.parent)
    refused_within_bounds(run_casedb(target, "merge", link, timeout=60), f"{link} is the target database itself")
    assert snapshot(target.parent) == before


@pytest.mark.parametrize("claim", ["merged_from", "uid"])
def test_a_forged_claim_does_not_make_the_real_shard_be_skipped(claim, shard, tmp_path):
    """A source whose empty run claims the real shard's uid (as a combined run's part, or as its
    own uid) is merged first; the real shard is merged after it, whole."""
    selection = json.dumps({"merged_from": [{"uid": SHARD_UID}]}) if claim == "merged_from" else "{}"
    uid = "forged" if claim == "merged_from" else SHARD_UID
    fake = forged(shard, tmp_path, "DELETE FROM judgements", "DELETE FROM results",
                  f"UPDATE runs SET uid = '{uid}', selection = '{selection}'")
    baseline = run_casedb(tmp_path / "baseline.db", "merge", shard, "--json", timeout=120)
    assert baseline.rc == 0, baseline.stderr
    folder = tmp_path / "merged"
    folder.mkdir()
    into = folder / "into.db"
    first = run_casedb(into, "merge", fake, "--json", timeout=120)
    assert first.rc == 0, first.stderr
    real = run_casedb(into, "merge", shard, "--json", timeout=120)
    assert real.rc == 0, real.stderr
    report = json.loads(real.stdout)
    assert (report["runs"], report["results"], report["judgements"]) == (1, 4, 4)
    copied = rows(into, "SELECT id, selection FROM runs ORDER BY id")[-1]
    assert rows(into, "SELECT count(*) AS n FROM results WHERE run_id = ?", [copied["id"]]) == [{"n": 4}]
    if claim == "uid":  # a new identity that keeps the one it came with
        assert [p["uid"] for p in json.loads(copied["selection"])["merged_from"]] == [SHARD_UID]
    # and once it is there, it is there: merging it again copies nothing
    again = run_casedb(into, "merge", shard, "--json", timeout=120)
    assert json.loads(again.stdout)["sources"][0]["runs_already_merged"] == 1
    for cost in (first, real, again):  # what a merge of the real shard alone costs, give or take 5 s
        assert cost.rss_mib <= REFUSED_RSS_MIB and cost.cpu_s <= baseline.cpu_s + 5, (cost, baseline)
    assert sum(p.stat().st_size for p in folder.iterdir()) < 4 * shard.stat().st_size


def test_a_malformed_merged_from_in_the_target_does_not_fail_later_merges(cli, shard, target):
    # what a merge of a forged file before casedb checked its sources left in the target
    write_sql(target, "INSERT INTO runs (uid, started_at, status, selection) VALUES "
                "('old', '2025-01-01T00:00:00+00:00', 'finished', '{\"merged_from\": [\"x\", 1, {\"uid\": 5}]}')")
    cost = run_casedb(target, "merge", shard, "--json", timeout=120)
    assert cost.rc == 0, cost.stderr
    assert json.loads(cost.stdout)["runs"] == 1
    assert cost.rss_mib <= REFUSED_RSS_MIB
