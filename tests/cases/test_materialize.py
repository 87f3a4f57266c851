"""casedb.cases.materialize: deterministic, portable inputs; values, presets, blobs, device strings."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from casedb.cases.blobs import decode as tensor_from_bytes
from casedb.cases.blobs import encode as tensor_bytes
from casedb.cases.materialize import (MaterializeError, case_seed, materialize, prepare, upcast_caster,
                                      widen_dtype_keyword)

SIG = "9f2c" + "ab" * 30
ROOT = Path(__file__).resolve().parents[2]


def T(shape, dtype="float32", init=None, **kw):
    spec = {"shape": shape, "dtype": dtype}
    if init:
        spec["init"] = init
    spec.update(kw)
    return {"tensor": spec}


def case(*inputs, attrs=None, seed=None, sig=SIG, op="torch.add", dtype="float32"):
    return {"signature": sig, "op": op, "inputs": list(inputs), "attrs": attrs or {}, "dtype": dtype, "seed": seed}


def digest(args) -> str:
    h = hashlib.sha256()
    for a in args:
        if isinstance(a, torch.Tensor):
            h.update(tensor_bytes(a))
    return h.hexdigest()[:16]


# One case with every random init kind; its bytes are pinned below (and checked under another CPU kernel set).
GOLDEN = case(T([5, 7], "float32", "randn"), T([33], "float16", "randn"), T([4, 4], "bfloat16", "rand"),
              T([6], "float64", "uniform", init_args={"low": -2.5, "high": 3.0}),
              T([9], "int64", "randint", init_args={"low": -5, "high": 100}), T([10], "bool", "rand"),
              T([3, 3], "float32", "randn", init_args={"mean": 1.5, "std": 0.25}))
GOLDEN_DIGEST = "3884ac4d4a123abf"


def test_same_case_same_bytes_and_pinned_values():
    a, _ = materialize(GOLDEN, "cpu")
    b, _ = materialize(GOLDEN, "cpu")
    assert digest(a) == digest(b)
    assert digest(a) == GOLDEN_DIGEST, "generated values changed: every stored result would move"


@pytest.mark.slow
def test_values_do_not_depend_on_cpu_kernels():
    # torch's float32 normal kernel differs between AVX2/AVX512 and the default (ARM, s390x ...) build;
    # casedb's generation must not.
    code = ("from tests.cases.test_materialize import GOLDEN, digest; from casedb.cases.materialize import materialize;"
            "print(digest(materialize(GOLDEN, 'cpu')[0]))")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == GOLDEN_DIGEST


def test_seed_defaults_to_signature_prefix():
    assert case_seed(case(sig=SIG)) == int(SIG[:8], 16)
    assert case_seed(case(seed=7)) == 7
    derived, _ = materialize(case(T([16], "float32", "randn")), "cpu")
    explicit, _ = materialize(case(T([16], "float32", "randn"), seed=int(SIG[:8], 16), sig="0" * 64), "cpu")
    assert torch.equal(derived[0], explicit[0])
    other, _ = materialize(case(T([16], "float32", "randn"), seed=1), "cpu")
    assert not torch.equal(derived[0], other[0])


def test_init_kinds():
    args, _ = materialize(case(
        T([1000], "float32", "rand"), T([1000], "float16", "uniform", init_args={"low": -1.0, "high": 1.0}),
        T([1000], "int32", "randint", init_args={"low": 3, "high": 7}), T([2, 3], "float16", "arange"),
        T([2, 2], "int64", "zeros"), T([2, 2], "bfloat16", "ones"), T([4000], "bool", "rand"),
        T([100], "int64", "rand"), T([5], "float32", "arange", init_args={"start": 1.0, "step": 0.5}),
        T([20000], "float32", "randn", init_args={"mean": 3.0, "std": 2.0}), T([], "float32", "randn")), "cpu")
    rand, uni, ri, ar, z, o, b, irand, ar2, rn, scalar = args
    assert rand.dtype == torch.float32 and 0 <= rand.min() and rand.max() < 1
    assert uni.dtype == torch.float16 and -1 <= uni.min() and uni.max() <= 1
    assert ri.dtype == torch.int32 and set(ri.unique().tolist()) == {3, 4, 5, 6}
    assert torch.equal(ar, torch.arange(6, dtype=torch.float16).reshape(2, 3))
    assert torch.equal(z, torch.zeros(2, 2, dtype=torch.int64)) and torch.equal(o, torch.ones(2, 2, dtype=torch.bfloat16))
    assert b.dtype == torch.bool and 0.45 < b.float().mean() < 0.55
    assert irand.dtype == torch.int64 and 0 <= irand.min() and irand.max() < 10
    assert ar2.tolist() == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert abs(rn.mean() - 3.0) < 0.1 and abs(rn.std() - 2.0) < 0.1
    assert scalar.shape == () and scalar.dtype == torch.float32


def test_blob_round_trip_and_errors():
    blobs = {}
    tensors = [torch.randn(3, 4).to(torch.bfloat16), torch.tensor([True, False, True]),
               torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.randn(2, dtype=torch.complex64)]
    inputs = []
    for t in tensors:
        raw = tensor_bytes(t)
        sha = hashlib.sha256(raw).hexdigest()
        blobs[sha] = raw
        inputs.append(T(list(t.shape), str(t.dtype)[6:], "data", blob=sha))
    inputs.append({"file": {"blob": next(iter(blobs)), "shape": [3, 4], "dtype": "bfloat16", "path": "x.pt"}})
    args, _ = materialize(case(*inputs), "cpu", load_blob=blobs.__getitem__)
    for got, want in zip(args, tensors + [tensors[0]]):
        assert got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(MaterializeError, match="load_blob"):
        materialize(case(inputs[0]), "cpu")
    with pytest.raises(ValueError, match="needs 24"):
        tensor_from_bytes(b"\0" * 10, [3, 4], torch.float16)
    assert tensor_from_bytes(b"", [0, 3], torch.float32).shape == (0, 3)


def test_presets_keep_values_and_change_layout():
    plain, _ = materialize(case(T([2, 3, 8], "float16", "randn")), "cpu")
    sliced, _ = materialize(case(T([2, 3, 8], "float16", "randn", preset="noncontig_slice",
                                   preset_args={"dim": 1, "step": 2})), "cpu")
    trans, _ = materialize(case(T([2, 3, 8], "float16", "randn", preset="transpose_view",
                                  preset_args={"dim0": 1, "dim1": 2})), "cpu")
    strided, _ = materialize(case(T([2, 3, 8], "float16", "randn", preset="strided",
                                    preset_args={"stride": [48, 16, 1], "storage_offset": 5})), "cpu")
    for t in (sliced[0], trans[0], strided[0]):
        assert torch.equal(t, plain[0]) and not t.is_contiguous()
    assert sliced[0].stride() == (48, 16, 1)
    assert trans[0].stride() == (24, 1, 3)
    assert strided[0].stride() == (48, 16, 1) and strided[0].storage_offset() == 5


def test_values_py_lists_and_keyword_tensors():
    c = case(T([2], "float32", "ones"), {"value": 3}, {"value": 3.0}, {"value": [2, 32]}, {"value": "torch.bfloat16"},
             {"value": "torch.channels_last"}, {"value": "mean"}, {"value": None},
             {"py": "(Ellipsis, None, slice(None, None, None))"},
             {"tensor_list": [{"shape": [1, 2], "dtype": "float16", "init": "zeros"},
                              {"shape": [3], "dtype": "int64", "init": "ones"}]},
             attrs={"dim": -1, "bias": T([2], "float32", "ones"), "layout": "torch.strided"})
    args, kwargs = materialize(c, "cpu")
    assert args[1:9] == [3, 3.0, [2, 32], torch.bfloat16, torch.channels_last, "mean", None,
                         (Ellipsis, None, slice(None, None, None))]
    assert isinstance(args[1], int) and isinstance(args[2], float)
    assert [t.dtype for t in args[9]] == [torch.float16, torch.int64]
    assert kwargs["dim"] == -1 and torch.equal(kwargs["bias"], torch.ones(2)) and kwargs["layout"] is torch.strided


def test_keyword_order_does_not_change_values():
    a = case(T([4], "float32"), attrs={"b": T([4], "float32"), "a": T([4], "float32")})
    b = case(T([4], "float32"), attrs={"a": T([4], "float32"), "b": T([4], "float32")})
    (pa, ka), (pb, kb) = materialize(a, "cpu"), materialize(b, "cpu")
    assert torch.equal(pa[0], pb[0]) and torch.equal(ka["a"], kb["a"]) and torch.equal(ka["b"], kb["b"])


def test_device_strings_are_replaced_unless_told_not_to():
    c = case({"value": 10}, {"value": "cuda:0"}, attrs={"device": "meta", "other": "cuda"})
    args, kwargs = materialize(c, "cpu")
    assert args == [10, "cpu"] and kwargs == {"device": "cpu", "other": "cpu"}
    args, kwargs = materialize(c, "cpu", replace_device=False)
    assert args == [10, "cuda:0"] and kwargs == {"device": "meta", "other": "cuda"}


def test_dtype_override_keeps_values():
    c = case(T([64], "float16", "randn"), T([8], "int64", "randint"), T([4], "complex64", "randn"))
    (h, i, z), _ = materialize(c, "cpu")
    (h2, i2, z2), _ = materialize(c, "cpu", dtype_override="float64")
    assert h2.dtype == torch.float64 and torch.equal(h2, h.double())
    assert i2.dtype == torch.int64 and torch.equal(i2, i)
    assert z2.dtype == torch.complex128 and torch.equal(z2, z.to(torch.complex128))


def test_the_upcast_reference_computes_in_its_own_precision_not_a_dtype_keyword():
    # softmax(x, dtype=float32) upcast only in x would compute in float32 again: the CPU
    # reference itself, so its own error would read 0 and the target's would be measured against it
    to64, to32 = upcast_caster(torch.float64), upcast_caster(torch.float32)
    kw = {"dim": -1, "dtype": torch.float32}
    assert widen_dtype_keyword("torch.nn.functional.softmax", kw, to64) == {"dim": -1, "dtype": torch.float64}
    assert kw == {"dim": -1, "dtype": torch.float32}  # the case's own keywords untouched
    assert widen_dtype_keyword("torch.Tensor.to", {"dtype": torch.bfloat16}, to32) == {"dtype": torch.float32}
    assert widen_dtype_keyword("torch.sum", {"dtype": torch.float64}, to64) == {"dtype": torch.float64}
    assert widen_dtype_keyword("torch.sum", {"dtype": torch.int64}, to64) == {"dtype": torch.int64}
    assert widen_dtype_keyword("torch.Tensor.view", {"dtype": torch.float16}, to64) == {"dtype": torch.float16}
    assert widen_dtype_keyword("torch.add", {"alpha": 2}, to64) == {"alpha": 2}


def test_place_shares_or_copies():
    p = prepare(case(T([4], "float32"), T([2, 4], "float32", preset="transpose_view")))
    (a, b), _ = p.place("cpu")
    assert a is p.leaves[0].base
    (a2, _), _ = p.place("cpu", fresh=True)
    assert a2.data_ptr() != a.data_ptr() and torch.equal(a2, a)
    before = p.versions()
    a2.add_(1)
    assert p.versions() == before
    a.add_(1)
    assert p.versions() != before


def test_bad_specs_raise_materialize_error():
    with pytest.raises(MaterializeError, match="unknown init"):
        prepare(case(T([2], "float32", "gaussian")))
    with pytest.raises(MaterializeError, match="unknown dtype"):
        prepare(case(T([2], "float17")))
    with pytest.raises(MaterializeError, match="input kind"):
        prepare(case({"tensors": []}))
    with pytest.raises(MaterializeError, match="cannot generate"):
        prepare(case(T([2], "int8", "randint", init_args={"low": 0, "high": 1000})))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_gets_the_same_values_and_layout():
    c = case(T([3, 8], "float16", "randn", preset="transpose_view"), attrs={"device": "cpu"})
    (ref,), _ = materialize(c, "cpu")
    (dev,), kw = materialize(c, "cuda")
    assert dev.device.type == "cuda" and dev.stride() == ref.stride() and torch.equal(dev.cpu(), ref)
    assert kw["device"] == "cuda"
