"""What a run holds while it runs one case: no copy of a reference to store it, nothing serialized
that the cache's cap refuses anyway, and no third copy of a large output for a timing call (the
main job's 12.4 GiB peak: a 4 GiB broadcast mul, its reference and target outputs, and one more)."""

from __future__ import annotations

import tracemalloc

import torch

from casedb.cases.materialize import prepare
from casedb.run import execute, refcache
from casedb.run.execute import run_case

NAME = "ab" * 32


def add_case(n: int) -> dict:
    t = {"tensor": {"shape": [n], "dtype": "float32", "init": "randn"}}
    return {"signature": "77aa" + "0" * 60, "op": "torch.add", "inputs": [t, t], "attrs": {}, "dtype": "float32",
            "seed": 3}


def test_storing_a_reference_copies_none_of_it_and_keeps_the_format(tmp_path):
    cache = refcache.ReferenceCache(tmp_path / "c", max_bytes=2**30)
    value = {"reference": {"output": torch.randn(8 << 20)}, "mutated": []}  # 32 MiB
    tracemalloc.start()
    try:
        assert cache.store(NAME, value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"storing a 32 MiB reference took {peak >> 20} MiB more"
    (path, _, _), = cache.entries()
    assert path.read_bytes() == refcache.dumps(value, NAME)  # the entry's bytes: seal + payload, as before
    assert torch.equal(cache.load(NAME)["reference"]["output"], value["reference"]["output"])


def test_a_reference_over_the_cap_is_never_serialized(tmp_path, monkeypatch):
    saved = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: saved.append(1) or real_save(*a, **k))
    cache = refcache.ReferenceCache(tmp_path / "c", max_bytes=1 << 20)
    assert not cache.store(NAME, {"reference": {"output": torch.zeros(1 << 20)}, "mutated": []})  # 4 MiB
    assert not saved and cache.entries() == []
    big = prepare(add_case(1 << 20))  # 8 MiB of drawn inputs
    assert not cache.store_inputs(NAME, big) and not saved and cache.entries() == []


def counting_backend(calls: list):
    def backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)
        return run
    return backend


def test_a_large_compiled_output_is_not_made_a_second_time(monkeypatch):
    calls: list = []
    ex = run_case(add_case(1000), backend=counting_backend(calls))
    assert len(calls) == 2 and ex.t_exec is not None and "second_call" not in ex.notes  # compile-and-run, then run
    monkeypatch.setattr(execute, "SECOND_CALL_MAX_BYTES", 3999)  # the output takes 4000 bytes
    calls.clear()
    ex = run_case(add_case(1000), backend=counting_backend(calls))
    assert len(calls) == 1 and ex.t_exec is None and ex.t_compile is not None
    assert ex.notes["second_call"].startswith("skipped") and ex.target is not None and ex.reference is not None
    calls.clear()
    ex = run_case(add_case(1000), backend=counting_backend(calls), check_determinism=True)
    assert len(calls) == 2 and ex.deterministic  # a determinism check still calls it twice
