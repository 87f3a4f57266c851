"""Cached inputs (casedb.run.inputcache, kept by casedb.run.refcache): loaded inputs are the fresh
ones bit for bit, layout and storage sharing included; what decides their bits is in the key (and
only that); a bad file is a miss; eviction counts them; a run judges the same with and without."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
import torch

from casedb.cases.materialize import Prepared, TensorLeaf, prepare, result_leaves
from casedb.judge.compare import compare
from casedb.run import inputcache, refcache
from casedb.run.execute import run_case
from casedb.run.refcache import ReferenceCache
from tests.run.test_refcache import change_environment

SIG = "ef" * 32


@pytest.fixture(autouse=True)
def every_case_qualifies(monkeypatch):
    """Small cases, cached as if they were expensive to build."""
    monkeypatch.setattr(inputcache, "MIN_NUMEL", 1)


def T(shape, dtype="float32", init=None, **kw):
    return {"tensor": {"shape": shape, "dtype": dtype, **({"init": init} if init else {}), **kw}}


def case(op, *inputs, attrs=None, dtype="float32", seed=3):
    return {"signature": SIG, "op": op, "inputs": list(inputs), "attrs": attrs or {}, "dtype": dtype, "seed": seed}


CASES = {
    "strided preset (a view into a larger storage)": case(
        "torch.add", T([2, 3, 4], preset="strided", preset_args={"stride": [20, 1, 3], "storage_offset": 5}),
        T([2, 3, 4], "float32", "arange")),
    "int index (embedding, bf16 weight)": case(
        "torch.nn.functional.embedding", T([3, 5], "int64", "randint", init_args={"low": 0, "high": 50}),
        T([50, 16], "bfloat16"), dtype="bfloat16"),
    "writes into its input, noncontiguous": case(
        "torch.Tensor.add_", T([4, 9], preset="noncontig_slice", preset_args={"dim": 0, "step": 3}), T([4, 9])),
    "extremal variant (specials sprinkled) and a tensor list": case(
        "torch.cat", {"tensor_list": [{"shape": [3, 4], "dtype": "float16", "_specials": True},
                                      {"shape": [2, 4], "dtype": "float16", "init": "uniform"}]}, dtype="float16"),
}


def layout(t: torch.Tensor) -> tuple:
    return t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


def tensors(x) -> list:
    return [t for t in result_leaves(x) if isinstance(t, torch.Tensor)]


def sharing(ts: list) -> list:
    """Which tensors share a storage: for each, the index of the first with its storage."""
    ptrs = [t.untyped_storage().data_ptr() for t in ts]
    return [ptrs.index(p) for p in ptrs]


def assert_same_inputs(a: Prepared, b: Prepared) -> None:
    """Same leaves (bits, layout, source) and the same placed arguments (layout after presets)."""
    assert len(a.leaves) == len(b.leaves)
    for x, y in zip(a.leaves, b.leaves):
        assert layout(x.base) == layout(y.base) and compare(x.base, y.base, mode="bits").passed
        assert x.source == y.source and x.preset == y.preset and x.preset_args == y.preset_args
    pa, pb = tensors(a.place("cpu")), tensors(b.place("cpu"))
    assert [layout(t) for t in pa] == [layout(t) for t in pb]
    assert all(compare(x, y, mode="bits").passed for x, y in zip(pa, pb))
    assert sharing([leaf.base for leaf in a.leaves]) == sharing([leaf.base for leaf in b.leaves])


@pytest.mark.parametrize("name", list(CASES))
def test_cached_inputs_are_the_fresh_ones_bit_for_bit(tmp_path, name):
    c = CASES[name]
    cache = ReferenceCache(tmp_path / "refs")
    first, hit = cache.prepare_inputs(c)
    assert not hit and cache.inputs_stored == 1
    again, hit = cache.prepare_inputs(c)
    assert hit and cache.inputs_hits == 1
    assert_same_inputs(prepare(c), again)
    assert_same_inputs(first, again)


def test_shared_storage_and_offsets_of_the_generated_tensors_survive(tmp_path):
    base = torch.randn(40, dtype=torch.float64)
    src = {"shape": [], "dtype": "float64", "init": "randn", "init_args": {}}
    views = [base[3:23].view(4, 5), base[10:].view(6, 5).t(), torch.randint(0, 9, (7,))]
    leaves = [TensorLeaf(v, None, None, dict(src, shape=list(v.shape), dtype=str(v.dtype)[6:])) for v in views]
    path = tmp_path / "x.in"
    with open(path, "wb") as f:
        assert inputcache.write(f, Prepared([], {}, leaves))
    back = [t for t, _ in inputcache.read(path)]
    assert [layout(t) for t in back] == [layout(t) for t in views] and sharing(back) == [0, 0, 2]
    assert all(torch.equal(x, y) for x, y in zip(back, views))


def test_an_op_that_writes_into_its_input_never_sees_an_earlier_write(tmp_path):
    c = CASES["writes into its input, noncontiguous"]
    cache = ReferenceCache(tmp_path / "refs")
    fresh = run_case(c, reference_cache=False)
    for n in range(3):  # cold, then the reference and the inputs from the cache, twice
        ex = run_case(c, reference_cache=cache)
        assert ("input_cache" in ex.notes) == (n > 0) and ex.mutated == ["args[0]"]
        assert compare(fresh.target, ex.target, mode="bits").passed  # a + b, not a + b + b
        assert compare(ex.reference, ex.target, mode="bits").passed
    assert_same_inputs(prepare(c), cache.prepare_inputs(c)[0])  # the file holds the untouched inputs


def test_an_op_not_known_to_write_that_does_gets_untouched_inputs_again(tmp_path):
    # torch.nn.functional.relu with inplace in its positional args: found by the version counter
    c = case("torch.nn.functional.relu", T([5, 6]), {"value": True})
    cache = ReferenceCache(tmp_path / "refs")
    fresh = run_case(c, reference_cache=False)
    run_case(c, reference_cache=cache)
    ex = run_case(c, reference_cache=ReferenceCache(tmp_path / "refs"), high_precision=True)
    assert ex.notes.get("input_cache") == "hit" and ex.mutated == fresh.mutated
    assert compare(fresh.target, ex.target, mode="bits").passed
    assert compare(fresh.reference, ex.reference, mode="bits").passed


@pytest.mark.parametrize("change", ["case seed", "torch version", "cpu capability", "threads", "reference dtype"])
def test_what_decides_the_bits_is_in_the_key_and_nothing_else(tmp_path, monkeypatch, change):
    c = CASES["int index (embedding, bf16 weight)"]
    cache = ReferenceCache(tmp_path / "refs")
    run_case(c, reference_cache=cache, reference_dtype="float64")
    assert cache.inputs_stored == 1
    dtype = "float32" if change == "reference dtype" else "float64"
    c = dict(c, seed=4) if change == "case seed" else c
    change_environment(monkeypatch, change)
    ex = run_case(c, reference_cache=cache, reference_dtype=dtype)
    misses = change in ("case seed", "torch version", "cpu capability")
    assert ("input_cache" in ex.notes) is not misses
    assert (cache.inputs_hits, cache.inputs_stored) == ((0, 2) if misses else (1, 1))
    assert_same_inputs(prepare(c), cache.prepare_inputs(c)[0])


class Shell:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


@pytest.mark.parametrize("damage", ["a flipped byte", "cut short", "another file", "a pickle that runs code"])
def test_a_corrupt_inputs_file_is_a_miss_and_is_deleted(tmp_path, damage):
    c = CASES["strided preset (a view into a larger storage)"]
    cache = ReferenceCache(tmp_path / "refs")
    fresh = run_case(c, reference_cache=cache)
    (path, _, _), = cache.entries(inputcache.SUFFIX)
    data = bytearray(path.read_bytes())
    if damage == "a flipped byte":  # in a tensor's bytes: the archive still loads
        at = data.index(prepare(c).leaves[0].base.numpy().tobytes()[:16])
        data[at + 3] ^= 0x10
    elif damage == "cut short":
        data = data[: len(data) // 2]
    elif damage == "another file":
        data = bytearray(refcache.dumps({"reference": {"output": torch.zeros(3)}, "mutated": []}))
    else:  # torch.save of an object whose unpickling would call os.system: weights_only refuses it
        torch.save({"meta": "[]", "digest": inputcache._digest("[]", []), "tensors": [], "x": Shell()}, path)
        data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data))
    assert cache.load_inputs(refcache.input_key(c)) is None and not path.exists() and cache.corrupt == 1
    ex = run_case(c, reference_cache=cache)
    assert "input_cache" not in ex.notes and compare(fresh.target, ex.target, mode="bits").passed
    assert path.exists() and cache.load_inputs(refcache.input_key(c)) is not None  # stored anew


def test_eviction_counts_the_inputs(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    c = case("torch.neg", T([100, 100]))
    assert cache.prepare_inputs(c)[1] is False and cache.store("ab" * 32, {"reference": {"output": 1}, "mutated": []})
    info = cache.info()
    assert info["inputs"]["entries"] == 1 and info["references"]["entries"] == 1
    assert info["inputs"]["bytes"] > 40_000 and info["bytes"] == info["inputs"]["bytes"] + info["references"]["bytes"]
    small = ReferenceCache(tmp_path / "refs", max_bytes=info["inputs"]["bytes"] + 10)
    assert small.prepare_inputs(dict(c, seed=9))[1] is False and small.inputs_stored == 1
    after = small.info()
    assert after["bytes"] <= small.max_bytes and after["inputs"]["entries"] == 1  # the older ones went
    assert small.load_inputs(refcache.input_key(c)) is None
    tiny = ReferenceCache(tmp_path / "tiny", max_bytes=1000)
    assert tiny.prepare_inputs(c)[1] is False and tiny.inputs_stored == 0 and tiny.entries() == []  # over the cap


def test_a_run_over_the_cap_keeps_its_first_entries_instead_of_thrashing(tmp_path):
    cases = [case("torch.neg", T([100, 100]), seed=i) for i in range(5)]
    one = ReferenceCache(tmp_path / "one")
    one.prepare_inputs(cases[0])
    size = one.info()["bytes"]
    old = ReferenceCache(tmp_path / "refs")
    old.prepare_inputs(cases[4])
    (path, _, _), = old.entries()
    os.utime(path, (1000, 1000))  # an entry of an earlier run
    run = ReferenceCache(tmp_path / "refs", max_bytes=int(2.5 * size))
    for c in cases[:4]:
        run.prepare_inputs(c)
    assert run.inputs_stored == 2 and not path.exists()  # the earlier run's entry went, then no more room
    assert [run.load_inputs(refcache.input_key(c)) is not None for c in cases[:4]] == [True, True, False, False]
    rerun = ReferenceCache(tmp_path / "refs", max_bytes=int(2.5 * size))
    assert [rerun.prepare_inputs(c)[1] for c in cases[:4]] == [True, True, False, False]  # its first two hit


def test_tiny_inputs_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(inputcache, "MIN_NUMEL", 1 << 20)
    cache = ReferenceCache(tmp_path / "refs")
    run_case(case("torch.neg", T([100, 100])), reference_cache=cache)
    assert cache.inputs_stored == 0 and cache.info()["inputs"]["entries"] == 0
    big = case("torch.sum", T([1024, 1024], "bfloat16"), T([4, 4], "float32", "zeros"))
    run_case(big, reference_cache=cache)  # 1 M drawn elements (the zeros take no draw)
    assert cache.inputs_stored == 1
    bases = cache.load_inputs(refcache.input_key(big))
    assert bases[0][0].shape == (1024, 1024) and bases[1] is None  # zeros: built again


MANIFEST = """\
model: inputs
cases:
  - name: strided
    op: torch.add
    inputs:
      - {tensor: {shape: [2, 3, 4], dtype: float32, preset: strided, preset_args: {stride: [20, 1, 3], storage_offset: 5}}}
      - {tensor: {shape: [2, 3, 4], dtype: float32}}
  - name: embedding
    op: torch.nn.functional.embedding
    inputs:
      - {tensor: {shape: [3, 5], dtype: int64, init: randint, init_args: {low: 0, high: 40}}}
      - {tensor: {shape: [40, 16], dtype: bfloat16}}
  - name: inplace
    op: torch.Tensor.mul_
    inputs: [{tensor: {shape: [6, 7], dtype: float16}}, {tensor: {shape: [6, 7], dtype: float16}}]
  - name: mm
    op: torch.matmul
    inputs: [{tensor: {shape: [8, 32], dtype: bfloat16}}, {tensor: {shape: [32, 4], dtype: bfloat16}}]
  - name: bad
    op: torch.matmul
    inputs: [{tensor: {shape: [8, 31], dtype: float32}}, {tensor: {shape: [32, 4], dtype: float32}}]
  - name: noise
    op: torch.rand_like
    inputs: [{tensor: {shape: [4, 4], dtype: float32}}]
"""

VOLATILE = {"id", "run_id", "t_ref", "t_compile", "t_exec", "duration", "created_at", "worker", "metrics"}


def judged(db_path, run_id: int) -> list:
    """The run's results and judgements, whole rows but their ids and times."""
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    rows = []
    for table, order in (("results", "signature"), ("judgements", "model_case_id")):
        for r in conn.execute(f"SELECT * FROM {table} WHERE run_id = ? ORDER BY {order}", [run_id]):
            row = {k: r[k] for k in r.keys() if k not in VOLATILE and k != "result_id"}
            metrics = json.loads(r["metrics"]) if table == "results" and r["metrics"] else {}
            row["metrics"] = {k: v for k, v in metrics.items() if not k.startswith("t_") and k != "notes"}
            rows.append((table, row))
    conn.close()
    return rows


@pytest.mark.slow
def test_a_run_judges_the_same_with_and_without_cached_inputs(cli, db_path, tmp_path):
    (tmp_path / "m.yaml").write_text(MANIFEST)
    assert cli("import", tmp_path / "m.yaml").exit_code == 0
    run = ("run", "--model", "inputs", "--backend", "eager", "--device", "cpu", "-m", "", "-j", "0", "--json")
    off = json.loads(cli(*run, "--no-reference-cache").stdout)
    assert off["time"]["inputs_from_cache"] == 0 and cli("cache", "info", "--json").stdout.count('"entries": 0') == 3
    cold = json.loads(cli(*run).stdout)
    info = json.loads(cli("cache", "info", "--json").stdout)
    assert cold["time"]["inputs_from_cache"] == 0 and info["inputs"]["entries"] == 6
    warm = json.loads(cli(*run).stdout)
    assert warm["time"]["inputs_from_cache"] == 6 and warm["time"]["references_from_cache"] == 4
    assert (off["passed"], off["ref_errors"]) == (5, 1)
    ids = [r["run_id"] for r in (off, cold, warm)]
    assert judged(db_path, ids[0]) == judged(db_path, ids[1]) == judged(db_path, ids[2])
    text = " ".join(cli(*run[:-1]).stdout.split())
    assert "6 inputs from the cache" in text
    assert "4 references (" in " ".join(cli("cache", "info").stdout.split())
    assert json.loads(cli("cache", "clear", "--json").stdout) == {
        "folder": info["folder"], "deleted": 10, "references": 4, "inputs": 6}
