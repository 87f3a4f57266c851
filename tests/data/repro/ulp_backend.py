"""Dynamo backends for the bring-up tests: casedb_ulp_off scales every floating output by (1 + 16 eps)
(off by 16 ULPs, within rtol/atol), casedb_ulp_fixed runs the graph as captured, casedb_zeros
returns zeros for every floating output."""
import torch
from torch._dynamo import register_backend

def _off(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        def bump(y):
            if isinstance(y, torch.Tensor) and y.is_floating_point():
                return y * (1 + 16 * torch.finfo(y.dtype).eps)
            return y
        return type(out)(bump(y) for y in out) if isinstance(out, (tuple, list)) else bump(out)
    return run

def _fixed(gm, example_inputs):
    return gm

for name, fn in (("casedb_ulp_off", _off), ("casedb_ulp_fixed", _fixed)):
    try:
        register_backend(compiler_fn=fn, name=name)
    except Exception:
        pass


def _zeros(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        zero = lambda y: torch.zeros_like(y) if isinstance(y, torch.Tensor) and y.is_floating_point() else y  # noqa: E731
        return type(out)(zero(y) for y in out) if isinstance(out, (tuple, list)) else zero(out)
    return run


try:
    register_backend(compiler_fn=_zeros, name="casedb_zeros")
except Exception:
    pass
