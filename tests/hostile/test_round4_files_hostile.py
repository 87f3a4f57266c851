"""Hostile files, round four (issue 41 items 2, 3, 6, 11): a reference cache that cannot be followed
out of its folder nor forged, export and ``file:`` inputs that never write or read through a swapped
link, and size caps that count what a tensor will take in memory."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from casedb.run import refcache
from casedb.run.refcache import ReferenceCache
from tests.hostile.bounded import run_casedb, snapshot

CPU = ("--device", "cpu", "-j", "0", "--no-progress", "--judge", "tolerance")


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """Each test seals its cache with a key of its own (never the user's)."""
    monkeypatch.setenv("CASEDB_REFERENCE_CACHE_KEY", str(tmp_path / "key" / "refcache.key"))


def manifest(path: Path, model: str, cases: list[dict], **default) -> Path:
    path.write_text(yaml.safe_dump({"model": model, "default": {"dtype": "fp32", **default}, "cases": cases},
                                   sort_keys=False), encoding="utf-8")
    return path


def add(name: str, seed: int, rows: int = 4) -> dict:
    return {"name": name, "op": "torch.add", "seed": seed,
            "inputs": [{"tensor": {"shape": [rows, 64]}}, {"tensor": {"shape": [rows, 64]}}]}


def imported(cli, tmp_path, cases: list[dict], **default) -> None:
    res = cli("import", manifest(tmp_path / "m.yaml", "m", cases, rtol=1e-5, atol=1e-5, **default))
    assert res.exit_code == 0, res.output


def run(cli, *extra):
    res = cli("run", "--model", "m", "--backend", "eager", *CPU, "--json", *extra)
    return res.exit_code, (json.loads(res.stdout) if res.stdout.strip().startswith("{") else None), res


def tree(folder: Path) -> dict:
    """Every path under ``folder`` (links not followed): its kind and, for files, a hash."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = ("link", os.readlink(p)) if p.is_symlink() else (
            ("dir",) if p.is_dir() else ("file", hashlib.sha256(p.read_bytes()).hexdigest()))
    return out


def victim(tmp_path: Path) -> Path:
    """A project folder a link may point at: files named like cache entries, an empty folder."""
    project = tmp_path / "project"
    (project / "build").mkdir(parents=True)
    (project / "empty").mkdir()
    (project / "requirements.in").write_text("torch\n")
    (project / "build" / "Makefile.in").write_text("all:\n")
    (project / "build" / ("ab" * 32 + ".ref")).write_text("not an entry\n")
    return project


# ----------------------------------------------------------------- 2: links out of the cache

def test_a_linked_cache_folder_is_refused_by_info_clear_and_run_and_nothing_outside_changes(cli, db_path, tmp_path):
    imported(cli, tmp_path, [add("a", 1)])
    project = victim(tmp_path)
    before = tree(project)
    refcache.beside(db_path).symlink_to(project, target_is_directory=True)
    for command in (("cache", "clear", "--json"), ("cache", "info", "--json")):
        res = cli(*command)
        assert res.exit_code == 2, (command, res.output)
        said = " ".join(res.output.split())
        assert "is a symbolic link" in said and "rm" in said and "--no-reference-cache" in said
    code, _, res = run(cli)
    assert code == 2 and "is a symbolic link" in " ".join(res.output.split())
    assert tree(project) == before  # nothing deleted, nothing written through the link
    code, summary, _ = run(cli, "--no-reference-cache")
    assert code == 0 and summary["passed"] == 1


def test_a_linked_shard_is_refused_and_clear_deletes_only_what_the_cache_wrote(cli, db_path, tmp_path):
    imported(cli, tmp_path, [add("a", 1), add("b", 2)])
    project = victim(tmp_path)
    assert run(cli)[0] == 0
    folder = refcache.beside(db_path)
    (folder / "ab").symlink_to(project / "build", target_is_directory=True)  # a shard that is a link
    before = tree(project)
    for command in (("cache", "info"), ("cache", "clear")):
        res = cli(*command)
        assert res.exit_code == 2 and f"{folder / 'ab'} is a symbolic link" in " ".join(res.output.split())
    assert run(cli)[0] == 2
    assert tree(project) == before
    (folder / "ab").unlink()
    # what the cache never writes: a folder of its own, a file named like an entry in a shard's
    # place, an entry-named link to a file elsewhere, a note beside the entries
    (folder / "keep").mkdir()
    shard = next(p for p in folder.iterdir() if p.is_dir() and p.name != "keep")
    linked = shard / (shard.name + "0" * 62 + ".in")
    linked.symlink_to(project / "requirements.in")
    (shard / "notes.ref").write_text("mine\n")
    info = cli.json("cache", "info")
    assert info["entries"] == 2 and info["inputs"]["entries"] == 0  # the link is no entry
    gone = cli.json("cache", "clear")
    assert gone["deleted"] == 2
    assert tree(project) == before and (project / "requirements.in").read_text() == "torch\n"
    assert not os.path.lexists(linked) and (shard / "notes.ref").exists() and (folder / "keep").is_dir()


def test_a_run_never_reads_or_writes_through_an_entry_that_is_a_link(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    case = {"signature": "cd" * 32, "op": "torch.add", "seed": 1, "dtype": "float32", "attrs": {},
            "inputs": [{"tensor": {"shape": [4, 4], "dtype": "float32", "init": "randn"}}] * 2}
    from casedb.run.execute import run_case

    run_case(case, reference_cache=cache)
    (path, _, _), = cache.entries()
    outside = tmp_path / "outside.ref"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    assert cache.load(refcache.key(case, "reference")) is None and cache.corrupt == 1  # a link is no entry
    assert not os.path.lexists(path) and outside.exists()
    assert cache.store(refcache.key(case, "reference"), {"reference": {"output": torch.zeros(2)}, "mutated": []})
    assert not path.is_symlink() and path.is_file() and outside.read_bytes() != path.read_bytes()


# ----------------------------------------------------------------- 3: planted entries

def perturbed_entry(data: bytes) -> bytes:
    """What someone who can write the folder (but has not the key) makes of an entry: its tensors
    moved the way the faulty backend moves them, digested again every way they can."""
    saved = torch.load(io.BytesIO(data[32:]), weights_only=True)
    saved["tensors"] = [t + 0.01 * (1 + t.abs()) if t.is_floating_point() else t for t in saved["tensors"]]
    buf = io.BytesIO()
    torch.save(saved, buf)
    payload = buf.getvalue()
    return hashlib.sha256(payload).digest() + payload


def test_a_forged_reference_does_not_make_a_faulty_backend_pass(cli, db_path, tmp_path, data_dir):
    imported(cli, tmp_path, [add("a", 1), add("b", 2)])
    assert run(cli)[0] == 0
    entries = [p for p, _, _ in ReferenceCache(refcache.beside(db_path)).entries(".ref")]
    assert len(entries) == 2
    for p in entries:
        p.write_bytes(perturbed_entry(p.read_bytes()))
    faulty = ("run", "--model", "m", "--backend", "casedb_test_perturb", "--import", data_dir / "custom_ops.py",
              *CPU, "--json")
    res = cli(*faulty, "--no-reference-cache")
    assert res.exit_code == 1 and json.loads(res.stdout)["failed"] == 2
    res = cli(*faulty)
    assert res.exit_code == 1, res.stdout  # not exit 0: the forged references are refused
    summary = json.loads(res.stdout)
    assert summary["failed"] == 2 and summary["time"]["references_from_cache"] == 0


def test_swapped_entries_are_refused_not_false_failures(cli, db_path, tmp_path):
    imported(cli, tmp_path, [add("a", 1), add("b", 2)])
    assert run(cli)[0] == 0
    one, two = [p for p, _, _ in ReferenceCache(refcache.beside(db_path)).entries(".ref")]
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a)
    code, summary, res = run(cli)
    assert code == 0 and summary["passed"] == 2, res.stdout
    assert summary["time"]["references_from_cache"] == 0
    code, summary, _ = run(cli)  # computed again and stored under the right names
    assert code == 0 and summary["time"]["references_from_cache"] == 2


def test_forged_cached_inputs_are_refused(tmp_path):
    from casedb.cases.materialize import prepare
    from casedb.run import inputcache

    case = {"signature": "ef" * 32, "op": "torch.add", "seed": 5, "dtype": "float32", "attrs": {},
            "inputs": [{"tensor": {"shape": [1024, 1024], "dtype": "float32", "init": "randn"}},
                       {"tensor": {"shape": [1024, 1024], "dtype": "float32", "init": "randn"}}]}
    cache = ReferenceCache(tmp_path / "refs")
    assert cache.prepare_inputs(case) and cache.inputs_stored == 1
    (path, _, _), = cache.entries(inputcache.SUFFIX)
    saved = torch.load(path, weights_only=True)
    saved["tensors"] = [torch.zeros_like(t) for t in saved["tensors"]]  # inputs a faulty backend gets right
    saved["digest"] = hashlib.sha256(saved["meta"].encode()).hexdigest()
    h = hashlib.sha256(saved["meta"].encode())
    for t in saved["tensors"]:
        h.update(t.numpy().tobytes())
    saved["digest"] = h.hexdigest()  # the digest as anyone can compute it
    torch.save(saved, path)
    prepared, hit = cache.prepare_inputs(case)
    assert not hit and cache.corrupt == 1
    fresh = prepare(case)
    assert all(torch.equal(x.base, y.base) for x, y in zip(prepared.leaves, fresh.leaves))


def test_a_cache_folder_others_can_write_is_refused(cli, db_path, tmp_path):
    imported(cli, tmp_path, [add("a", 1)])
    assert run(cli)[0] == 0
    folder = refcache.beside(db_path)
    folder.chmod(0o777)
    before = tree(folder)
    code, _, res = run(cli)
    said = " ".join(res.output.split())
    assert code == 2 and "writable by group or others" in said and "chmod go-w" in said, said
    assert tree(folder) == before
    folder.chmod(0o700)
    assert run(cli)[1]["time"]["references_from_cache"] == 1


def test_a_planted_huge_entry_costs_no_memory(cli, db_path, tmp_path):
    # inputs worth caching (2 M drawn elements): a reference and an inputs entry
    case = {"name": "big", "op": "torch.add", "seed": 7,
            "inputs": [{"tensor": {"shape": [1024, 1024]}}, {"tensor": {"shape": [1024, 1024]}}]}
    imported(cli, tmp_path, [case])
    assert run(cli)[0] == 0
    cache = ReferenceCache(refcache.beside(db_path))
    entries = [p for p, _, _ in cache.entries()]
    assert sorted(p.suffix for p in entries) == [".in", ".ref"]
    for p in entries:  # 1.5 GiB each, sparse: under the cache's cap, far over what the case needs
        with open(p, "r+b") as f:
            f.truncate(3 << 29)
    cost = run_casedb(db_path, "run", "--model", "m", "--backend", "eager", *CPU, "--json", timeout=300)
    assert cost.rc == 0, cost.stderr[-2000:]
    summary = json.loads(cost.stdout)
    assert summary["passed"] == 1 and summary["time"]["references_from_cache"] == 0
    assert cost.rss_mib < 1000, cost  # the old code read the planted 1.5 GiB into memory
    assert cost.cpu_s < 60, cost
    assert all(p.stat().st_size < 64 << 20 for p, _, _ in cache.entries())  # replaced by real ones
