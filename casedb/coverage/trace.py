"""Which aten operators one case sends to a target, found without the target: the case's op
called under a :class:`~torch.utils._python_dispatch.TorchDispatchMode` on fake CPU tensors
(sizes only; the CPU with the case's real inputs where an op's output size depends on values,
``nonzero``), recording every operator that reaches the backends.

Composite ops are decomposed before a dispatch mode sees them (CompositeImplicitAutograd), so
what is recorded is what a backend gets. An operator the target has no kernel of its own for but
a CompositeExplicitAutograd kernel is run through that kernel under the mode, so that what it
calls is recorded as its parts (the target runs the same composite kernel).

Limit: backend-selecting operators are traced with the CPU's choice (``_fused_sdp_choice`` picks
the CPU's flash attention for ``scaled_dot_product_attention``); a target may choose otherwise.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from casedb.cases.materialize import prepare, shape_inputs

_COMPOSITE = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


@dataclass
class Trace:
    """What one case calls: ``ops`` the aten operators in first-call order, ``parts`` what each
    composite one (without a kernel of the key's) calls, ``error`` why the trace failed."""

    ops: list = field(default_factory=list)
    parts: dict = field(default_factory=dict)
    on: str = "fake"          # fake (sizes only) or cpu (the case's real inputs)
    error: str | None = None


def has_kernel(name: str, key: str) -> bool:
    """The dispatcher holds a kernel of ``name`` for dispatch key ``key`` itself."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def composite_kernel(name: str) -> str | None:
    for k in _COMPOSITE:
        if has_kernel(name, k):
            return k
    return None


class _Recorder(TorchDispatchMode):
    def __init__(self, key: str, trace: Trace, sink: list):
        super().__init__()
        self.key, self.trace, self.sink = key, trace, sink

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        try:
            direct = has_kernel(name, self.key)
        except RuntimeError:  # not a dispatcher operator (prim::device): nothing a backend runs
            return func(*args, **kwargs)
        if name not in self.sink:
            self.sink.append(name)
        via = None if direct else composite_kernel(name)
        if via is None:
            return func(*args, **kwargs)
        parts = self.trace.parts.setdefault(name, [])
        with _Recorder(self.key, self.trace, parts):  # what the composite kernel calls
            return func._op_dk(getattr(torch._C.DispatchKey, via), *args, **kwargs)


def trace_case(case: dict, fn: Callable, key: str, load_blob=None) -> Trace:
    """The aten operators ``fn`` (the case's op) sends to a target of dispatch key ``key``."""
    log = logging.getLogger("torch._subclasses.fake_tensor")  # (a meta kernel refusing logs a traceback)
    was, log.disabled = log.disabled, True
    with warnings.catch_warnings():  # (an op reading a fake tensor's data pointer warns: the CPU then tells)
        warnings.simplefilter("ignore")
        try:
            return _trace(case, fn, key, load_blob)
        finally:
            log.disabled = was


def _trace(case: dict, fn: Callable, key: str, load_blob) -> Trace:
    """On fake tensors, else on the CPU with the case's inputs (see the module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    trace = Trace()
    try:
        with FakeTensorMode(), torch.no_grad():
            args, kwargs = shape_inputs(case)
            with _Recorder(key, trace, trace.ops):
                fn(*args, **kwargs)
        return trace
    except Exception:  # an output size that depends on values, a meta kernel missing: the CPU
        pass
    trace = Trace(on="cpu")
    try:
        args, kwargs = prepare(case, load_blob=load_blob).place("cpu", fresh=True)
        with torch.no_grad(), _Recorder(key, trace, trace.ops):
            fn(*args, **kwargs)
    except Exception as e:  # the op raises on the CPU too: the run says what (ref_error)
        trace.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:300]
    return trace
