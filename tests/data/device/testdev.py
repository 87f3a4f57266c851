"""A PrivateUse1 test device in Python only: casedb's stand-in for an out-of-tree device
(torch-spyre registers PrivateUse1 as ``spyre``; Ascend's ``npu`` the same way).

Importing this module (``casedb run --import tests/data/device/testdev.py --device testdev``):

* renames PrivateUse1 to ``testdev`` (``torch.utils.rename_privateuse1_backend``, through
  ``torch.utils.backend_registration``'s Python-backend setup: hooks, device guard, the
  ``torch.testdev`` module with ``device_count() == 2``, ``Tensor.testdev()``/``is_testdev``);
* makes tensors that live on it: :class:`TestDevTensor`, a wrapper subclass (its metadata on
  ``testdev:N``) holding a CPU tensor of the same sizes, strides and storage offset;
* registers, with ``torch.library``, one PrivateUse1 kernel per aten operator the CPU has a kernel
  for (and the device copies ``_copy_from``/``_copy_from_and_resize``): each unwraps its
  arguments, runs the CPU kernel and wraps what it returns on the argument's device.

The wrapper's ``__torch_dispatch__`` only steps past the Python key: each operator then reaches
the PrivateUse1 kernel torch's dispatcher finds (ours, a CompositeExplicitAutograd one, or none:
torch's own "Could not run 'aten::X' with arguments from the 'testdev' backend").

Environment (read at import; ``-j`` workers inherit it):

* ``TESTDEV_MISSING=aten::nonzero,aten::eq.Tensor``: no kernel for these operators (a name
  without an overload leaves out every overload);
* ``TESTDEV_WRONG=aten::mul.Tensor``: that kernel's floating results are ``y * 1.25 + 1``
  (integer results ``y + 1``): a device wrong in one op;
* ``TESTDEV_IGNORE_INDEX=1``: every result lands on ``testdev:0`` whatever the device index
  (a device that ignores ``testdev:1``).

A case's ``device_layout`` (a v2 config's) goes through casedb's ``DEVICE_LAYOUT_HOOKS["testdev"]``:
the tensor keeps the layout, and a kernel given one notes it (``testdev_layout`` in the result's
notes) with the strides it got.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.utils._pytree import tree_flatten, tree_map

NAME = "testdev"
__version__ = "0.1"
_PY = (torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
       | torch._C.DispatchKeySet(torch._C.DispatchKey.PythonTLSSnapshot))


def _names(var: str) -> frozenset:
    return frozenset(n.strip() for n in os.environ.get(var, "").split(",") if n.strip())


MISSING = _names("TESTDEV_MISSING")
WRONG = _names("TESTDEV_WRONG")
IGNORE_INDEX = os.environ.get("TESTDEV_IGNORE_INDEX") == "1"


class TestDevTensor(torch.Tensor):
    """A tensor on ``testdev:N``: the metadata of ``cpu``, which holds its values."""

    @staticmethod
    def __new__(cls, cpu: torch.Tensor, index: int = 0):
        r = torch.Tensor._make_wrapper_subclass(
            cls, cpu.shape, strides=cpu.stride(), storage_offset=cpu.storage_offset(), dtype=cpu.dtype,
            device=f"{NAME}:{0 if IGNORE_INDEX else index}", requires_grad=False)
        r._cpu = cpu
        return r

    def __repr__(self, *, tensor_contents=None):
        return f"TestDevTensor({self._cpu!r}, device='{self.device}')"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # past the Python key: the dispatcher picks the PrivateUse1 kernel (or says there is none)
        with torch._C._ExcludeDispatchKeyGuard(_PY):
            return func(*args, **(kwargs or {}))


def _unwrap(x):
    if isinstance(x, TestDevTensor):
        return x._cpu
    if isinstance(x, torch.device) and x.type == NAME:
        return torch.device("cpu")
    if isinstance(x, str) and x.split(":")[0] == NAME:
        return "cpu"
    return x


def _index(args, kwargs) -> int | None:
    """The device index results go to: the ``device`` argument's, else the first tensor's; None:
    the results stay where the CPU kernel put them (an explicit other device)."""
    dev = kwargs.get("device")
    if dev is not None:
        dev = torch.device(dev)
        return (dev.index or 0) if dev.type == NAME else None
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, TestDevTensor):
            return x.device.index or 0
    return 0


def _wrong(y):
    if not isinstance(y, torch.Tensor):
        return y
    return y * 1.25 + 1 if y.is_floating_point() else y + 1


def _note_layouts(args, kwargs) -> None:
    """A kernel given tensors the layout hook made says so in the run's notes (results.metrics)."""
    found = [x._device_layout for x in tree_flatten((args, kwargs))[0]
             if isinstance(x, TestDevTensor) and getattr(x, "_device_layout", None) is not None]
    execute = sys.modules.get("casedb.run.execute")
    if found and execute is not None:
        execute.note("testdev_layout", {"layouts": found, "strides": [list(x.stride()) for x in
                                        tree_flatten((args, kwargs))[0] if isinstance(x, TestDevTensor)]})


def _kernel(op, wrong: bool):
    def kernel(*args, **kwargs):
        _note_layouts(args, kwargs)
        cpu_args, cpu_kwargs = tree_map(_unwrap, (args, kwargs))
        out = op(*cpu_args, **cpu_kwargs)
        if wrong:
            out = tree_map(_wrong, out)
        index = _index(args, kwargs)
        if index is None:
            return out
        mine = {id(x._cpu): x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TestDevTensor)}

        def wrap(y):
            if not isinstance(y, torch.Tensor):
                return y
            t = mine.get(id(y))
            if t is None:
                return TestDevTensor(y, index)
            if tuple(t.shape) != tuple(y.shape) or t.stride() != y.stride():  # an out= resized
                t.data = TestDevTensor(y, index)
                t._cpu = y
            return t

        return tree_map(wrap, out)

    kernel.__name__ = f"testdev_{op.__name__}"
    return kernel


def _copy_from(src, dst, non_blocking=False):
    d = _unwrap(dst)
    d.copy_(_unwrap(src))
    return dst


def _copy_from_and_resize(src, dst):
    s, d = _unwrap(src), _unwrap(dst)
    d.resize_(s.shape)
    d.copy_(s)
    if isinstance(dst, TestDevTensor) and tuple(dst.shape) != tuple(d.shape):
        dst.data = TestDevTensor(d, dst.device.index or 0)
        dst._cpu = d
    return dst


def _left_out(name: str) -> bool:
    return name in MISSING or name.split(".")[0] in MISSING


_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def _overloads():
    """(``aten::name.overload``, the OpOverload) of every aten operator with a CPU kernel or a
    CompositeExplicitAutograd one (views among them: theirs make tensors without our wrapper)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or not any(has(name, k) for k in _KEYS):
            continue
        base, _, overload = name[len("aten::"):].partition(".")
        try:
            yield name, getattr(getattr(torch.ops.aten, base), overload or "default")
        except AttributeError:
            continue


class _Module:
    """``torch.testdev``: what torch asks a device module."""

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return 2

    def current_device(self) -> int:
        return 0

    def manual_seed_all(self, seed: int) -> None:
        pass

    def synchronize(self, device=None) -> None:
        pass


def _register() -> dict:
    """Set the device up once per process (a second import, under another module name, finds
    it done); returns the module's shared state."""
    existing = getattr(torch, NAME, None)
    if isinstance(getattr(existing, "state", None), dict):
        return existing.state
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    module = _Module()
    _setup_privateuseone_for_python_backend(rename=NAME, backend_module=module)
    lib = torch.library.Library("aten", "IMPL")
    kernels = []
    for name, op in _overloads():
        if _left_out(name):
            continue
        lib.impl(name[len("aten::"):], _kernel(op, name in WRONG or name.split(".")[0] in WRONG), "PrivateUse1")
        kernels.append(name)
    for name, fn in (("_copy_from", _copy_from), ("_copy_from_and_resize", _copy_from_and_resize)):
        if not _left_out(f"aten::{name}"):
            lib.impl(name, fn, "PrivateUse1")
            kernels.append(f"aten::{name}")
    module.state = {"library": lib, "kernels": frozenset(kernels), "missing": MISSING, "wrong": WRONG,
                    "tensor": TestDevTensor}
    return module.state


def _layout_hook(t: torch.Tensor, dev: torch.device, layout: dict) -> torch.Tensor:
    """casedb's DEVICE_LAYOUT_HOOKS entry: the tensor moved with its strides, the layout kept on it."""
    out = TestDevTensor(t.clone() if t.is_contiguous() else t, dev.index or 0)  # (strides as given)
    out._device_layout = dict(layout)
    return out


def _register_layout_hook() -> None:
    try:
        from casedb.cases.materialize import DEVICE_LAYOUT_HOOKS
    except ImportError:  # imported without casedb (a repro script): no layouts to lay out
        return
    DEVICE_LAYOUT_HOOKS[NAME] = _layout_hook


state = _register()
_register_layout_hook()
KERNELS = state["kernels"]
TestDevTensor = state["tensor"]
