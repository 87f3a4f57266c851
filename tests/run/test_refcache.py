"""The reference cache (casedb.run.refcache): a cached reference is the fresh one, bit for bit;
another torch, CPU capability or thread count misses; the cap holds; a bad file is a miss."""

from __future__ import annotations

import json
import os
import pickle
import hashlib

import pytest
import torch

from casedb.judge.compare import compare
from casedb.run import refcache
from casedb.run.execute import run_case
from casedb.run.refcache import ReferenceCache

SIG = "cd" * 32


def T(shape, dtype="float32", init="randn", **kw):
    return {"tensor": {"shape": shape, "dtype": dtype, "init": init, **kw}}


def case(op, *inputs, attrs=None, dtype="float32", seed=3):
    return {"signature": SIG, "op": op, "inputs": list(inputs), "attrs": attrs or {}, "dtype": dtype, "seed": seed}


CASES = {
    "matmul (accumulating: magnitudes too)": case("torch.matmul", T([16, 64]), T([64, 8])),
    "bf16 add": case("torch.add", T([8, 32], "bfloat16"), T([8, 32], "bfloat16"), dtype="bfloat16"),
    "max over a dim (torch.return_types)": case("torch.max", T([6, 5]), attrs={"dim": 1}),
    "in place (a written argument)": case("torch.Tensor.add_", T([4, 9]), T([4, 9])),
    "split (views, a tuple)": case("torch.split", T([10, 3]), {"value": 4}),
    "transpose (strides)": case("torch.Tensor.transpose", T([3, 5]), {"value": 0}, {"value": 1}),
}


def same_bits(a, b) -> bool:
    """Equal structure, types, dtypes, shapes, strides and bits."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and compare(a, b, mode="bits").passed)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_bits(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", list(CASES))
def test_a_cached_reference_is_the_fresh_one_bit_for_bit(tmp_path, name):
    c = CASES[name]
    cache = ReferenceCache(tmp_path / "refs")
    fresh = run_case(c, high_precision=True, reference_cache=False)
    first = run_case(c, high_precision=True, reference_cache=cache)
    assert "reference_cache" not in first.notes and cache.stored == 2  # the reference and the upcast one
    again = run_case(c, high_precision=True, reference_cache=cache)
    assert again.notes["reference_cache"] == "hit" and cache.hits == 2
    for part in ("reference", "reference_hi", "reference_mag"):
        assert same_bits(getattr(fresh, part), getattr(again, part)), part
    assert again.mutated == fresh.mutated
    assert same_bits(again.target, fresh.target)


def test_a_written_argument_still_reaches_the_target_untouched(tmp_path):
    c = CASES["in place (a written argument)"]
    cache = ReferenceCache(tmp_path / "refs")
    run_case(c, reference_cache=cache)
    ex = run_case(c, reference_cache=cache)
    assert ex.notes["reference_cache"] == "hit" and ex.mutated == ["args[0]"]
    assert compare(ex.reference, ex.target, mode="bits").passed  # not a + b + b


@pytest.mark.parametrize("change", ["torch version", "cpu capability", "threads", "case seed", "reference dtype"])
def test_what_decides_the_bits_is_in_the_key(tmp_path, monkeypatch, change):
    c = CASES["matmul (accumulating: magnitudes too)"]
    cache = ReferenceCache(tmp_path / "refs")
    run_case(c, reference_cache=cache, reference_dtype="float64")
    assert run_case(c, reference_cache=cache, reference_dtype="float64").notes.get("reference_cache") == "hit"
    dtype = "float32" if change == "reference dtype" else "float64"
    c = dict(c, seed=4) if change == "case seed" else c
    change_environment(monkeypatch, change)
    hits = cache.hits
    ex = run_case(c, reference_cache=cache, reference_dtype=dtype)
    assert ("reference_cache" in ex.notes) == (change == "reference dtype")
    assert cache.hits == hits + (1 if change == "reference dtype" else 0)  # the reference is, the upcast one misses
    assert cache.stored == 2 + (1 if change == "reference dtype" else 2)


def change_environment(monkeypatch, change: str) -> None:
    """Another torch version, CPU capability or thread count, as ``change`` says (else nothing)."""
    if change == "torch version":
        monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    elif change == "cpu capability":
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "SOME_OTHER_ISA")
    elif change == "threads":
        monkeypatch.setattr(torch, "get_num_threads", lambda: 977)


def test_random_outputs_are_never_cached(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    for _ in range(2):
        ex = run_case(case("torch.rand_like", T([4, 4])), reference_cache=cache)
        assert ex.compare_mode == "metadata" and "reference_cache" not in ex.notes
    assert cache.stored == 0 and cache.entries() == []


def test_eviction_keeps_the_cap_and_the_recently_used(tmp_path):
    value = {"reference": {"output": torch.zeros(1000)}, "mutated": []}
    one = len(refcache.dumps(value))
    cache = ReferenceCache(tmp_path / "refs", max_bytes=3 * one)
    for i in range(3):
        assert cache.store(f"{i:064x}", value)
    paths = {p.stem: p for p, _, _ in cache.entries()}
    for i, stamp in enumerate((100, 200, 300)):  # oldest first: 0, 1, 2
        os.utime(paths[f"{i:064x}"], (stamp, stamp))
    assert cache.load(f"{0:064x}") is not None  # used now: the newest
    assert cache.store(f"{3:064x}", value)
    kept = sorted(p.stem for p, _, _ in cache.entries())
    assert kept == [f"{i:064x}" for i in (0, 2, 3)]  # 1 was the least recently used
    assert sum(size for _, size, _ in cache.entries()) <= cache.max_bytes
    assert not cache.store(f"{4:064x}", {"reference": {"output": torch.zeros(10**5)}, "mutated": []})  # over the cap


def test_a_corrupt_entry_is_a_miss_and_is_deleted(tmp_path):
    c = CASES["bf16 add"]
    cache = ReferenceCache(tmp_path / "refs")
    fresh = run_case(c, reference_cache=cache)
    (path, _, _), = cache.entries()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    ex = run_case(c, reference_cache=cache)
    assert "reference_cache" not in ex.notes and cache.corrupt == 1
    assert same_bits(ex.reference, fresh.reference)
    assert len(cache.entries()) == 1 and cache.load(refcache.key(c, "reference")) is not None  # stored anew


class Shell:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_pickle_with_a_valid_digest_is_refused_not_run(tmp_path):
    payload = pickle.dumps({"meta": json.dumps({"v": None}), "tensors": [], "x": Shell()}, protocol=2)
    cache = ReferenceCache(tmp_path / "refs")
    name = "ab" * 32
    path = cache._path(name)
    path.parent.mkdir(parents=True)
    path.write_bytes(hashlib.sha256(payload).digest() + payload)
    assert cache.load(name) is None and not path.exists() and cache.corrupt == 1


def test_a_bad_cap_is_a_clear_error(monkeypatch):
    from casedb.errors import CasedbError

    assert refcache.parse_bytes("500M") == 500 * 2**20 and refcache.parse_bytes(None) == refcache.DEFAULT_MAX_BYTES
    with pytest.raises(CasedbError, match="CASEDB_REFERENCE_CACHE_BYTES.*2G"):
        refcache.parse_bytes("lots")


MANIFEST = """\
model: cached
cases:
  - name: mm
    op: torch.matmul
    inputs: [{tensor: {shape: [8, 32], dtype: float32}}, {tensor: {shape: [32, 4], dtype: float32}}]
  - name: silu
    op: torch.nn.functional.silu
    inputs: [{tensor: {shape: [4, 33], dtype: bfloat16}}]
  - name: noise
    op: torch.rand_like
    inputs: [{tensor: {shape: [4, 4], dtype: float32}}]
"""


@pytest.mark.slow
def test_a_rerun_takes_its_references_from_the_cache_and_says_so(cli, db_path, tmp_path):
    (tmp_path / "m.yaml").write_text(MANIFEST)
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    run = ("run", "--model", "cached", "--backend", "eager", "--device", "cpu", "-m", "", "-j", "0", "--json")
    first = json.loads(cli(*run).stdout)
    assert first["time"]["references_from_cache"] == 0 and first["passed"] == 3
    info = json.loads(cli("cache", "info", "--json").stdout)
    assert info["folder"] == str(refcache.beside(db_path.resolve())) and info["entries"] == 2  # not the random one
    second = json.loads(cli(*run).stdout)
    assert second["time"]["references_from_cache"] == 2 and second["passed"] == 3
    off = json.loads(cli(*run, "--no-reference-cache").stdout)
    assert off["time"]["references_from_cache"] == 0 and off["passed"] == 3
    text = " ".join(cli(*run[:-1]).stdout.split())
    assert "2 references from the cache" in text
    assert json.loads(cli("cache", "clear", "--json").stdout)["deleted"] == 2
    assert json.loads(cli("cache", "info", "--json").stdout)["entries"] == 0
