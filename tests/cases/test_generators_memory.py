"""casedb.cases.generators draws a large input in chunks: it never exists whole in float64 (the main
job's 1 G-element float32 ``sum`` took 12 GiB to build a 4 GiB input), and the chunks give the bits
of one draw."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from casedb.cases import generators
from casedb.cases.materialize import prepare

ROOT = Path(__file__).resolve().parents[2]
INITS = [("randn", {}), ("randn", {"mean": 1.5, "std": 0.25}), ("uniform", {"low": -2.0, "high": 3.0}),
         ("xavier", {})]


def case(n: int, init: str, init_args: dict, dtype: str = "float32") -> dict:
    """A case of one generated input of ``n`` elements, then a small one (it reads the generator
    where the first left it)."""
    shape = [n] if init != "xavier" else [n // 8, 8]
    return {"signature": "5e1f" + "0" * 60, "op": "torch.add", "dtype": dtype, "seed": 7, "attrs": {},
            "inputs": [{"tensor": {"shape": shape, "dtype": dtype, "init": init, "init_args": init_args}},
                       {"tensor": {"shape": [40], "dtype": "float32", "init": "randn"}}]}


class Float64Sizes(TorchDispatchMode):
    """The largest float64 tensor any op makes while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("init,init_args", INITS)
def test_a_large_input_is_never_drawn_whole_in_float64(monkeypatch, init, init_args):
    monkeypatch.setattr(generators, "DRAW_CHUNK", 1024, raising=False)
    with Float64Sizes() as seen:
        prepared = prepare(case(10_000, init, init_args))
    assert prepared.leaves[0].base.dtype == torch.float32 and prepared.leaves[0].base.numel() == 10_000
    assert seen.largest <= 1024 + 16, f"{seen.largest} float64 values at once for a 10,000-element float32 input"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("init,init_args", INITS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_chunks_give_the_bits_of_one_draw(monkeypatch, init, init_args, dtype):
    # sizes around the chunk and its 16-value blocks: randn redraws a tail that is not a multiple of 16
    for n in (8, 16, 64, 79, 80, 81, 96, 97, 200, 203, 1000):
        monkeypatch.setattr(generators, "DRAW_CHUNK", 1 << 40, raising=False)  # one draw, as before chunks
        whole = prepare(case(n, init, init_args, dtype)).leaves
        monkeypatch.setattr(generators, "DRAW_CHUNK", 64, raising=False)
        chunked = prepare(case(n, init, init_args, dtype)).leaves
        for a, b in zip(whole, chunked):
            assert a.base.shape == b.base.shape and a.base.dtype == b.base.dtype
            assert torch.equal(bits(a.base), bits(b.base)), (init, dtype, n)


def test_chunks_of_the_real_size_give_the_bits_of_one_draw(monkeypatch):
    n = 2 * generators.DRAW_CHUNK + 21
    chunked = prepare(case(n, "randn", {}))
    monkeypatch.setattr(generators, "DRAW_CHUNK", 1 << 40)
    whole = prepare(case(n, "randn", {}))
    for a, b in zip(whole.leaves, chunked.leaves):
        assert torch.equal(bits(a.base), bits(b.base))


@pytest.mark.slow
def test_building_a_large_input_takes_about_its_own_bytes():
    # a real process: its peak RSS while building a 256 MiB float32 input (randn drawn in float64
    # whole took 768 MiB more than before the build)
    code = ("import resource, torch\n"
            "from casedb.cases.materialize import prepare\n"
            "from tests.cases.test_generators_memory import case\n"
            "torch.randn(8, dtype=torch.float64)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "p = prepare(case(64 << 20, 'randn', {}))\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grown, tensor = int(out.stdout.split()[-1]), (64 << 20) * 4
    assert grown < 1.25 * tensor, f"building a {tensor >> 20} MiB input took {grown >> 20} MiB more"
