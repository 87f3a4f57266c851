"""The mutation harness: the registry of mutants (:func:`mutant`), the dynamo backend each one
becomes (``casedb_mutant_<name>`` over a real base backend), how each kind of mutant is applied
and noted, and the tensor helpers mutants use. The built-in mutants are :mod:`casedb.mutation.mutants`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from casedb.run.backend import OP_WRAPPERS

PREFIX = "casedb_mutant_"
BASE_ENV = "CASEDB_MUTANT_BASE"
DEFAULT_BASE = "eager"
# The base without dynamo: each mutant wraps the op call itself (casedb.run.backend.OP_WRAPPERS),
# for a device dynamo cannot trace (an eager-only PrivateUse1 device). Call-kind mutants get the op
# as their ``call.gm``; broadcast, which reads the traced graph, does not apply.
TENSOR_BASE = "tensor"
KINDS = ("output", "input", "call")
CONTROL = "none"
COPY_LIMIT = 256 * 2**20   # bytes of storage above which an input is shared, not copied


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str
    fn: Callable
    doc: str

    @property
    def backend(self) -> str:
        return PREFIX + self.name


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, kind: str = "output"):
    """Register ``fn`` as mutant ``name`` and as the dynamo backend ``casedb_mutant_<name>``."""
    if kind not in KINDS:
        raise ValueError(f"mutant kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if not name.replace("_", "").isalnum():
        raise ValueError(f"mutant name must be letters, digits and '_', not {name!r}")

    def register(fn):
        MUTANTS[name] = Mutant(name, kind, fn, " ".join((fn.__doc__ or "").split()))
        try:
            torch._dynamo.register_backend(_backend(name), name=PREFIX + name)
        except AssertionError:  # registered by an earlier import: the backend looks MUTANTS up per compile
            pass
        OP_WRAPPERS[PREFIX + name] = lambda op: _tensor_level(name, op) if base_backend() == TENSOR_BASE else None
        return fn

    return register


def bugs() -> list[str]:
    """The names of the registered mutants, the control left out, in registration order."""
    return [n for n in MUTANTS if n != CONTROL]


def base_backend() -> str:
    return os.environ.get(BASE_ENV) or DEFAULT_BASE


# ------------------------------------------------------------------------------------ the wrapper

class _Call:
    """The base's compiled graph, callable, with the graph it came from."""

    def __init__(self, fn, gm):
        self.fn, self.gm = fn, gm

    def __call__(self, *args):
        return self.fn(*args)


def _backend(name: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        m = MUTANTS[name]
        base = base_backend()
        call = _Call(torch._dynamo.lookup_backend(base)(gm, example_inputs), gm)

        def run(*args):
            return _APPLY[m.kind](m, call, list(args), base)

        return run

    compile_graph.__name__ = PREFIX + name
    return compile_graph


class _OpCall:
    """The op itself where the base has no graph (TENSOR_BASE): called with the op's positional
    arguments, its keyword arguments fixed; it is its own ``gm`` (without a ``graph``)."""

    graph = None

    def __init__(self, fn, kwargs: dict):
        self.fn, self.kwargs, self.gm = fn, kwargs, self

    def __call__(self, *args):
        return self.fn(*args, **self.kwargs)


def _tensor_level(name: str, fn):
    def run(*args, **kwargs):
        m = MUTANTS[name]
        return _APPLY[m.kind](m, _OpCall(fn, kwargs), list(args), TENSOR_BASE)

    return run


def _note(m: Mutant, base: str, changed: bool, **extra) -> None:
    from casedb.run.execute import note

    note("mutant", {"name": m.name, "changed": bool(changed), "base": base, **extra})


def _apply_output(m: Mutant, call: _Call, args: list, base: str):
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in args]
    out = call(*args)  # a failure here is the base's: no change
    try:
        changed = False
        written = [a for a, v in zip(args, versions) if isinstance(a, torch.Tensor) and a._version != v]
        for t in written:
            new = m.fn(t)
            if not same(new, t):
                changed = True
                t.copy_(new)
        storages = {_storage_key(t) for t in written}

        def one(y):
            nonlocal changed
            if not isinstance(y, torch.Tensor) or (y.numel() and _storage_key(y) in storages):
                return y
            new = m.fn(y)
            if same(new, y):
                return y
            changed = True
            return new

        out = map_tensors(out, one)
    except Exception as e:
        _note(m, base, True, raised=type(e).__name__)
        raise
    _note(m, base, changed)
    return out


def _apply_mutated(m: Mutant, call: _Call, args: list, base: str, mutated: Callable):
    """Input and call kinds: the mutated call on ``args``, the true one on copies taken first."""
    snapshot = [copy_input(a) for a in args]  # before the mutated call can write into args
    try:
        out = mutated()
    except Exception as e:
        try:
            call(*snapshot)
        except Exception:
            _note(m, base, False)  # the base fails as well
        else:
            _note(m, base, True, raised=type(e).__name__)
        raise
    if out is _NOT_APPLICABLE:
        _note(m, base, False)
        return call(*args)
    true = call(*snapshot)
    changed = not same(true, out) or not all(same(s, a) for s, a in zip(snapshot, args))
    _note(m, base, changed)
    return out


_NOT_APPLICABLE = object()


def _apply_input(m: Mutant, call: _Call, args: list, base: str):
    new = m.fn(list(args))  # builds new arguments, touches none: nothing to copy where it does not apply
    if new is None:
        _note(m, base, False)
        return call(*args)
    return _apply_mutated(m, call, args, base, lambda: call_written_back(call, args, new))


def _apply_call(m: Mutant, call: _Call, args: list, base: str):
    def mutated():
        out = m.fn(call, args)
        return _NOT_APPLICABLE if out is None else out

    return _apply_mutated(m, call, args, base, mutated)


_APPLY = {"output": _apply_output, "input": _apply_input, "call": _apply_call}


# ------------------------------------------------------------------------------------ helpers

def map_tensors(x, fn):
    """``x`` (a tensor, or a tuple/list of them and other things) with ``fn`` applied to each tensor."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        items = [map_tensors(i, fn) for i in x]
        return items if isinstance(x, list) else tuple(items)
    return x


def tensors(x) -> list:
    out = []
    map_tensors(x, lambda t: out.append(t) or t)
    return out


def same(a, b) -> bool:
    """Equal values (NaN equal to NaN, -0.0 to 0.0), shapes and dtypes, over any nesting."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a is b or a == b


def _storage_key(t: torch.Tensor):
    """What tells a tensor's storage apart: its data pointer, or the tensor itself where a device's
    tensors hold none torch can read (a Python wrapper tensor)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return id(t)


def copy_input(x, zeroed: bool = False):
    """A copy with the same sizes, strides and storage offset (a copy of the whole storage), or
    ``x`` itself when its storage is larger than COPY_LIMIT; ``zeroed``: the same layout over a
    storage of zeros (any size)."""
    if isinstance(x, (list, tuple)):
        return type(x)(copy_input(i, zeroed) for i in x)
    if not isinstance(x, torch.Tensor):
        return x
    if _storage_key(x) == id(x):  # a device tensor without a storage torch can read: sizes and strides
        out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
        return out.zero_() if zeroed else out.copy_(x)
    if x.untyped_storage().nbytes() > COPY_LIMIT and not zeroed:
        return x
    if zeroed:
        storage = torch.zeros(x.untyped_storage().nbytes(), dtype=torch.uint8, device=x.device).untyped_storage()
    else:
        storage = x.untyped_storage().clone()
    return torch.empty(0, dtype=x.dtype, device=x.device).set_(storage, x.storage_offset(), x.size(), x.stride())


def like(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``x``'s sizes and strides holding ``values``."""
    if not overlapping(x):
        out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
        out.copy_(values)
        return out
    return values.to(x.dtype).contiguous()


def overlapping(x: torch.Tensor) -> bool:
    return any(s == 0 and n > 1 for s, n in zip(x.stride(), x.size()))


def call_written_back(call: _Call, args: list, new: list):
    """``call(*new)``; an input ``new`` replaced and the call wrote into is copied back into ``args``."""
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in new]
    out = call(*new)
    for a, n, v in zip(args, new, versions):
        if isinstance(a, torch.Tensor) and isinstance(n, torch.Tensor) and n is not a and n._version != v:
            a.copy_(n)
    return out


def is_floating(y) -> bool:
    return isinstance(y, torch.Tensor) and y.is_floating_point()


def ulp(y: torch.Tensor) -> torch.Tensor:
    """The spacing of ``y``'s dtype at each element, in float64 (the smallest normal's at zero)."""
    info = torch.finfo(y.dtype)
    mag = y.to(torch.float64).abs().clamp(min=info.tiny)
    mag = torch.where(torch.isfinite(mag), mag, torch.ones_like(mag))
    return info.eps * torch.exp2(torch.floor(torch.log2(mag)))
