"""The compile backend of a target: checking its name, compiling the op through a :class:`Probe`
that sees what the backend was given (graphs, their operations) and, for inductor, what it
generated (:func:`classify_lowering`), and the stage a target error belongs to
(:func:`failure_stage`).
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings

import torch

from casedb.judge.execution import ErrorInfo


@functools.lru_cache(maxsize=1)
def _registered_backends() -> frozenset:
    with warnings.catch_warnings():  # listing imports every backend module (torch.jit deprecations)
        warnings.simplefilter("ignore")
        return frozenset(torch._dynamo.list_backends(exclude_tags=()))


def check_backend(backend) -> None:
    """Raise ValueError unless ``backend`` is ``"eager"``, a registered dynamo backend or a callable."""
    if backend == "eager" or callable(backend):
        return
    if backend not in _registered_backends():
        _registered_backends.cache_clear()
        known = _registered_backends()
        if backend not in known:
            raise ValueError(f"unknown compile backend {backend!r}: use 'eager' (no compile) or a registered "
                             f"dynamo backend: {', '.join(sorted(known))}")


# Backends that wrap the op instead of compiling it (a device dynamo cannot trace still runs them):
# name -> ``make(fn) -> wrapped fn, or None`` (None: compile as usual). casedb.mutation.harness
# registers its mutants here for the tensor-level base.
OP_WRAPPERS: dict = {}


def op_wrapper(backend, fn):
    """``fn`` wrapped by ``backend`` when it is a wrapping backend now, else None."""
    make = OP_WRAPPERS.get(backend) if isinstance(backend, str) else None
    return None if make is None else make(fn)


_BUILT_IN_DEVICES = ("cpu", "cuda", "meta")  # inductor and dynamo ship with support for these


def compile_support(device: str, backend) -> str | None:
    """Why ``backend`` cannot compile ops for ``device`` (None: nothing known against it), checked
    once per process for devices torch itself does not ship (a PrivateUse1 device such as spyre):
    inductor needs a backend registered for the device type, and dynamo must trace the device's
    tensors (one ``x + 1`` compiled with ``backend``)."""
    dev = torch.device(device)
    if backend == "eager" or dev.type in _BUILT_IN_DEVICES or op_wrapper(backend, len) is not None:
        return None
    todo = ("run with --backend eager, or register the device's compile support in the module given to "
            "--import")
    if backend == "inductor":
        from torch._inductor.codegen.common import get_scheduling_for_device, init_backend_registration

        init_backend_registration()
        if get_scheduling_for_device(dev.type) is None:
            return (f"inductor has no backend registered for device {dev.type!r} "
                    f"(torch._inductor.codegen.common.register_backend_for_device): {todo}")
    torch._dynamo.reset()
    try:
        x = torch.ones(2, device=dev)
        torch.compile(lambda t: t + 1, backend=backend, fullgraph=True, dynamic=False)(x)
    except Exception as e:  # whatever the probe raises, every case would raise too
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{backend} cannot compile for device {device}: {type(e).__name__}: {first}: {todo}"
    finally:
        torch._dynamo.reset()
    return None


class Probe:
    """Wraps the dynamo backend: what it was given (graphs, their operations), whether it
    compiled, and for inductor what it generated; the raw material of exercised, lowering and
    the failure stage."""

    def __init__(self, backend):
        self.backend = backend
        # dynamo names the backend in its errors: the backend's own name, not this wrapper's
        self.__name__ = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
        self.calls = 0
        self.compiled = 0
        self.failed = False
        self.ops: list[str] = []
        self.code: list[str] = []

    def __repr__(self) -> str:
        return self.__name__

    def __call__(self, gm, example_inputs):
        self.calls += 1
        for n in gm.graph.nodes:
            if n.op in ("call_function", "call_method", "call_module"):
                self.ops.append(_node_label(n))
        real = self.backend if callable(self.backend) else torch._dynamo.lookup_backend(self.backend)
        try:
            with _inductor_code(self.code) if self.backend == "inductor" else contextlib.nullcontext():
                fn = real(gm, example_inputs)
        except BaseException:
            self.failed = True
            raise
        self.compiled += 1
        return fn


def _node_label(n) -> str:
    t = n.target
    if isinstance(t, str):
        return t
    return getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)


@contextlib.contextmanager
def _inductor_code(sink: list):
    """Collect the output code inductor writes for a graph (also on a cache hit)."""
    try:
        from torch._inductor.graph import GraphLowering
    except Exception:  # an inductor-less build: nothing to classify
        yield
        return
    original = GraphLowering.save_output_code

    def save(code: str) -> None:
        sink.append(code)
        if callable(original):
            original(code)

    GraphLowering.save_output_code = staticmethod(save)
    try:
        yield
    finally:
        GraphLowering.save_output_code = original


_KERNEL = re.compile(r"^\s*(?:\w+\s*=\s*)?(cpp_fused_\w+|triton_\w+)(?:\.run)?\(", re.M)
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_FALLBACK = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)(?:\.\w+)?\(")


def classify_lowering(code: list[str]) -> dict | None:
    """What inductor made of a graph, from its output code: generated kernels, extern kernels
    (mm, bmm, convolution libraries) and ATen fallbacks; ``kind`` is generated, extern,
    fallback, mixed or none (views and copies only)."""
    if not code:
        return None
    text = "\n".join(code)
    body = text[text.find("def call("):] if "def call(" in text else text
    kernels = sorted(set(_KERNEL.findall(body)))
    extern = sorted(set(_EXTERN.findall(body)))
    fallback = sorted({f"{ns}.{op}" for ns, op in _FALLBACK.findall(body)})
    present = [k for k, v in (("generated", kernels), ("extern", extern), ("fallback", fallback)) if v]
    kind = present[0] if len(present) == 1 else ("mixed" if present else "none")
    return {"kind": kind, "kernels": len(kernels), "extern": extern, "fallback": fallback}


def compile_op(fn, backend) -> tuple:
    """(``fn`` compiled whole with ``backend`` after a dynamo reset, the Probe that watches it)."""

    def run_op(*args, **kwargs):
        return fn(*args, **kwargs)

    torch._dynamo.reset()
    probe = Probe(backend)
    return torch.compile(run_op, backend=probe, fullgraph=True, dynamic=False), probe


def failure_stage(err: ErrorInfo, probe: Probe | None) -> str:
    """The stage of a target error: dynamo's trace (before the backend got a graph), inductor's
    lowering or the backend's compiler (while it compiled), or the compiled code at run time."""
    if probe is None:
        return "runtime"
    if probe.failed:
        lowering = any(n in err.types for n in ("LoweringException", "MissingOperatorWithoutDecomp",
                                                "MissingOperatorWithDecomp"))
        return "compile: lowering" if lowering else "compile: backend compiler"
    if probe.compiled == 0:
        return "compile: dynamo trace"
    return "runtime"
