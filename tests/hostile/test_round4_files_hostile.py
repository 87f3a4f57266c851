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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ----------------------------------------------------------------- 6: export and file: inputs

def file_case(tmp_path: Path, tensor) -> None:
    """A manifest beside ``tensor`` saved as x.pt, one case reading it."""
    torch.save(tensor, tmp_path / "x.pt")
    manifest(tmp_path / "m.yaml", "m", [{"name": "f", "op": "torch.neg", "inputs": [{"file": "x.pt"}]}])


def exported_name(tensor) -> str:
    """The name export gives the .pt file of ``tensor``."""
    from casedb.cases import blobs

    return hashlib.sha256(blobs.encode(tensor)).hexdigest()[:12] + ".pt"


def test_export_never_writes_through_a_link_planted_in_its_files_folder(cli, tmp_path):
    file_case(tmp_path, torch.arange(6.0).reshape(2, 3))
    name = exported_name(torch.arange(6.0).reshape(2, 3))
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    out = tmp_path / "out" / "e.yaml"
    files = out.parent / "e.files"
    files.mkdir(parents=True)
    victim_file = tmp_path / "victim.pt"
    (files / name).symlink_to(victim_file)  # dangling: a plain open would create victim.pt
    res = cli("export", "--model", "m", "-o", out)
    assert res.exit_code == 0, res.output
    assert not os.path.lexists(victim_file)
    assert not (files / name).is_symlink() and torch.equal(torch.load(files / name), torch.arange(6.0).reshape(2, 3))
    assert [p.name for p in files.iterdir()] == [name]  # no temporary file left


@pytest.mark.parametrize("planted", ["a link to a folder", "a file"])
def test_export_refuses_a_files_folder_that_is_a_link_or_a_file(cli, tmp_path, planted):
    file_case(tmp_path, torch.arange(6.0).reshape(2, 3))
    name = exported_name(torch.arange(6.0).reshape(2, 3))
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    out = tmp_path / "out" / "e.yaml"
    out.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    files = out.parent / "e.files"
    if planted == "a file":
        files.write_text("mine\n")
    else:
        files.symlink_to(elsewhere, target_is_directory=True)
    res = cli("export", "--model", "m", "-o", out)
    said = " ".join(res.output.split())
    kind = "is not a folder" if planted == "a file" else "is a symbolic link"
    assert res.exit_code == 2 and f"{files} {kind}" in said and "move it away" in said, said
    assert list(elsewhere.iterdir()) == [] and not out.exists()
    assert planted != "a file" or files.read_text() == "mine\n"
    assert not (elsewhere / name).exists()


def test_a_file_input_swapped_after_its_check_is_not_read(cli, db_path, tmp_path, monkeypatch):
    """The link is swapped to a file outside the folder right after the name was resolved (as a
    racing process would, 0.1 % of the time): what is read must still be the file inside."""
    inside, secret = torch.arange(6.0), torch.full((6,), 42.0)
    folder = tmp_path / "manifests"
    folder.mkdir()
    torch.save(inside, folder / "real.pt")
    torch.save(secret, tmp_path / "secret.pt")
    link = folder / "x.pt"
    link.symlink_to(folder / "real.pt")
    manifest(folder / "m.yaml", "m", [{"name": "f", "op": "torch.neg", "inputs": [{"file": "x.pt"}]}])
    real_resolve = Path.resolve

    def resolve_then_swap(self, *args, **kwargs):
        out = real_resolve(self, *args, **kwargs)
        if self == link and os.readlink(link) != str(tmp_path / "secret.pt"):  # once, right after the check
            link.unlink()
            link.symlink_to(tmp_path / "secret.pt")
        return out

    monkeypatch.setattr(Path, "resolve", resolve_then_swap)
    res = cli("import", folder / "m.yaml")
    monkeypatch.undo()
    from tests.conftest import rows

    stored = rows(db_path, "SELECT data FROM blobs") if db_path.exists() else []
    assert all(torch.frombuffer(bytearray(r["data"]), dtype=torch.float32).tolist() != secret.tolist() for r in stored)
    assert res.exit_code == 2 and "is outside the manifest's folder" in " ".join(res.output.split()), res.output


# ----------------------------------------------------------------- 11: size caps that count memory

@pytest.mark.slow
def test_max_numel_counts_the_storage_a_stride_spans(cli, db_path, tmp_path):
    wide = {"name": "wide", "op": "torch.neg", "inputs": [{"tensor": {
        "shape": [2], "preset": "strided", "preset_args": {"stride": [100_000_000]}}}]}  # 400 MB of storage
    imported(cli, tmp_path, [wide, add("small", 1)])
    cost = run_casedb(db_path, "run", "--model", "m", "--backend", "eager", *CPU, "--json", "--max-numel", "1000",
                      timeout=300)
    assert cost.rc == 0, cost.stderr[-2000:]
    summary = json.loads(cost.stdout)
    assert summary["executed"] == 1 and summary["passed"] == 1  # only the small case: 2 x 64 x 4 elements
    assert cost.rss_mib < 700, cost  # the strided one would take 400 MB, twice
    assert cost.cpu_s < 60, cost


@pytest.mark.slow
def test_a_pt_holding_an_expanded_view_is_refused_before_it_is_made(cli, db_path, tmp_path):
    from tests.hostile.bounded import refused_within_bounds

    imported(cli, tmp_path, [add("a", 1)])
    before = hashlib.sha256(db_path.read_bytes()).hexdigest()
    folder = tmp_path / "bomb"
    folder.mkdir()
    file_case(folder, torch.zeros(1).expand(100_000_000))  # 400 MB of values from a file of ~1.5 KB
    assert (folder / "x.pt").stat().st_size < 4096
    cost = run_casedb(db_path, "import", folder / "m.yaml", timeout=300)
    refused_within_bounds(cost, "x.pt' holds a tensor of 381.5 MiB once made contiguous", "refused as a tensor bomb",
                          "save tensor.contiguous()")
    assert hashlib.sha256(db_path.read_bytes()).hexdigest() == before
    contiguous = folder / "x.pt"
    torch.save(torch.arange(100_000.0).expand(3, -1), contiguous)  # 1.2 MB from 400 KB: no bomb
    assert cli("import", folder / "m.yaml").exit_code == 0


@pytest.mark.parametrize("planted", ["readable by others", "a link"])
def test_a_key_someone_else_may_know_is_refused(cli, db_path, tmp_path, planted):
    imported(cli, tmp_path, [add("a", 1)])
    assert run(cli)[0] == 0
    key = Path(os.environ["CASEDB_REFERENCE_CACHE_KEY"])
    if planted == "a link":
        (tmp_path / "known.key").write_bytes(key.read_bytes())
        key.unlink()
        key.symlink_to(tmp_path / "known.key")
    else:
        key.chmod(0o644)
    folder = refcache.beside(db_path)
    before = tree(folder)
    code, _, res = run(cli)
    said = " ".join(res.output.split())
    why = "is a symbolic link" if planted == "a link" else "is open to group or others"
    assert code == 2 and f"reference cache key {key} {why}" in said and "--no-reference-cache" in said, said
    assert tree(folder) == before
