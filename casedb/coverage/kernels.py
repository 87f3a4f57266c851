"""Whether a target can run the aten operators a case sends it: a kernel for the device's dispatch
key (``torch._C._dispatch_has_kernel_for_dispatch_key``; a composite operator through what it
calls, :mod:`casedb.coverage.trace`), or the key's backend fallback; for inductor, a lowering or a
decomposition (an operator inductor falls back on runs the device's kernel).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from casedb.coverage.trace import Trace, has_kernel

COMPILERS = ("inductor",)  # backends that lower operators themselves; others run the device's kernels


def dispatch_key(device: str) -> str:
    """The dispatch key of ``device``'s type (cpu: CPU, cuda: CUDA, a PrivateUse1 device: PrivateUse1)."""
    return torch._C._dispatch_key_for_device(torch.device(device).type)


def has_fallback(key: str) -> bool:
    """The key has a backend fallback (a device's CPU fallback): an operator without a kernel runs."""
    try:
        return torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, key))
    except AttributeError:
        return False


def missing(trace: Trace, key: str, ok=None) -> list[str]:
    """The operators of ``trace`` without a kernel for ``key`` (nor ``ok(name)``), a composite
    one's parts in its place."""
    if has_fallback(key):
        return []
    out: list[str] = []

    def walk(name: str, seen: tuple) -> None:
        if has_kernel(name, key) or (ok is not None and ok(name)) or name in seen:
            return
        if name in trace.parts:
            for p in trace.parts[name]:
                walk(p, seen + (name,))
        elif name not in out:
            out.append(name)

    for name in trace.ops:
        walk(name, ())
    return out


@lru_cache(maxsize=None)
def _overload(name: str):
    base, _, overload = name.split("::", 1)[1].partition(".")
    ns = name.split("::", 1)[0]
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    except AttributeError:
        return None


@lru_cache(maxsize=1)
def _inductor_tables():
    from torch._inductor import decomposition, lowering

    return lowering.lowerings, lowering.fallbacks, decomposition.select_decomp_table()


def lowering(name: str) -> str | None:
    """How inductor compiles ``name``: lowering, decomposition, or None (an ATen fallback: the
    device's own kernel runs)."""
    op = _overload(name)
    if op is None:
        return None
    lowerings, fallbacks, decomps = _inductor_tables()
    if op in decomps:
        return "decomposition"
    if op in lowerings and op not in fallbacks:
        return "lowering"
    return None


def missing_for(trace: Trace, key: str, backend: str) -> list[str]:
    """What blocks ``trace`` on the target: operators without a kernel (eager and backends that
    run the device's kernels), or for inductor neither lowered nor decomposed nor with a kernel."""
    if backend not in COMPILERS:
        return missing(trace, key)
    return missing(trace, key, ok=lambda name: lowering(name) is not None)
